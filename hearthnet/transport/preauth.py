"""Bounds on connections before authentication (spec §2.5). Pure: no sockets, no clock.

A connection is *pending* from its accept until its first request has fully arrived
(head and body) or it was handed to a WebSocket session, which then has its own
first-frame deadline (spec §3.5). While pending it must

- finish its request head within ``head_timeout_s`` of the accept,
- after the head, send its body at no less than ``body_min_bytes_per_s`` on average,
  measured from the end of the head once ``body_grace_s`` has passed,
- share its source address with at most ``per_source - 1`` other pending connections.

Every open connection, pending or not, takes a file descriptor. ``capacity`` is how many
the process can hold, ``reserve`` how many of those pending connections may never take:
when a new connection would break either bound, the oldest pending connection is shed
(possibly the new one itself), so an attacker holding descriptors with half-open requests
never locks out a member whose request arrives in one piece.

The asyncio glue (:mod:`hearthnet.transport.server`) feeds :class:`PreAuthTable` with
connection keys and the loop's clock and closes what it returns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from hearthnet.errors import BadRequest, HeadersTooLarge

# A descriptor kept open to be closed when accept() fails with EMFILE, so the waiting
# connection can be accepted and closed instead of staying in the backlog.
SPARE_FDS = 1

CHUNKED = -1  # RequestLine.body for a chunked body: its length is not known up front
_VERSIONS = (b"HTTP/1.1", b"HTTP/1.0")
_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


class Refusal(StrEnum):
    """Why a connection was closed before authentication (the ``limit`` label of
    ``hearthnet_connections_refused_total``)."""

    HEAD_TIMEOUT = "head_timeout"
    BODY_RATE = "body_rate"
    PER_SOURCE = "per_source"
    FD_RESERVE = "fd_reserve"
    # accept() failed for want of descriptors: the connection waiting in the backlog was
    # taken with the spare descriptor and closed (the reserve was too small for the load)
    OUT_OF_DESCRIPTORS = "out_of_descriptors"


@dataclass(frozen=True, slots=True)
class PreAuthLimits:
    """The bounds of spec §2.5 (defaults there; ``capacity``/``reserve`` from
    :func:`descriptor_budget`)."""

    head_timeout_s: float = 10.0
    body_grace_s: float = 10.0
    body_min_bytes_per_s: float = 1024.0
    per_source: int = 256
    capacity: int = 1 << 30
    reserve: int = 0

    @property
    def tick_s(self) -> float:
        """How often deadlines should be checked: a quarter of the shortest one, at most 1 s."""
        return max(0.01, min(1.0, self.head_timeout_s / 4, self.body_grace_s / 4))


def descriptor_budget(nofile: int, in_use: int, reserve: int) -> tuple[int, int]:
    """``(capacity, reserve)`` for connections under RLIMIT_NOFILE ``nofile``.

    Args:
        nofile: the soft RLIMIT_NOFILE.
        in_use: descriptors the process holds besides connections (log, listener...).
        reserve: configured reserve; 0 picks a tenth of ``nofile``, at least 16.
    """
    capacity = max(2, nofile - in_use - SPARE_FDS)
    wanted = reserve if reserve > 0 else max(16, nofile // 10)
    return capacity, min(wanted, capacity // 2)


@dataclass(slots=True)
class _Pending:
    source: str
    opened: float
    body_started: float | None = None
    body_bytes: int = 0


class PreAuthTable:
    """Open connections, and the pending ones by age and source. Keys are the caller's."""

    def __init__(self, limits: PreAuthLimits) -> None:
        self.limits = limits
        self._open: set[int] = set()
        self._pending: dict[int, _Pending] = {}  # insertion order: oldest first
        self._by_source: dict[str, int] = {}

    @property
    def open_count(self) -> int:
        """Connections open (pending or not)."""
        return len(self._open)

    @property
    def pending_count(self) -> int:
        """Connections not yet past their first request."""
        return len(self._pending)

    def pending_from(self, source: str) -> int:
        """Pending connections from ``source``."""
        return self._by_source.get(source, 0)

    def is_pending(self, key: int) -> bool:
        """True while ``key`` has not finished its first request."""
        return key in self._pending

    def open(self, key: int, source: str, now: float) -> list[tuple[int, Refusal]]:
        """A connection was accepted. Returns the connections to close now, with why:
        ``key`` itself when its source is at its limit (then it is not tracked) or when
        it is the oldest pending one left to shed; otherwise older pending connections
        shed to keep the descriptor reserve."""
        limits = self.limits
        if self._by_source.get(source, 0) >= limits.per_source:
            return [(key, Refusal.PER_SOURCE)]
        self._open.add(key)
        self._pending[key] = _Pending(source, now)
        self._by_source[source] = self._by_source.get(source, 0) + 1
        shed: list[tuple[int, Refusal]] = []
        while self._pending and (
            len(self._pending) > limits.capacity - limits.reserve
            or len(self._open) > limits.capacity
        ):
            oldest = next(iter(self._pending))
            self.closed(oldest)
            shed.append((oldest, Refusal.FD_RESERVE))
        return shed

    def shed_oldest(self) -> int | None:
        """Forget and return the oldest pending connection (out of descriptors), if any."""
        if not self._pending:
            return None
        oldest = next(iter(self._pending))
        self.closed(oldest)
        return oldest

    def body(self, key: int, now: float) -> None:
        """``key``'s request head is complete and a body follows."""
        entry = self._pending.get(key)
        if entry is not None:
            entry.body_started = now
            entry.body_bytes = 0

    def received(self, key: int, n: int) -> None:
        """``n`` body bytes arrived on ``key``."""
        entry = self._pending.get(key)
        if entry is not None:
            entry.body_bytes += n

    def excuse(self, key: int, now: float) -> None:
        """We stopped reading ``key`` (the handler is behind): its body pace starts anew."""
        self.body(key, now)

    def admit(self, key: int) -> None:
        """``key``'s first request is complete: no longer pending."""
        entry = self._pending.pop(key, None)
        if entry is not None:
            self._release(entry.source)

    def closed(self, key: int) -> None:
        """``key`` is closed (or about to be): forget it."""
        self._open.discard(key)
        self.admit(key)

    def sweep(self, now: float) -> list[tuple[int, Refusal]]:
        """Pending connections past a deadline, forgotten here; the caller closes them."""
        limits = self.limits
        late: list[tuple[int, Refusal]] = []
        for key, entry in self._pending.items():
            if entry.body_started is None:
                if now - entry.opened >= limits.head_timeout_s:
                    late.append((key, Refusal.HEAD_TIMEOUT))
                continue
            elapsed = now - entry.body_started
            if (
                elapsed >= limits.body_grace_s
                and entry.body_bytes < limits.body_min_bytes_per_s * elapsed
            ):
                late.append((key, Refusal.BODY_RATE))
        for key, _ in late:
            self.closed(key)
        return late

    def _release(self, source: str) -> None:
        left = self._by_source.get(source, 0) - 1
        if left > 0:
            self._by_source[source] = left
        else:
            self._by_source.pop(source, None)


@dataclass(frozen=True, slots=True)
class ScreenedHead:
    """What the front door needs of a request head that passed :func:`screen_head`."""

    method: bytes
    path: str
    body: int  # bytes of body announced; 0 none, CHUNKED when chunked
    host: bool = True  # False: an HTTP/1.1 request without Host, which aiohttp refuses


def screen_head(head: bytes, max_headers: int, max_header_bytes: int) -> ScreenedHead:
    """Check a request head (up to, not including, the blank line) against spec §2.5.

    Raises:
        BadRequest: the request line is not ``METHOD TARGET HTTP/1.x``.
        HeadersTooLarge: more than ``max_headers`` header lines, or more than
            ``max_header_bytes`` bytes of them.
    """
    line, _, fields = head.partition(b"\r\n")
    parts = line.split(b" ")
    if (
        len(parts) != 3
        or not parts[0]
        or not _TOKEN.issuperset(parts[0])
        or not parts[1]
        or parts[2] not in _VERSIONS
    ):
        raise BadRequest("malformed request line")
    if len(fields) > max_header_bytes:
        raise HeadersTooLarge(f"request headers over {max_header_bytes} bytes")
    lines = fields.split(b"\r\n") if fields else []
    if len(lines) > max_headers:
        raise HeadersTooLarge(f"more than {max_headers} request headers")
    body = 0
    host = parts[2] == b"HTTP/1.0"
    for field_line in lines:
        name, _, value = field_line.partition(b":")
        lname = name.strip().lower()
        if lname == b"host":
            host = True
        elif lname == b"content-length":
            text = value.strip()
            body = int(text) if text.isdigit() and len(text) < 19 else 0
        elif lname == b"transfer-encoding" and b"chunked" in value.lower():
            body = CHUNKED
    path = parts[1].split(b"?", 1)[0].decode("latin-1")
    return ScreenedHead(parts[0], path, body, host)


_HEX_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
MAX_CHUNK_LINE = 4096  # a chunk-size line with its extensions, or one trailer line
MAX_TRAILER_LINES = 64


class ChunkedBodyEnd:
    """Where a chunked body ends (RFC 9112 §7.1), fed the bytes as they arrive. Pure.

    The front door stops counting a connection as unauthenticated once its first body is
    in; a chunk whose *data* looks like the last chunk (``0\\r\\n\\r\\n``) must not end it,
    and a last chunk with extensions or trailers must. Malformed framing also ends the
    watch: the HTTP server refuses such a body itself and closes the connection.
    """

    __slots__ = ("_left", "_line", "_state", "_trailers")

    def __init__(self) -> None:
        self._state = "size"  # size, data, crlf, trailer, done
        self._left = 0
        self._line = bytearray()
        self._trailers = 0

    def feed(self, data: bytes) -> bool:
        """Take the next bytes of the body; True once the body has ended (or is malformed)."""
        i, n = 0, len(data)
        while i < n and self._state != "done":
            if self._state == "data":
                take = min(self._left, n - i)
                self._left -= take
                i += take
                if self._left == 0:
                    self._state = "crlf"
                continue
            j = data.find(b"\n", i)
            if j < 0:
                self._line += data[i:]
                return len(self._line) > MAX_CHUNK_LINE  # an endless line: malformed
            self._line += data[i : j + 1]
            i = j + 1
            line = bytes(self._line).rstrip(b"\r\n")
            self._line.clear()
            if not self._line_done(line):
                return True
        return self._state == "done"

    def _line_done(self, line: bytes) -> bool:
        """One whole line in the current state; False when the framing is malformed."""
        if self._state == "crlf":
            self._state = "size"
            return not line
        if self._state == "trailer":
            self._trailers += 1
            if not line:
                self._state = "done"
            return self._trailers <= MAX_TRAILER_LINES
        size = line.split(b";", 1)[0].strip()
        if not _HEX_SIZE.fullmatch(size):
            return False
        self._left = int(size, 16)
        self._state = "data" if self._left else "trailer"
        return True
