"""Relay frames (spec §8): typed, frozen, strictly parsed. Pure.

Every frame is one CBOR map ``{"t": kind, ...}`` on a peer link (``hearthnet-peer.v1``),
like the frames of :mod:`hearthnet.mesh.protocol`. Three layers::

    peer link  member <-> relay, relay <-> relay (already authenticated by the hello)
      attach {ts?}                                  member asks to be relayed
      attached {relay, observed_addr, bytes_per_s, streams, max_inner, ts_echo?}
      detach {code?, reason?}                       either side ends the attachment
      route {to, from, ttl_hops, id, inner}         ``inner``: the bytes of one e2e frame
      route_error {to, origin, id, code, retry_after_ms?}   code: unreachable|ttl|rate_limited
      route_table {relay, version, nodes: [[node, hops], ...]}   relay <-> relay

    end to end (the bytes of ``route.inner``; the relay neither reads nor alters them)
      e2e_hello {from, to, ts, nonce, their_nonce?, eph, sig}   signed by ``from``
      sealed {s, f, m}                              ``f`` sealed under the session's keys

    peer to peer (the bytes of ``sealed.f``, or plain frames on a direct link)
      candidates {nonce, addrs}                     addresses to punch, via the relay
      punch {nonce, in_ms}                          start the simultaneous open
      upgrade {nonce}                               first frame on the punched link
      pframe {s, f}   pack {upto, drained?}   drain {upto}   one sequence across paths

How the end-to-end session works is in :mod:`hearthnet.mesh.relay_e2e`; how the path
sequence works is in :mod:`hearthnet.mesh.paths`. Parsing refuses an unknown field by name
and a field of the wrong type by name (``bad_request``); parsing an ``e2e_hello`` verifies
its signature, so an unverified hello never exists as an object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import cbor2

from hearthnet.errors import BadRequest, PayloadTooLarge
from hearthnet.identity import KeyPair, verify_object
from hearthnet.ids import is_node_id
from hearthnet.shapes import Shape

MAX_FRAME_BYTES = 2 * 1024 * 1024  # the peer-link limit (spec §7.2)
MAX_INNER_BYTES = MAX_FRAME_BYTES - 1024  # room for the route header around it
MAX_TTL_HOPS = 16
DEFAULT_TTL_HOPS = 4  # spec §8
MAX_ADDRS = 8
MAX_ADDR_CHARS = 262  # "[" + 253-character host + "]:" + port
MAX_ROUTE_NODES = 10_000
MAX_ID = 2**64 - 1
MAX_NONCE_CHARS = 64
MAX_PUNCH_DELAY_MS = 10_000
MAC_BYTES = 16
EPH_CHARS = 43  # base64url of a 32-byte X25519 public key
ROUTE_ERROR_CODES = frozenset({"unreachable", "ttl", "rate_limited"})


def _int(obj: dict[str, Any], what: str, name: str, lo: int = 0, hi: int = MAX_ID) -> int:
    value = obj.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise BadRequest(f"{what}.{name} must be an integer in {lo}..{hi}")
    return value


def _opt_int(obj: dict[str, Any], what: str, name: str, hi: int = MAX_ID) -> int | None:
    return None if obj.get(name) is None else _int(obj, what, name, 0, hi)


def _node(obj: dict[str, Any], what: str, name: str) -> str:
    value = obj.get(name)
    if not is_node_id(value):
        raise BadRequest(f"{what}.{name} must be a NodeID")
    assert isinstance(value, str)
    return value


def _str(obj: dict[str, Any], what: str, name: str, max_chars: int, *, empty: bool = False) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or len(value) > max_chars or (not value and not empty):
        raise BadRequest(f"{what}.{name} must be a string of at most {max_chars} characters")
    return value


def _bytes(obj: dict[str, Any], what: str, name: str, max_len: int, exact: int = -1) -> bytes:
    value = obj.get(name)
    if not isinstance(value, bytes) or len(value) > max_len or exact not in (-1, len(value)):
        size = f"{exact}" if exact >= 0 else f"at most {max_len}"
        raise BadRequest(f"{what}.{name} must be a byte string of {size} bytes")
    return value


def check_addr(value: object, what: str) -> str:
    """A transport address ``host:port`` (IPv6 in brackets); returns it.

    Raises:
        BadRequest: naming ``what``.
    """
    if isinstance(value, str) and len(value) <= MAX_ADDR_CHARS and value.isascii():
        host, sep, port = value.rpartition(":")
        if host.startswith("["):
            ok_host = host.endswith("]") and len(host) > 2
        else:
            ok_host = bool(host) and ":" not in host
        if sep and ok_host and port.isdigit() and 1 <= int(port) <= 65535:
            return value
    raise BadRequest(f"{what} must be an address host:port")


class _Frame:
    """What every relay frame has: its kind, field table, and CBOR encoding."""

    __slots__ = ()
    KIND: ClassVar[str]
    SHAPE: ClassVar[Shape]

    def serialize(self) -> dict[str, Any]:
        """The wire map, ``t`` included."""
        raise NotImplementedError

    def encode(self) -> bytes:
        """The frame's CBOR bytes, as written on a peer link."""
        return bytes(cbor2.dumps(self.serialize()))


@dataclass(frozen=True, slots=True)
class Attach(_Frame):
    """Member -> relay: relay me. ``ts`` (ms) is echoed, which measures the relay's RTT."""

    KIND: ClassVar[str] = "attach"
    SHAPE: ClassVar[Shape] = Shape.of("attach frame", ("t", "ts"))
    ts: int | None = None

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Attach:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        return cls(_opt_int(obj, "attach", "ts"))

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {"t": self.KIND} if self.ts is None else {"t": self.KIND, "ts": self.ts}


@dataclass(frozen=True, slots=True)
class Attached(_Frame):
    """Relay -> member: you are attached, this is the address you came from (spec §8
    ``observed_addr``) and the budget granted to you."""

    KIND: ClassVar[str] = "attached"
    SHAPE: ClassVar[Shape] = Shape.of(
        "attached frame",
        ("t", "relay", "observed_addr", "bytes_per_s", "streams", "max_inner", "ts_echo"),
    )
    relay: str
    observed_addr: str
    bytes_per_s: int
    streams: int
    max_inner: int
    ts_echo: int | None = None

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Attached:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        return cls(
            _node(obj, "attached", "relay"),
            check_addr(obj.get("observed_addr"), "attached.observed_addr"),
            _int(obj, "attached", "bytes_per_s", 1),
            _int(obj, "attached", "streams", 1, 1 << 20),
            _int(obj, "attached", "max_inner", 1, MAX_INNER_BYTES),
            _opt_int(obj, "attached", "ts_echo"),
        )

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        out: dict[str, Any] = {
            "t": self.KIND,
            "relay": self.relay,
            "observed_addr": self.observed_addr,
            "bytes_per_s": self.bytes_per_s,
            "streams": self.streams,
            "max_inner": self.max_inner,
        }
        if self.ts_echo is not None:
            out["ts_echo"] = self.ts_echo
        return out


@dataclass(frozen=True, slots=True)
class Detach(_Frame):
    """Either side: the attachment ends (``code`` a wire code when it is a refusal)."""

    KIND: ClassVar[str] = "detach"
    SHAPE: ClassVar[Shape] = Shape.of("detach frame", ("t", "code", "reason", "retry_after_ms"))
    code: str | None = None
    reason: str = ""
    retry_after_ms: int | None = None

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Detach:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        code = None if obj.get("code") is None else _str(obj, "detach", "code", 32)
        reason = "" if obj.get("reason") is None else _str(obj, "detach", "reason", 200, empty=True)
        return cls(code, reason, _opt_int(obj, "detach", "retry_after_ms"))

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        out: dict[str, Any] = {"t": self.KIND}
        if self.code is not None:
            out["code"] = self.code
        if self.reason:
            out["reason"] = self.reason
        if self.retry_after_ms is not None:
            out["retry_after_ms"] = self.retry_after_ms
        return out


@dataclass(frozen=True, slots=True)
class Route(_Frame):
    """A frame from ``from_`` to ``to`` through relays. ``inner`` is opaque to relays (the
    bytes of an ``e2e_hello`` or ``sealed``); ``id`` is chosen by the sender and, with
    ``from_``, keys the relays' seen-cache; ``ttl_hops`` is how many relays it may still pass.
    """

    KIND: ClassVar[str] = "route"
    SHAPE: ClassVar[Shape] = Shape.of(
        "route frame", ("t", "to", "from", "ttl_hops", "id", "inner"), {"ttl": "ttl_hops?"}
    )
    to: str
    from_: str
    ttl_hops: int
    id: int
    inner: bytes

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Route:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        return cls(
            _node(obj, "route", "to"),
            _node(obj, "route", "from"),
            _int(obj, "route", "ttl_hops", 0, MAX_TTL_HOPS),
            _int(obj, "route", "id"),
            _bytes(obj, "route", "inner", MAX_INNER_BYTES),
        )

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {
            "t": self.KIND,
            "to": self.to,
            "from": self.from_,
            "ttl_hops": self.ttl_hops,
            "id": self.id,
            "inner": self.inner,
        }


@dataclass(frozen=True, slots=True)
class RouteError(_Frame):
    """A relay could not pass route ``id`` from ``origin`` on to ``to``; it travels back
    towards ``origin``. ``code``: ``unreachable``, ``ttl`` or ``rate_limited``."""

    KIND: ClassVar[str] = "route_error"
    SHAPE: ClassVar[Shape] = Shape.of(
        "route_error frame", ("t", "to", "origin", "id", "code", "retry_after_ms")
    )
    to: str
    origin: str
    id: int
    code: str
    retry_after_ms: int | None = None

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> RouteError:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        code = obj.get("code")
        if code not in ROUTE_ERROR_CODES:
            raise BadRequest(f"route_error.code must be one of {sorted(ROUTE_ERROR_CODES)}")
        return cls(
            _node(obj, "route_error", "to"),
            _node(obj, "route_error", "origin"),
            _int(obj, "route_error", "id"),
            str(code),
            _opt_int(obj, "route_error", "retry_after_ms"),
        )

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        out: dict[str, Any] = {
            "t": self.KIND,
            "to": self.to,
            "origin": self.origin,
            "id": self.id,
            "code": self.code,
        }
        if self.retry_after_ms is not None:
            out["retry_after_ms"] = self.retry_after_ms
        return out


@dataclass(frozen=True, slots=True)
class RouteTable(_Frame):
    """Relay -> federated relay: the nodes reachable through ``relay`` and how many more
    relays stand between it and each (0: attached to it). A higher ``version`` replaces
    what the receiver holds from that relay; the same version refreshes it."""

    KIND: ClassVar[str] = "route_table"
    SHAPE: ClassVar[Shape] = Shape.of("route_table frame", ("t", "relay", "version", "nodes"))
    relay: str
    version: int
    nodes: tuple[tuple[str, int], ...]

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> RouteTable:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        raw = obj.get("nodes")
        if not isinstance(raw, list) or len(raw) > MAX_ROUTE_NODES:
            raise BadRequest(f"route_table.nodes must be a list of at most {MAX_ROUTE_NODES}")
        nodes: list[tuple[str, int]] = []
        for entry in raw:
            if (
                not isinstance(entry, list)
                or len(entry) != 2
                or not is_node_id(entry[0])
                or not isinstance(entry[1], int)
                or isinstance(entry[1], bool)
                or not 0 <= entry[1] < MAX_TTL_HOPS
            ):
                raise BadRequest("route_table.nodes entries must be [NodeID, hops]")
            nodes.append((entry[0], entry[1]))
        return cls(
            _node(obj, "route_table", "relay"), _int(obj, "route_table", "version"), tuple(nodes)
        )

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {
            "t": self.KIND,
            "relay": self.relay,
            "version": self.version,
            "nodes": [[n, h] for n, h in self.nodes],
        }


@dataclass(frozen=True, slots=True)
class E2EHello(_Frame):
    """One end's half of the session handshake through a relay, signed by ``from_``.

    ``eph`` is an X25519 public key (base64url) used for this session only; ``nonce``
    is fresh; the responder echoes the initiator's nonce in ``their_nonce``. Instances
    exist only with a verified signature (:meth:`parse` checks it; :meth:`create` makes it).
    """

    KIND: ClassVar[str] = "e2e_hello"
    SHAPE: ClassVar[Shape] = Shape.of(
        "e2e_hello frame", ("t", "from", "to", "ts", "nonce", "their_nonce", "eph", "sig")
    )
    from_: str
    to: str
    ts: int
    nonce: str
    their_nonce: str | None
    eph: str
    sig: str

    def _body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "t": self.KIND,
            "from": self.from_,
            "to": self.to,
            "ts": self.ts,
            "nonce": self.nonce,
            "eph": self.eph,
        }
        if self.their_nonce is not None:
            body["their_nonce"] = self.their_nonce
        return body

    @classmethod
    def create(
        cls, keys: KeyPair, to: str, ts: int, *, nonce: str, their_nonce: str | None, eph: str
    ) -> E2EHello:
        """A hello signed by ``keys`` (over the JCS form without ``sig``)."""
        unsigned = cls(keys.node_id, to, ts, nonce, their_nonce, eph, "")
        return cls(
            keys.node_id, to, ts, nonce, their_nonce, eph, keys.sign_object(unsigned._body())
        )

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> E2EHello:
        """Parse and verify a decoded hello.

        Raises:
            BadRequest: malformed.
            InvalidSignature: ``sig`` is not ``from``'s signature over the rest.
        """
        cls.SHAPE.check(obj)
        their = obj.get("their_nonce")
        hello = cls(
            _node(obj, "e2e_hello", "from"),
            _node(obj, "e2e_hello", "to"),
            _int(obj, "e2e_hello", "ts"),
            _str(obj, "e2e_hello", "nonce", MAX_NONCE_CHARS),
            None if their is None else _str(obj, "e2e_hello", "their_nonce", MAX_NONCE_CHARS),
            _str(obj, "e2e_hello", "eph", EPH_CHARS),
            _str(obj, "e2e_hello", "sig", 128),
        )
        verify_object(hello.from_, hello._body(), hello.sig)
        return hello

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {**self._body(), "sig": self.sig}


@dataclass(frozen=True, slots=True)
class Sealed(_Frame):
    """One peer-link frame ``f`` with the session sequence number ``s`` and the MAC ``m``
    (16 bytes). Only :class:`~hearthnet.mesh.relay_e2e.RelaySession` can check ``m``."""

    KIND: ClassVar[str] = "sealed"
    SHAPE: ClassVar[Shape] = Shape.of("sealed frame", ("t", "s", "f", "m"))
    s: int
    f: bytes
    m: bytes

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Sealed:
        """Parse a decoded frame (raises :class:`BadRequest`); the MAC is not checked here."""
        cls.SHAPE.check(obj)
        return cls(
            _int(obj, "sealed", "s", 1),
            _bytes(obj, "sealed", "f", MAX_INNER_BYTES),
            _bytes(obj, "sealed", "m", MAC_BYTES, MAC_BYTES),
        )

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {"t": self.KIND, "s": self.s, "f": self.f, "m": self.m}


@dataclass(frozen=True, slots=True)
class Candidates(_Frame):
    """The addresses one end may be reached at (its observed address first), for a punch
    attempt ``nonce``; the answer echoes the nonce."""

    KIND: ClassVar[str] = "candidates"
    SHAPE: ClassVar[Shape] = Shape.of("candidates frame", ("t", "nonce", "addrs"))
    nonce: str
    addrs: tuple[str, ...]

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Candidates:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        raw = obj.get("addrs")
        if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_ADDRS:
            raise BadRequest(f"candidates.addrs must be a list of 1..{MAX_ADDRS} addresses")
        addrs = tuple(check_addr(a, "candidates.addrs[]") for a in raw)
        return cls(_str(obj, "candidates", "nonce", MAX_NONCE_CHARS), addrs)

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {"t": self.KIND, "nonce": self.nonce, "addrs": list(self.addrs)}


@dataclass(frozen=True, slots=True)
class Punch(_Frame):
    """Initiator -> responder: start the simultaneous open ``in_ms`` after this frame
    arrives; the initiator starts ``in_ms`` plus half the measured RTT after sending it,
    so both start at the same moment."""

    KIND: ClassVar[str] = "punch"
    SHAPE: ClassVar[Shape] = Shape.of("punch frame", ("t", "nonce", "in_ms"))
    nonce: str
    in_ms: int

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Punch:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        return cls(
            _str(obj, "punch", "nonce", MAX_NONCE_CHARS),
            _int(obj, "punch", "in_ms", 0, MAX_PUNCH_DELAY_MS),
        )

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {"t": self.KIND, "nonce": self.nonce, "in_ms": self.in_ms}


@dataclass(frozen=True, slots=True)
class Upgrade(_Frame):
    """First frame on a punched direct link (after its hellos): it belongs to attempt
    ``nonce``, and the peer's frames move to it (see :mod:`hearthnet.mesh.paths`)."""

    KIND: ClassVar[str] = "upgrade"
    SHAPE: ClassVar[Shape] = Shape.of("upgrade frame", ("t", "nonce"))
    nonce: str

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Upgrade:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        return cls(_str(obj, "upgrade", "nonce", MAX_NONCE_CHARS))

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {"t": self.KIND, "nonce": self.nonce}


@dataclass(frozen=True, slots=True)
class PFrame(_Frame):
    """Peer frame ``f`` numbered ``s`` in the sender's sequence to this peer (across paths)."""

    KIND: ClassVar[str] = "pframe"
    SHAPE: ClassVar[Shape] = Shape.of("pframe frame", ("t", "s", "f"))
    s: int
    f: bytes

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> PFrame:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        return cls(_int(obj, "pframe", "s", 1), _bytes(obj, "pframe", "f", MAX_INNER_BYTES))

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {"t": self.KIND, "s": self.s, "f": self.f}


@dataclass(frozen=True, slots=True)
class PAck(_Frame):
    """Every ``pframe`` up to ``upto`` was delivered; the sender may forget them.
    ``drained``: this ack answers a ``drain``, so frames up to the drained ``upto`` that it
    does not cover were lost on the old path."""

    KIND: ClassVar[str] = "pack"
    SHAPE: ClassVar[Shape] = Shape.of("pack frame", ("t", "upto", "drained"))
    upto: int
    drained: bool = False

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> PAck:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        drained = obj.get("drained", False)
        if not isinstance(drained, bool):
            raise BadRequest("pack.drained must be a boolean")
        return cls(_int(obj, "pack", "upto"), drained)

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        if self.drained:
            return {"t": self.KIND, "upto": self.upto, "drained": True}
        return {"t": self.KIND, "upto": self.upto}


@dataclass(frozen=True, slots=True)
class Drain(_Frame):
    """The last ``pframe`` this path carries is ``upto``; later ones take the new path."""

    KIND: ClassVar[str] = "drain"
    SHAPE: ClassVar[Shape] = Shape.of("drain frame", ("t", "upto"))
    upto: int

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Drain:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        return cls(_int(obj, "drain", "upto"))

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {"t": self.KIND, "upto": self.upto}


RelayFrame = (
    Attach
    | Attached
    | Detach
    | Route
    | RouteError
    | RouteTable
    | E2EHello
    | Sealed
    | Candidates
    | Punch
    | Upgrade
    | PFrame
    | PAck
    | Drain
)

FRAME_TYPES: dict[str, type[RelayFrame]] = {
    cls.KIND: cls
    for cls in (
        Attach,
        Attached,
        Detach,
        Route,
        RouteError,
        RouteTable,
        E2EHello,
        Sealed,
        Candidates,
        Punch,
        Upgrade,
        PFrame,
        PAck,
        Drain,
    )
}
RELAY_FRAME_KINDS = frozenset(FRAME_TYPES)


def parse_frame(obj: dict[str, Any]) -> RelayFrame:
    """The typed frame for a decoded peer-link map.

    Raises:
        BadRequest: not a relay frame kind, or malformed (naming the field).
        InvalidSignature: an ``e2e_hello`` whose signature does not verify.
    """
    cls = FRAME_TYPES.get(obj.get("t"))  # type: ignore[arg-type]
    if cls is None:
        raise BadRequest(f"not a relay frame kind: {str(obj.get('t'))[:32]!r}")
    return cls.parse(obj)


def decode(data: bytes) -> RelayFrame:
    """Parse one relay frame from its CBOR bytes.

    Raises:
        PayloadTooLarge: over the peer-link frame limit.
        BadRequest: not CBOR, not a map, or see :func:`parse_frame`.
        InvalidSignature: see :func:`parse_frame`.
    """
    if len(data) > MAX_FRAME_BYTES:
        raise PayloadTooLarge(f"relay frame over {MAX_FRAME_BYTES} bytes")
    try:
        obj = cbor2.loads(data)
    except (cbor2.CBORDecodeError, ValueError, TypeError, OverflowError) as exc:
        raise BadRequest(f"malformed relay frame: {exc}") from exc
    if not isinstance(obj, dict):
        raise BadRequest("a relay frame is a CBOR map")
    return parse_frame(obj)
