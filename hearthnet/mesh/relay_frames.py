"""Relay frames (spec §8): typed, frozen, strictly parsed. Pure.

Every frame is one CBOR map ``{"t": kind, ...}`` on a peer link, like the frames of
:mod:`hearthnet.mesh.protocol`, except ``route``: on a ``hearthnet-peer.v2`` link it goes
in a binary form whose fixed header a relay reads without decoding the rest
(:mod:`hearthnet.mesh.route_header`); :class:`Route` is the frame in either form, and its
CBOR map is what ``hearthnet-peer.v1`` peers send and are sent. Three layers::

    peer link  member <-> relay, relay <-> relay (already authenticated by the hello)
      attach {ts?}                                  member asks to be relayed
      attached {relay, observed_addr, bytes_per_s, streams, max_inner, ts_echo?}
      detach {code?, reason?}                       either side ends the attachment
      budget {bytes_per_s, burst}                   relay -> member: pace to this
      route {to, from, ttl_hops, id, inner, control?}   ``inner``: the bytes of one e2e frame
      route_error {to, origin, id, code, retry_after_ms?}   code: unreachable|ttl|rate_limited
      route_table {relay, version, nodes: [[node, hops], ...]}   relay <-> relay
      join_via {id, request}   join_answer {id, answer}   relay <-> inviter: a join

    end to end (the bytes of ``route.inner``; the relay neither reads nor alters them)
      e2e_hello {from, to, ts, nonce, their_nonce?, eph, sig}   signed by ``from``
      sealed {s, f, m}                              ``f`` sealed under the session's keys

    peer to peer (the bytes of ``sealed.f``, or plain frames on a direct link)
      candidates {nonce, addrs}                     addresses to punch, via the relay
      punch {nonce, in_ms}                          start the simultaneous open
      upgrade {nonce}                               first frame on the punched link
      pframe {s, f}   pack {upto, drained?}   drain {upto}   one sequence across paths

The path frames are defined in :mod:`hearthnet.mesh.path_frames`; how the end-to-end
session works is in :mod:`hearthnet.mesh.relay_e2e`, the path sequence in
:mod:`hearthnet.mesh.pathseq`. Parsing refuses an unknown field by name
and a field of the wrong type by name (``bad_request``); parsing an ``e2e_hello`` verifies
its signature, so an unverified hello never exists as an object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from hearthnet import cbor
from hearthnet.errors import BadRequest, PayloadTooLarge
from hearthnet.identity import KeyPair, verify_object
from hearthnet.ids import is_node_id
from hearthnet.mesh.frame_fields import (
    MAX_FRAME_BYTES,
    MAX_INNER_BYTES,
    MAX_NONCE_CHARS,
    Frame,
    bytes_field,
    check_addr,
    int_field,
    node_field,
    opt_int_field,
    str_field,
)
from hearthnet.mesh.pacing import Budget
from hearthnet.mesh.path_frames import Candidates, Drain, PAck, PFrame, Punch, Upgrade
from hearthnet.shapes import Shape

MAX_TTL_HOPS = 16
DEFAULT_TTL_HOPS = 4  # spec §8
MAX_ROUTE_NODES = 10_000
MAC_BYTES = 16
EPH_CHARS = 43  # base64url of a 32-byte X25519 public key
ROUTE_ERROR_CODES = frozenset({"unreachable", "ttl", "rate_limited"})


@dataclass(frozen=True, slots=True)
class Attach(Frame):
    """Member -> relay: relay me. ``ts`` (ms) is echoed, which measures the relay's RTT."""

    KIND: ClassVar[str] = "attach"
    SHAPE: ClassVar[Shape] = Shape.of("attach frame", ("t", "ts"))
    ts: int | None = None

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Attach:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        return cls(opt_int_field(obj, "attach", "ts"))

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {"t": self.KIND} if self.ts is None else {"t": self.KIND, "ts": self.ts}


@dataclass(frozen=True, slots=True)
class Attached(Frame):
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
            node_field(obj, "attached", "relay"),
            check_addr(obj.get("observed_addr"), "attached.observed_addr"),
            int_field(obj, "attached", "bytes_per_s", 1),
            int_field(obj, "attached", "streams", 1, 1 << 20),
            int_field(obj, "attached", "max_inner", 1, MAX_INNER_BYTES),
            opt_int_field(obj, "attached", "ts_echo"),
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
class Detach(Frame):
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
        code = None if obj.get("code") is None else str_field(obj, "detach", "code", 32)
        reason = (
            "" if obj.get("reason") is None else str_field(obj, "detach", "reason", 200, empty=True)
        )
        return cls(code, reason, opt_int_field(obj, "detach", "retry_after_ms"))

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


MAX_JOIN_BYTES = 8 * 1024  # a join request: an invite (≤ 4 KiB) and a few fields


@dataclass(frozen=True, slots=True)
class JoinVia(Frame):
    """Relay -> inviter: a not-yet-member's join request (the JSON of ``POST
    /mesh/v1/join``), which reached the relay over HTTP because the inviter cannot be
    dialled (spec §8 ``--join`` through a relay). ``id`` pairs it with the answer."""

    KIND: ClassVar[str] = "join_via"
    SHAPE: ClassVar[Shape] = Shape.of("join_via frame", ("t", "id", "request"))
    id: int
    request: bytes

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> JoinVia:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        return cls(
            int_field(obj, "join_via", "id"),
            bytes_field(obj, "join_via", "request", MAX_JOIN_BYTES),
        )

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {"t": self.KIND, "id": self.id, "request": self.request}


@dataclass(frozen=True, slots=True)
class JoinAnswer(Frame):
    """Inviter -> relay: the answer to ``join_via`` ``id`` (the JSON body ``POST
    /mesh/v1/join`` would have answered, an error body included), for the relay to hand
    back to the joining node."""

    KIND: ClassVar[str] = "join_answer"
    SHAPE: ClassVar[Shape] = Shape.of("join_answer frame", ("t", "id", "answer"))
    id: int
    answer: bytes

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> JoinAnswer:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        return cls(
            int_field(obj, "join_answer", "id"),
            bytes_field(obj, "join_answer", "answer", MAX_INNER_BYTES),
        )

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {"t": self.KIND, "id": self.id, "answer": self.answer}


@dataclass(frozen=True, slots=True)
class Route(Frame):
    """A frame from ``from_`` to ``to`` through relays (:meth:`encode`: the CBOR map;
    :func:`~hearthnet.mesh.route_header.encode_route`: the binary form). ``inner`` is
    opaque to relays (the bytes of an ``e2e_hello`` or ``sealed``); ``id`` is chosen by
    the sender and, with ``from_``, keys the relays' seen-cache; ``ttl_hops`` is how many
    relays it may still pass.
    ``control``: the sender says ``inner`` keeps the path alive (heartbeats, acks, session
    hellos), which a relay charges to a small allowance of its own, apart from the data
    budget (spec §8), so a member sending over budget keeps its links up.
    """

    KIND: ClassVar[str] = "route"
    SHAPE: ClassVar[Shape] = Shape.of(
        "route frame",
        ("t", "to", "from", "ttl_hops", "id", "inner", "control"),
        {"ttl": "ttl_hops?"},
    )
    to: str
    from_: str
    ttl_hops: int
    id: int
    inner: bytes
    control: bool = False

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Route:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        control = obj.get("control", False)
        if not isinstance(control, bool):
            raise BadRequest("route.control must be a boolean")
        return cls(
            node_field(obj, "route", "to"),
            node_field(obj, "route", "from"),
            int_field(obj, "route", "ttl_hops", 0, MAX_TTL_HOPS),
            int_field(obj, "route", "id"),
            bytes_field(obj, "route", "inner", MAX_INNER_BYTES),
            control,
        )

    def serialize(self) -> dict[str, Any]:
        """The wire map (``control`` only when set)."""
        out: dict[str, Any] = {
            "t": self.KIND,
            "to": self.to,
            "from": self.from_,
            "ttl_hops": self.ttl_hops,
            "id": self.id,
            "inner": self.inner,
        }
        if self.control:
            out["control"] = True
        return out


@dataclass(frozen=True, slots=True)
class RouteError(Frame):
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
            node_field(obj, "route_error", "to"),
            node_field(obj, "route_error", "origin"),
            int_field(obj, "route_error", "id"),
            str(code),
            opt_int_field(obj, "route_error", "retry_after_ms"),
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
class RouteTable(Frame):
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
            node_field(obj, "route_table", "relay"),
            int_field(obj, "route_table", "version"),
            tuple(nodes),
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
class E2EHello(Frame):
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
            node_field(obj, "e2e_hello", "from"),
            node_field(obj, "e2e_hello", "to"),
            int_field(obj, "e2e_hello", "ts"),
            str_field(obj, "e2e_hello", "nonce", MAX_NONCE_CHARS),
            None if their is None else str_field(obj, "e2e_hello", "their_nonce", MAX_NONCE_CHARS),
            str_field(obj, "e2e_hello", "eph", EPH_CHARS),
            str_field(obj, "e2e_hello", "sig", 128),
        )
        verify_object(hello.from_, hello._body(), hello.sig)
        return hello

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {**self._body(), "sig": self.sig}


@dataclass(frozen=True, slots=True)
class Sealed(Frame):
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
            int_field(obj, "sealed", "s", 1),
            bytes_field(obj, "sealed", "f", MAX_INNER_BYTES),
            bytes_field(obj, "sealed", "m", MAC_BYTES, MAC_BYTES),
        )

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {"t": self.KIND, "s": self.s, "f": self.f, "m": self.m}


RelayFrame = (
    Attach
    | Attached
    | Budget
    | Detach
    | Route
    | RouteError
    | JoinVia
    | JoinAnswer
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
        Budget,
        Detach,
        Route,
        RouteError,
        RouteTable,
        JoinVia,
        JoinAnswer,
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
        obj = cbor.loads(data)
    except (cbor.CBORDecodeError, ValueError, TypeError, OverflowError) as exc:
        raise BadRequest(f"malformed relay frame: {exc}") from exc
    if not isinstance(obj, dict):
        raise BadRequest("a relay frame is a CBOR map")
    return parse_frame(obj)
