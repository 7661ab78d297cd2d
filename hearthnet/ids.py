"""Identifiers on the wire (spec §1.1): NodeIDs, short ids, signature strings, ULIDs.

Everything here is pure: no clock is read unless a caller passes none.
"""

from __future__ import annotations

import base64
import functools
import os
import re
import threading
import time
from collections.abc import Sequence

from hearthnet.errors import BadRequest

NODE_ID_PREFIX = "ed25519:"
_B64URL_RE = re.compile(r"^[A-Za-z0-9_-]*\Z")


def b64url_encode(raw: bytes) -> str:
    """base64url without padding."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Decode base64url with or without padding; raise :class:`BadRequest` on junk."""
    if not _B64URL_RE.match(text) or len(text) % 4 == 1:
        raise BadRequest("not base64url")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def node_id_from_public_key(public_key: bytes) -> str:
    """``"ed25519:" + base64url_nopad(32-byte key)``."""
    if len(public_key) != 32:
        raise ValueError("an ed25519 public key has 32 bytes")
    return NODE_ID_PREFIX + b64url_encode(public_key)


def public_key_from_node_id(node_id: str) -> bytes:
    """The 32 public-key bytes of a NodeID; :class:`BadRequest` if it is not one."""
    if not isinstance(node_id, str) or not node_id.startswith(NODE_ID_PREFIX):
        raise BadRequest("a NodeID starts with 'ed25519:'")
    return _decode_node_id(node_id)


@functools.lru_cache(maxsize=4096)  # the same few NodeIDs are checked on every request
def _decode_node_id(node_id: str) -> bytes:
    body = node_id[len(NODE_ID_PREFIX) :]
    if len(body) != 43:
        raise BadRequest("a NodeID has 43 base64url characters after the prefix")
    raw = b64url_decode(body)
    if len(raw) != 32:
        raise BadRequest("a NodeID encodes 32 bytes")
    return raw


def is_node_id(value: object) -> bool:
    """True when ``value`` is a well-formed NodeID string."""
    if not isinstance(value, str):
        return False
    try:
        public_key_from_node_id(value)
    except BadRequest:
        return False
    return True


def short_id(node_id: str) -> str:
    """Display id: first 10 key bytes in base32, no padding, as ``XXXX-XXXX-XXXX-XXXX``."""
    raw = public_key_from_node_id(node_id)[:10]
    text = base64.b32encode(raw).decode("ascii")  # 10 bytes -> exactly 16 chars, no padding
    return "-".join(text[i : i + 4] for i in range(0, 16, 4))


def signature_to_str(signature: bytes) -> str:
    """``"ed25519:" + base64url_nopad(64-byte signature)``."""
    return NODE_ID_PREFIX + b64url_encode(signature)


def signature_from_str(text: object) -> bytes:
    """Parse a signature string; :class:`BadRequest` when malformed."""
    if not isinstance(text, str) or not text.startswith(NODE_ID_PREFIX):
        raise BadRequest("a signature starts with 'ed25519:'")
    raw = b64url_decode(text[len(NODE_ID_PREFIX) :])
    if len(raw) != 64:
        raise BadRequest("an ed25519 signature has 64 bytes")
    return raw


# --- ULID -------------------------------------------------------------------

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_CROCKFORD_INDEX = {c: i for i, c in enumerate(_CROCKFORD)}
_ULID_RE = re.compile(r"^[0-7][0-9A-HJKMNP-TV-Z]{25}\Z")


class UlidGenerator:
    """Monotonic ULID source: ids made in the same millisecond still sort in order.

    Thread-safe; one shared instance (:data:`new_ulid`) serves the process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = -1
        self._last_rand = 0
        self._time_chars = ""  # the encoded _last_ms: shared by every id of that millisecond
        # The first 14 random characters (rand >> 10): ids of one millisecond count up by
        # one, so only the last two characters change between most of them.
        self._high = -1
        self._high_chars = ""

    def new(self, now_ms: int | None = None) -> str:
        """A new ULID string for ``now_ms`` (default: the wall clock)."""
        ms = int(time.time() * 1000) if now_ms is None else now_ms
        with self._lock:
            if ms <= self._last_ms:
                ms = self._last_ms
                rand = (self._last_rand + 1) & ((1 << 80) - 1)
                if rand == 0:  # 2^80 ids in one ms: borrow the next millisecond
                    ms += 1
            else:
                rand = int.from_bytes(os.urandom(10), "big")
            if ms != self._last_ms:
                self._time_chars = _time_chars(ms)
            self._last_ms, self._last_rand = ms, rand
            if rand >> 10 != self._high:
                self._high = rand >> 10
                self._high_chars = _random_chars(rand)[:14]
            prefix = self._time_chars + self._high_chars
        return prefix + _CROCKFORD_PAIRS[rand & 1023]

    def many(self, times_ms: Sequence[int]) -> list[str]:
        """One new ULID per time in ``times_ms`` (ascending for ids that sort in order):
        what :meth:`new` gives called once per time, with one lock for them all (a
        commit's publishes take their ids at once)."""
        n = len(times_ms)
        if n > 1 and times_ms.count(times_ms[0]) == n:
            run = self._one_ms(times_ms[0], n)
            if run is not None:
                return run
        out: list[str] = []
        pairs, mask = _CROCKFORD_PAIRS, (1 << 80) - 1
        with self._lock:
            last_ms, rand, high = self._last_ms, self._last_rand, self._high
            time_chars, high_chars = self._time_chars, self._high_chars
            for ms in times_ms:
                if ms <= last_ms:
                    rand = (rand + 1) & mask
                    if rand == 0:
                        last_ms += 1
                        time_chars = _time_chars(last_ms)
                else:
                    rand = int.from_bytes(os.urandom(10), "big")
                    last_ms, time_chars = ms, _time_chars(ms)
                if rand >> 10 != high:
                    high = rand >> 10
                    high_chars = _random_chars(rand)[:14]
                out.append(time_chars + high_chars + pairs[rand & 1023])
            self._last_ms, self._last_rand, self._high = last_ms, rand, high
            self._time_chars, self._high_chars = time_chars, high_chars
        return out

    def _one_ms(self, ms: int, n: int) -> list[str] | None:
        """What :meth:`many` gives for ``n`` ids of one millisecond ``ms`` (a group of
        publishes queued together): their random parts count up by one, so each run of
        one ``rand >> 10`` is its prefix joined to a slice of the character pairs, with
        no step per id. None when the random part would wrap (then id by id)."""
        pairs = _CROCKFORD_PAIRS
        with self._lock:
            last_ms = self._last_ms
            if ms <= last_ms:
                first, time_chars = self._last_rand + 1, self._time_chars
            else:
                first = int.from_bytes(os.urandom(10), "big")
                last_ms, time_chars = ms, _time_chars(ms)
            last = first + n - 1
            if last >> 80:
                return None
            out: list[str] = []
            high, high_chars = self._high, self._high_chars
            rand = first
            while rand <= last:
                if rand >> 10 != high:
                    high = rand >> 10
                    high_chars = _random_chars(rand)[:14]
                stop = min(last, rand | 1023)  # the last id with this prefix
                out += map(
                    (time_chars + high_chars).__add__, pairs[rand & 1023 : (stop & 1023) + 1]
                )
                rand = stop + 1
            self._last_ms, self._last_rand, self._high = last_ms, last, high
            self._time_chars, self._high_chars = time_chars, high_chars
        return out


# Two characters (10 bits) per lookup, unrolled: every published message gets an id.
# The 26 characters are 130 bits: 2 zero bits and the 48-bit time (10 characters), then
# the 80 random bits (16 characters).
_CROCKFORD_PAIRS = [a + b for a in _CROCKFORD for b in _CROCKFORD]


def _time_chars(ms: int) -> str:
    p = _CROCKFORD_PAIRS
    return (
        p[(ms >> 40) & 1023] + p[(ms >> 30) & 1023] + p[(ms >> 20) & 1023]
        + p[(ms >> 10) & 1023] + p[ms & 1023]
    )  # fmt: skip


def _random_chars(rand: int) -> str:
    p = _CROCKFORD_PAIRS
    return (
        p[(rand >> 70) & 1023] + p[(rand >> 60) & 1023] + p[(rand >> 50) & 1023]
        + p[(rand >> 40) & 1023] + p[(rand >> 30) & 1023] + p[(rand >> 20) & 1023]
        + p[(rand >> 10) & 1023] + p[rand & 1023]
    )  # fmt: skip


def encode_ulid(ms: int, rand: int) -> str:
    """Encode a 48-bit timestamp and 80 random bits as 26 Crockford base32 characters."""
    return _time_chars(ms) + _random_chars(rand)


def is_ulid(value: object) -> bool:
    """True when ``value`` is a canonical (upper-case) ULID string."""
    return isinstance(value, str) and bool(_ULID_RE.match(value))


def ulid_time_ms(ulid: str) -> int:
    """The millisecond timestamp inside a ULID."""
    value = 0
    for ch in ulid[:10]:
        value = (value << 5) | _CROCKFORD_INDEX[ch]
    return value


_ULIDS = UlidGenerator()


def new_ulid(now_ms: int | None = None) -> str:
    """A new monotonic ULID from the process-wide generator."""
    return _ULIDS.new(now_ms)


def new_ulids(times_ms: Sequence[int]) -> list[str]:
    """New monotonic ULIDs, one per time, from the process-wide generator
    (:meth:`UlidGenerator.many`)."""
    return _ULIDS.many(times_ms)
