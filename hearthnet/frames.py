"""The frame shared by SSE, WebSocket, bus streams and pub/sub (spec §3.4).

Every server→client frame is ``{"event": str, "data": object, "seq"?: int}``. A
capability yields frames without a ``seq``; the transport numbers them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hearthnet.errors import BadRequest

TERMINAL_EVENTS = frozenset({"done", "error"})


@dataclass(frozen=True, slots=True)
class Frame:
    """One event of a stream."""

    event: str
    data: dict[str, Any] = field(default_factory=dict)
    seq: int | None = None

    @property
    def terminal(self) -> bool:
        """``done`` and ``error`` end a stream (spec §2.4)."""
        return self.event in TERMINAL_EVENTS

    def with_seq(self, seq: int) -> Frame:
        """The same frame numbered for flow control."""
        return Frame(self.event, self.data, seq)

    def to_json(self) -> dict[str, Any]:
        """The wire object."""
        if self.seq is None:
            return {"event": self.event, "data": self.data}
        return {"event": self.event, "data": self.data, "seq": self.seq}

    @classmethod
    def from_json(cls, obj: object) -> Frame:
        """Parse a server frame (client side)."""
        if not isinstance(obj, dict) or not isinstance(obj.get("event"), str):
            raise BadRequest("a frame is an object with an event string")
        data = obj.get("data", {})
        seq = obj.get("seq")
        if not isinstance(data, dict) or (seq is not None and not isinstance(seq, int)):
            raise BadRequest("frame data must be an object and seq an integer")
        return cls(obj["event"], data, seq)


def done(**data: Any) -> Frame:
    """A ``done`` frame."""
    return Frame("done", data)


def token(text: str, **extra: Any) -> Frame:
    """A ``token`` frame."""
    return Frame("token", {"text": text, **extra})
