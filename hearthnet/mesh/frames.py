"""Typed peer-link frames (spec §7.2–7.5). Pure parsing and serialising.

Every frame on a link is one CBOR map ``{"t": kind, ...}``;
:func:`~hearthnet.mesh.protocol.decode_frame` turns the bytes into a map (refusing what
canonical JSON cannot represent) and
:func:`parse_frame` turns the map into one of the frozen classes below. The fields each
kind may carry are listed once, in :data:`~hearthnet.mesh.frame_base.SHAPES`: a field not
listed there is refused with ``bad_request`` naming it, never ignored, and so is a field of
the wrong type. The remote-call frames (``call``, ``frame``, ``ack``, ``tool_result``,
``cancel``; spec §7.4) have their classes in :mod:`~hearthnet.mesh.call_frames`.

Each class has ``parse(obj)`` (from the decoded map) and ``encode()`` (CBOR bytes, the
``t`` included); ``to_wire()`` gives the map without ``t``.

``hello`` frames belong to the handshake (:class:`~hearthnet.mesh.protocol.Handshake`,
which checks them against the same shape before their signature). Relay and path frames
(spec §8: ``route``, ``attach``, ``pframe``, ...) have their classes in
:mod:`~hearthnet.mesh.relay_frames` and :mod:`~hearthnet.mesh.path_frames`;
:func:`parse_frame` leaves them to the relay code.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from hearthnet.errors import BadRequest
from hearthnet.mesh.call_frames import Ack, Call, Cancel, StreamFrame, ToolResult
from hearthnet.mesh.frame_base import (
    _Frame,
    _int,
    _int_map,
    _list,
    _opt_int,
    _opt_str,
    _str,
)

# --- gossip (spec §7.3) -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Msg(_Frame):
    """``msg {raw, h}``: one signed message as its JSON bytes, and the hops it travelled."""

    KIND: ClassVar[str] = "msg"
    raw: bytes
    h: int = 1

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        """From a decoded map; :class:`BadRequest` if malformed."""
        cls.check(obj)
        raw = obj.get("raw")
        if not isinstance(raw, bytes):
            raise BadRequest("msg.raw must be a byte string")
        return cls(raw, _hops(obj))

    def to_wire(self) -> dict[str, Any]:
        """See :meth:`_Frame.to_wire`."""
        return {"raw": self.raw, "h": self.h}


def _hops(obj: Mapping[str, Any]) -> int:
    # an out-of-range hop count is a peer's bookkeeping error, not a reason to drop the
    # message: it counts as one hop
    hops = obj.get("h", 1)
    return hops if isinstance(hops, int) and 0 < hops < 64 else 1


@dataclass(frozen=True, slots=True)
class BatchMsgs(_Frame):
    """``batch {origin, first, n, sig, leaves, h}``: a whole signed batch (spec §6.2) as
    its ``n`` leaves (each message's JCS bytes without ``sig``, ``origin_seq`` order from
    ``first``), the batch signature once, no per-message paths; the receiver rebuilds the
    tree. Sent only to peers whose hello lists the ``batch`` feature."""

    KIND: ClassVar[str] = "batch"
    origin: str
    first: int
    n: int
    sig: str
    leaves: tuple[bytes, ...]
    h: int = 1

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        """From a decoded map; :class:`BadRequest` if malformed (``n`` leaves, 2 or more)."""
        cls.check(obj)
        leaves = _list(obj, "leaves", "batch")
        n = _int(obj, "n", "batch", minimum=2)
        if len(leaves) != n or not all(isinstance(leaf, bytes) for leaf in leaves):
            raise BadRequest("batch.leaves must be n byte strings")
        return cls(
            _str(obj, "origin", "batch", limit=128),
            _int(obj, "first", "batch"),
            n,
            _str(obj, "sig", "batch", limit=256),
            leaves,
            _hops(obj),
        )

    def to_wire(self) -> dict[str, Any]:
        """See :meth:`_Frame.to_wire`."""
        return {
            "origin": self.origin,
            "first": self.first,
            "n": self.n,
            "sig": self.sig,
            "leaves": list(self.leaves),
            "h": self.h,
        }


@dataclass(frozen=True, slots=True)
class IHave(_Frame):
    """``ihave {heads, floors}``: per origin, the contiguous head held and the lowest seq."""

    KIND: ClassVar[str] = "ihave"
    heads: Mapping[str, int]
    floors: Mapping[str, int]

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        """From a decoded map; :class:`BadRequest` if malformed."""
        cls.check(obj)
        return cls(
            _int_map(obj, "heads", "ihave", required=True),
            _int_map(obj, "floors", "ihave", required=False),
        )

    def to_wire(self) -> dict[str, Any]:
        """See :meth:`_Frame.to_wire`."""
        return {"heads": dict(self.heads), "floors": dict(self.floors)}


@dataclass(frozen=True, slots=True)
class IWant(_Frame):
    """``iwant {want: {origin: [from, to]}}``: the ranges a peer asks us to repair."""

    KIND: ClassVar[str] = "iwant"
    want: Mapping[str, tuple[int, int]]

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        """From a decoded map; :class:`BadRequest` if malformed."""
        cls.check(obj)
        want = obj.get("want")
        if not isinstance(want, dict):
            raise BadRequest("iwant.want must map origins to [from, to]")
        spans: dict[str, tuple[int, int]] = {}
        for origin, span in want.items():
            if not (
                isinstance(origin, str)
                and isinstance(span, list)
                and len(span) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in span)
            ):
                raise BadRequest("iwant.want must map origins to [from, to]")
            spans[origin] = (span[0], span[1])
        return cls(spans)

    def to_wire(self) -> dict[str, Any]:
        """See :meth:`_Frame.to_wire`."""
        return {"want": {origin: [a, b] for origin, (a, b) in self.want.items()}}


# --- flooding: presence and membership ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Presence(_Frame):
    """``presence {id, node, events}``: presence events flooded once through the mesh."""

    KIND: ClassVar[str] = "presence"
    id: str
    node: str | None
    events: tuple[Any, ...]

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        """From a decoded map; :class:`BadRequest` if malformed."""
        cls.check(obj)
        return cls(
            _str(obj, "id", "presence", limit=64),
            _opt_str(obj, "node", "presence"),
            _list(obj, "events", "presence"),
        )

    def to_wire(self) -> dict[str, Any]:
        """See :meth:`_Frame.to_wire`."""
        return {"id": self.id, "node": self.node, "events": list(self.events)}


@dataclass(frozen=True, slots=True)
class MembershipBatch(_Frame):
    """``membership {records}``: signed membership records (each verified on admission)."""

    KIND: ClassVar[str] = "membership"
    records: tuple[Any, ...]

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        """From a decoded map; :class:`BadRequest` if malformed."""
        cls.check(obj)
        return cls(_list(obj, "records", "membership"))

    def to_wire(self) -> dict[str, Any]:
        """See :meth:`_Frame.to_wire`."""
        return {"records": list(self.records)}


# --- heartbeats (spec §7.5) -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ping(_Frame):
    """``ping {seq, ts}``."""

    KIND: ClassVar[str] = "ping"
    seq: int
    ts: int

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        """From a decoded map; :class:`BadRequest` if malformed."""
        cls.check(obj)
        return cls(_int(obj, "seq", "ping"), _int(obj, "ts", "ping"))

    def to_wire(self) -> dict[str, Any]:
        """See :meth:`_Frame.to_wire`."""
        return {"seq": self.seq, "ts": self.ts}


@dataclass(frozen=True, slots=True)
class Pong(_Frame):
    """``pong {seq, ts_echo, ts}``: the ping's seq and ts echoed, and the peer's clock."""

    KIND: ClassVar[str] = "pong"
    seq: int
    ts_echo: int | None
    ts: int | None

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        """From a decoded map; :class:`BadRequest` if malformed."""
        cls.check(obj)
        return cls(
            _int(obj, "seq", "pong"), _opt_int(obj, "ts_echo", "pong"), _opt_int(obj, "ts", "pong")
        )

    def to_wire(self) -> dict[str, Any]:
        """See :meth:`_Frame.to_wire`."""
        return {"seq": self.seq, "ts_echo": self.ts_echo, "ts": self.ts}


# --- link management ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bye(_Frame):
    """``bye {code, reason, self_link?}``: the link is closing, and why."""

    KIND: ClassVar[str] = "bye"
    code: str
    reason: str = ""
    self_link: bool = False

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        """From a decoded map; :class:`BadRequest` if malformed."""
        cls.check(obj)
        code, reason = obj.get("code"), obj.get("reason", "")
        return cls(
            code if isinstance(code, str) else "closing",
            str(reason)[:200],
            obj.get("self_link") is True,
        )

    def to_wire(self) -> dict[str, Any]:
        """See :meth:`_Frame.to_wire`."""
        out: dict[str, Any] = {"code": self.code, "reason": self.reason[:200]}
        if self.self_link:
            out["self_link"] = True
        return out


@dataclass(frozen=True, slots=True)
class Caps(_Frame):
    """``caps {providers}``: the capabilities this side reaches (checked by the routes)."""

    KIND: ClassVar[str] = "caps"
    providers: tuple[Any, ...]

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        """From a decoded map; :class:`BadRequest` if malformed."""
        cls.check(obj)
        return cls(_list(obj, "providers", "caps"))

    def to_wire(self) -> dict[str, Any]:
        """See :meth:`_Frame.to_wire`."""
        return {"providers": list(self.providers)}


@dataclass(frozen=True, slots=True)
class Peers(_Frame):
    """``peers {peers: [{url, node?, claimed_by?}]}``: peer exchange (spec §7.1)."""

    KIND: ClassVar[str] = "peers"
    peers: tuple[Any, ...]

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        """From a decoded map; :class:`BadRequest` if malformed."""
        cls.check(obj)
        return cls(_list(obj, "peers", "peers"))

    def to_wire(self) -> dict[str, Any]:
        """See :meth:`_Frame.to_wire`."""
        return {"peers": list(self.peers)}


PeerFrame = (
    Msg
    | BatchMsgs
    | IHave
    | IWant
    | Presence
    | MembershipBatch
    | Ping
    | Pong
    | Bye
    | Caps
    | Peers
    | Call
    | StreamFrame
    | Ack
    | ToolResult
    | Cancel
)

FRAME_CLASSES: dict[str, type[PeerFrame]] = {
    cls.KIND: cls
    for cls in (
        Msg,
        BatchMsgs,
        IHave,
        IWant,
        Presence,
        MembershipBatch,
        Ping,
        Pong,
        Bye,
        Caps,
        Peers,
        Call,
        StreamFrame,
        Ack,
        ToolResult,
        Cancel,
    )
}


def parse_frame(obj: Mapping[str, Any]) -> PeerFrame | None:
    """The typed frame for a decoded link frame after the handshake; None for a kind this
    module does not type (``hello``; the relay and path frames of spec §8).

    Raises:
        BadRequest: a field the kind does not list, or a field of the wrong type.
    """
    cls = FRAME_CLASSES.get(obj.get("t"))  # type: ignore[arg-type]
    if cls is None:
        return None
    return cls.parse(obj)
