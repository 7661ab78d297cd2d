"""The server side of one bus WebSocket (spec §3.5–3.6), as a pure state machine.

It decides which client frames are legal in which state, numbers server frames and
keeps the seq/ACK window. The aiohttp glue (:mod:`hearthnet.transport.bus_ws`) feeds
it messages and writes the bytes it returns; timers live in the glue.

States::

    AWAITING_CALL --call--> STREAMING --terminal frame--> ENDED
          \\-------------violation / timeout--------------->/
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from hearthnet.errors import BadRequest
from hearthnet.frames import Frame
from hearthnet.ids import is_node_id
from hearthnet.shapes import Shape
from hearthnet.transport.codec import FrameCodec
from hearthnet.transport.flow import FlowWindow


class StreamState(enum.Enum):
    """Where a bus WebSocket is in its life."""

    AWAITING_CALL = "awaiting_call"
    STREAMING = "streaming"
    ENDED = "ended"


_TRANSITIONS: dict[StreamState, frozenset[StreamState]] = {
    StreamState.AWAITING_CALL: frozenset({StreamState.STREAMING, StreamState.ENDED}),
    StreamState.STREAMING: frozenset({StreamState.ENDED}),
    StreamState.ENDED: frozenset(),
}


@dataclass(frozen=True, slots=True)
class CallRequest:
    """The first client frame: the signed call envelope (or a token), the node to run it
    on (``target``, as ``X-HearthNet-Target`` on HTTP: spec §2.3) and the call's deadline
    in ms (``deadline_ms``, as ``X-HearthNet-Deadline-Ms``)."""

    envelope: Any
    signature: str | None
    token: str | None
    target: str | None = None
    deadline_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Ack:
    """``{"type":"ack","upto":N}``; ``released`` is how many frames it freed."""

    upto: int
    released: int


@dataclass(frozen=True, slots=True)
class ToolResult:
    """``{"type":"tool_result","tool_call_id","body"}``."""

    tool_call_id: str
    body: Any


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """``{"type":"cancel"}``."""


ClientFrame = CallRequest | Ack | ToolResult | CancelRequest

# The fields of each client frame on a bus WebSocket (spec §3.5-3.6). One table: a field
# that is not listed here is refused with bad_request, never ignored.
SHAPES: dict[str, Shape] = {
    "call": Shape.of(
        "call frame",
        ("type", "envelope", "signature", "token", "target", "deadline_ms"),
        {
            "body": "the body goes inside envelope",
            "sig": "did you mean signature?",
            "deadline": "did you mean deadline_ms?",
        },
    ),
    "ack": Shape.of("ack frame", ("type", "upto"), {"seq": "did you mean upto?"}),
    "tool_result": Shape.of(
        "tool_result frame",
        ("type", "tool_call_id", "body"),
        {"result": "did you mean body?", "id": "did you mean tool_call_id?"},
    ),
    "cancel": Shape.of("cancel frame", ("type",)),
}


class BusStreamProtocol:
    """Legal client frames and server frame numbering for one bus WebSocket."""

    def __init__(self, codec: FrameCodec, *, window: int, max_message_bytes: int) -> None:
        self.codec = codec
        self.window = FlowWindow(window)
        self.max_message_bytes = max_message_bytes
        self.state = StreamState.AWAITING_CALL

    def _to(self, state: StreamState) -> None:
        if state not in _TRANSITIONS[self.state]:
            raise RuntimeError(f"illegal stream transition {self.state.value} -> {state.value}")
        self.state = state

    def start(self) -> None:
        """The call was admitted; frames may flow."""
        self._to(StreamState.STREAMING)

    def end(self) -> None:
        """The stream is over (idempotent)."""
        if self.state is not StreamState.ENDED:
            self._to(StreamState.ENDED)

    def receive(self, data: bytes | str, *, binary: bool) -> ClientFrame | None:
        """Parse one client message in the current state.

        Returns None for frames that are harmless after the end (late acks, a late cancel).

        Raises:
            BadRequest: malformed frame, wrong frame type for the subprotocol, a frame
                before the call frame, a second call frame, or an unknown type.
            PayloadTooLarge: over the message limit.
        """
        obj = self.codec.decode(data, binary=binary, max_bytes=self.max_message_bytes)
        kind = obj.get("type")
        if self.state is StreamState.AWAITING_CALL:
            if kind != "call":
                raise BadRequest(f"the first frame must be a call frame, not {str(kind)[:32]!r}")
            SHAPES["call"].check(obj)
            return self._parse_call(obj)
        if self.state is StreamState.ENDED:
            return None
        shape = SHAPES.get(kind) if isinstance(kind, str) else None
        if shape is not None and not obj.keys() <= shape.fields:
            shape.refuse(obj.keys())
        if kind == "ack":
            upto = obj.get("upto")
            if not isinstance(upto, int) or isinstance(upto, bool):
                raise BadRequest("ack.upto must be an integer")
            # released == 0: an old or unknown seq, a no-op by spec §3.6 (the glue counts it)
            return Ack(upto, self.window.ack(upto))
        if kind == "tool_result":
            tool_call_id = obj.get("tool_call_id")
            if not isinstance(tool_call_id, str):
                raise BadRequest("tool_result.tool_call_id must be a string")
            if "body" not in obj:
                raise BadRequest("tool_result needs a body")
            return ToolResult(tool_call_id, obj["body"])
        if kind == "cancel":
            return CancelRequest()
        if kind == "call":
            raise BadRequest("one WebSocket carries one call")
        raise BadRequest(f"unknown frame type {str(kind)[:32]!r}")

    @staticmethod
    def _parse_call(obj: dict[str, Any]) -> CallRequest:
        envelope = obj.get("envelope")
        signature = obj.get("signature")
        token = obj.get("token")
        if not isinstance(envelope, dict):
            raise BadRequest("call.envelope must be an object (the call envelope)")
        if signature is not None and not isinstance(signature, str):
            raise BadRequest("call.signature must be a string")
        if token is not None and not isinstance(token, str):
            raise BadRequest("call.token must be a string")
        target = obj.get("target")
        if target is not None and not is_node_id(target):
            raise BadRequest("call.target must be a NodeID")
        deadline_ms = obj.get("deadline_ms")
        if deadline_ms is not None and (
            isinstance(deadline_ms, bool) or not isinstance(deadline_ms, int) or deadline_ms < 1
        ):
            raise BadRequest("call.deadline_ms must be a positive integer (milliseconds)")
        return CallRequest(envelope, signature, token, target, deadline_ms)

    @property
    def can_send(self) -> bool:
        """True when the window lets one more non-terminal frame out."""
        return self.window.open

    def encode(self, frame: Frame) -> bytes:
        """Number ``frame`` and encode it. Terminal frames pass a full window and end
        the stream.

        Raises:
            ValueError: a non-terminal frame while the window is full (a glue bug).
        """
        seq = self.window.next_seq(force=frame.terminal)
        data = self.codec.encode_frame(frame.with_seq(seq))
        if frame.terminal:
            self.end()
        return data

    def encode_unnumbered(self, frame: Frame) -> bytes:
        """Encode a frame outside the stream (an error before the call was admitted)."""
        return self.codec.encode_frame(frame)
