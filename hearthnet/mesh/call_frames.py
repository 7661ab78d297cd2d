"""The remote-call frames of a peer link (spec §7.4): a call carried to the node that
provides the capability, its reply stream, acks, tool results and cancellation. Pure;
:func:`~hearthnet.mesh.frames.parse_frame` types them with the other link frames.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from hearthnet.mesh.frame_base import MAX_SID, _Frame, _int, _str


@dataclass(frozen=True, slots=True)
class Call(_Frame):
    """``call {sid, to, envelope, signature?, token?, deadline_ms?, inline?}``: the original
    call envelope and credentials, verified end to end by the provider."""

    KIND: ClassVar[str] = "call"
    sid: str
    to: str | None
    envelope: Any
    signature: Any = None
    token: Any = None
    deadline_ms: int | None = None
    inline: bool = False

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        """From a decoded map; :class:`BadRequest` if malformed (the envelope and
        credentials are checked by the authenticator)."""
        cls.check(obj)
        deadline = obj.get("deadline_ms")
        return cls(
            _str(obj, "sid", "call", limit=MAX_SID),
            obj.get("to") if isinstance(obj.get("to"), str) else None,
            obj.get("envelope"),
            obj.get("signature"),
            obj.get("token"),
            deadline if isinstance(deadline, int) and deadline > 0 else None,
            bool(obj.get("inline")),
        )

    def to_wire(self) -> dict[str, Any]:
        """See :meth:`_Frame.to_wire`."""
        return {
            "sid": self.sid,
            "to": self.to,
            "envelope": self.envelope,
            "signature": self.signature,
            "token": self.token,
            "deadline_ms": self.deadline_ms,
            "inline": self.inline,
        }


@dataclass(frozen=True, slots=True)
class StreamFrame(_Frame):
    """``frame {sid, f}``: one frame of a call's reply stream (``f`` is its JSON form)."""

    KIND: ClassVar[str] = "frame"
    sid: str
    f: Any

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        """From a decoded map; :class:`BadRequest` if malformed."""
        cls.check(obj)
        return cls(_str(obj, "sid", "frame", limit=MAX_SID), obj.get("f"))

    def to_wire(self) -> dict[str, Any]:
        """See :meth:`_Frame.to_wire`."""
        return {"sid": self.sid, "f": self.f}


@dataclass(frozen=True, slots=True)
class Ack(_Frame):
    """``ack {sid, upto}``: the caller consumed a stream's frames up to ``upto``."""

    KIND: ClassVar[str] = "ack"
    sid: str
    upto: int

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        """From a decoded map; :class:`BadRequest` if malformed."""
        cls.check(obj)
        return cls(_str(obj, "sid", "ack", limit=MAX_SID), _int(obj, "upto", "ack"))

    def to_wire(self) -> dict[str, Any]:
        """See :meth:`_Frame.to_wire`."""
        return {"sid": self.sid, "upto": self.upto}


@dataclass(frozen=True, slots=True)
class ToolResult(_Frame):
    """``tool_result {sid, tool_call_id, body}``: a client's tool result, along the call."""

    KIND: ClassVar[str] = "tool_result"
    sid: str
    tool_call_id: Any
    body: Any

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        """From a decoded map; :class:`BadRequest` if malformed (the tool result itself is
        checked by the call it belongs to)."""
        cls.check(obj)
        return cls(
            _str(obj, "sid", "tool_result", limit=MAX_SID), obj.get("tool_call_id"), obj.get("body")
        )

    def to_wire(self) -> dict[str, Any]:
        """See :meth:`_Frame.to_wire`."""
        return {"sid": self.sid, "tool_call_id": self.tool_call_id, "body": self.body}


@dataclass(frozen=True, slots=True)
class Cancel(_Frame):
    """``cancel {sid}``: the caller gave up on a call."""

    KIND: ClassVar[str] = "cancel"
    sid: str

    @classmethod
    def parse(cls, obj: Mapping[str, Any]) -> Self:
        """From a decoded map; :class:`BadRequest` if malformed."""
        cls.check(obj)
        return cls(_str(obj, "sid", "cancel", limit=MAX_SID))

    def to_wire(self) -> dict[str, Any]:
        """See :meth:`_Frame.to_wire`."""
        return {"sid": self.sid}
