"""End-to-end authentication of frames carried by relays (spec §8). Pure.

A relay forwards ``route`` frames whose ``inner`` bytes it cannot read usefully and cannot
change undetected. The two ends run a session over those bytes:

1. **Handshake** (two signed ``e2e_hello`` frames through the relay). The initiator sends
   ``{from, to, ts, nonce: a, eph: X_a}``; the responder answers ``{..., nonce: b,
   their_nonce: a, eph: X_b}``. Each hello is signed with the sender's node key (ed25519,
   the identity of spec §1.1), names both ends, carries a timestamp within 60 s and a fresh
   X25519 key ``eph`` used for this session only. The initiator accepts only an answer
   that echoes its nonce; the responder refuses a hello nonce it has already answered.
   When both start at once, the lower NodeID stays initiator and the other answers.
2. **Keys.** ``shared = X25519(eph_own, eph_peer)``; for each direction
   ``k = BLAKE2b-256(key=shared, person="hn-relay-e2e-v1", transcript || dir)``, where the
   transcript is both NodeIDs, both nonces and both ``eph`` keys (initiator's first) and
   ``dir`` is ``i2r`` or ``r2i``. Fresh keys per session make every frame of an old session
   useless in a new one.
3. **Frames.** Each peer-link frame ``f`` travels as ``sealed {s, f, m}``: ``s`` counts
   1, 2, 3 ... per direction and session, ``m = BLAKE2b-128(key=k, s as 8 bytes || f)``.
   The receiver refuses a frame whose MAC does not verify (``invalid_signature``, counted
   as *altered*) and one whose ``s`` is not above the last it accepted (``replayed``,
   counted as *replayed*: a copy, or an older frame after a newer one). A gap in ``s`` is a
   frame the relay dropped; it is accepted and counted (the path layer resends it).

A relay can therefore drop or delay traffic, but cannot forge, alter, replay or reorder it
without the receiver refusing and counting it. The responder's sending keys change as
soon as it answers; its receiving side accepts the previous session's frames until the
first frame under the new keys arrives (a hello the relay replays cannot cut a live session
off: its nonce was already answered).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
from collections import OrderedDict
from dataclasses import dataclass

from nacl.exceptions import CryptoError
from nacl.public import Box, PrivateKey, PublicKey

from hearthnet import cbor
from hearthnet.errors import BadRequest, Expired, InvalidSignature, Replayed
from hearthnet.identity import KeyPair
from hearthnet.ids import b64url_decode, b64url_encode
from hearthnet.mesh.relay_frames import MAC_BYTES, E2EHello, Sealed, decode

CLOCK_WINDOW_MS = 60_000  # as for peer-link hellos (spec §7.2)
ANSWERED_NONCES = 64  # hello nonces a responder remembers, per peer
_PERSON = b"hn-relay-e2e-v1"


class SessionState(enum.Enum):
    """Where one end's session with one peer is."""

    IDLE = "idle"
    HELLO_SENT = "hello_sent"
    ESTABLISHED = "established"


TRANSITIONS: dict[SessionState, frozenset[SessionState]] = {
    SessionState.IDLE: frozenset({SessionState.HELLO_SENT, SessionState.ESTABLISHED}),
    SessionState.HELLO_SENT: frozenset({SessionState.ESTABLISHED, SessionState.HELLO_SENT}),
    SessionState.ESTABLISHED: frozenset({SessionState.HELLO_SENT, SessionState.ESTABLISHED}),
}


def mac(key: bytes, seq: int, frame: bytes) -> bytes:
    """The 16-byte MAC of frame ``frame`` numbered ``seq`` under direction key ``key``."""
    return hashlib.blake2b(seq.to_bytes(8, "big") + frame, key=key, digest_size=MAC_BYTES).digest()


@dataclass(slots=True)
class _Keys:
    send: bytes
    recv: bytes
    sent: int = 0  # the last s sent
    received: int = 0  # the last s accepted


@dataclass(frozen=True, slots=True)
class Opened:
    """What :meth:`RelaySession.receive` produced: a hello to send back (``reply``, the
    bytes of the next ``route.inner``) and/or a verified peer-link frame (``frame``).
    ``renewed``: the reply answers a hello from a peer we held a session with (it forgot
    that session: what we sealed under its keys and it did not yet open is refused)."""

    reply: bytes | None = None
    frame: bytes | None = None
    renewed: bool = False


class RelaySession:
    """One end of the authenticated session with ``peer`` through relays.

    Feed it every ``route.inner`` from ``peer`` (:meth:`receive`); wrap every frame for
    ``peer`` with :meth:`seal`. Counters: ``altered``, ``replayed``, ``gaps``.
    """

    def __init__(self, keys: KeyPair, peer: str) -> None:
        if peer == keys.node_id:
            raise ValueError("a relay session is with another node")
        self.keys = keys
        self.peer = peer
        self.state = SessionState.IDLE
        self.altered = 0
        self.replayed = 0
        self.gaps = 0
        self._nonce = ""
        self._eph: PrivateKey | None = None
        self._current: _Keys | None = None
        self._pending: _Keys | None = None  # responder: receive keys not yet confirmed
        self._answered: OrderedDict[str, None] = OrderedDict()

    def _move(self, to: SessionState) -> None:
        if to not in TRANSITIONS[self.state]:
            raise RuntimeError(f"relay session cannot go {self.state.value} -> {to.value}")
        self.state = to

    @property
    def established(self) -> bool:
        """True when :meth:`seal` may be called."""
        return self._current is not None

    def start(self, now_ms: int) -> bytes:
        """Begin (or restart) the handshake; returns the ``route.inner`` to send."""
        self._move(SessionState.HELLO_SENT)
        self._nonce = os.urandom(16).hex()
        self._eph = PrivateKey.generate()
        eph = b64url_encode(bytes(self._eph.public_key))
        return E2EHello.create(
            self.keys, self.peer, now_ms, nonce=self._nonce, their_nonce=None, eph=eph
        ).encode()

    def seal(self, frame: bytes) -> bytes:
        """The ``route.inner`` carrying peer-link frame ``frame``.

        Raises:
            RuntimeError: the session is not established (a bug in the caller).
        """
        keys = self._current
        if keys is None:
            raise RuntimeError("seal before the relay session is established")
        keys.sent += 1
        return Sealed(keys.sent, frame, mac(keys.send, keys.sent, frame)).encode()

    def receive(self, inner: bytes, now_ms: int) -> Opened:
        """Take one ``route.inner`` from the peer.

        Raises:
            BadRequest: not an e2e frame, or a hello not between these two ends.
            InvalidSignature: a hello's signature, or a sealed frame's MAC, does not verify
                (counted in ``altered``).
            Replayed: a hello already answered or not answering ours, or a sealed frame
                not newer than the last accepted (counted in ``replayed``).
            Expired: a hello outside the clock window.
        """
        try:
            frame = decode(inner)
        except InvalidSignature:
            self.altered += 1
            raise
        if isinstance(frame, Sealed):
            return Opened(frame=self._open(frame))
        if isinstance(frame, E2EHello):
            held = self._current is not None
            reply = self._hello(frame, now_ms)
            return Opened(reply=reply, renewed=held and reply is not None)
        raise BadRequest(f"{frame.KIND} is not an end-to-end frame")

    def _open(self, frame: Sealed) -> bytes:
        for keys, pending in ((self._current, False), (self._pending, True)):
            if keys is None or not hmac.compare_digest(mac(keys.recv, frame.s, frame.f), frame.m):
                continue
            if frame.s <= keys.received:
                self.replayed += 1
                raise Replayed(f"sealed frame {frame.s} is not after {keys.received}")
            if pending:  # the initiator has the new keys: the old session is over
                assert self._current is not None
                keys.sent = self._current.sent  # both hold the new sending key
                self._current, self._pending = keys, None
            if frame.s > keys.received + 1:
                self.gaps += 1
            keys.received = frame.s
            return frame.f
        self.altered += 1
        raise InvalidSignature("sealed frame does not verify")

    def _hello(self, hello: E2EHello, now_ms: int) -> bytes | None:
        if hello.from_ != self.peer or hello.to != self.keys.node_id:
            raise BadRequest("e2e_hello is not between this session's ends")
        if abs(now_ms - hello.ts) > CLOCK_WINDOW_MS:
            raise Expired("e2e_hello timestamp outside the clock window")
        if hello.their_nonce is not None:  # an answer to our hello
            if self.state is not SessionState.HELLO_SENT or hello.their_nonce != self._nonce:
                self.replayed += 1
                raise Replayed("e2e_hello answers no hello of ours")
            assert self._eph is not None
            self._current = self._derive(hello, initiator=True)
            self._pending, self._eph = None, None
            self._move(SessionState.ESTABLISHED)
            return None
        if self.state is SessionState.HELLO_SENT and self.keys.node_id < self.peer:
            return None  # both started: the lower NodeID stays initiator, the peer answers
        if hello.nonce in self._answered:
            self.replayed += 1
            raise Replayed("e2e_hello already answered")
        self._answered[hello.nonce] = None
        if len(self._answered) > ANSWERED_NONCES:
            self._answered.popitem(last=False)
        self._eph = PrivateKey.generate()
        self._nonce = os.urandom(16).hex()
        eph = b64url_encode(bytes(self._eph.public_key))
        keys = self._derive(hello, initiator=False, own_eph=eph)
        if self._current is None:
            self._current = keys
        else:  # send with the new keys at once, accept the old ones until confirmed
            self._current = _Keys(keys.send, self._current.recv, 0, self._current.received)
            self._pending = keys
        self._eph = None
        self._move(SessionState.ESTABLISHED)
        reply = E2EHello.create(
            self.keys, self.peer, now_ms, nonce=self._nonce, their_nonce=hello.nonce, eph=eph
        )
        return reply.encode()

    def _derive(self, hello: E2EHello, *, initiator: bool, own_eph: str = "") -> _Keys:
        assert self._eph is not None
        try:
            peer_eph = PublicKey(b64url_decode(hello.eph))
            shared = Box(self._eph, peer_eph).shared_key()
        except (BadRequest, CryptoError, ValueError, TypeError) as exc:
            raise InvalidSignature("e2e_hello carries no usable eph key") from exc
        mine = own_eph or b64url_encode(bytes(self._eph.public_key))
        me, peer = self.keys.node_id, self.peer
        if initiator:
            parts = (me, peer, self._nonce, hello.nonce, mine, hello.eph)
        else:
            parts = (peer, me, hello.nonce, self._nonce, hello.eph, mine)
        transcript = bytes(cbor.dumps(list(parts)))

        def key(direction: bytes) -> bytes:
            return hashlib.blake2b(
                transcript + direction, key=shared, person=_PERSON, digest_size=32
            ).digest()

        i2r, r2i = key(b"i2r"), key(b"r2i")
        return _Keys(i2r, r2i) if initiator else _Keys(r2i, i2r)
