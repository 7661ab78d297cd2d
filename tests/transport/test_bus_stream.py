"""The bus WebSocket session state machine (spec §3.5–3.6), pure."""

from __future__ import annotations

import json

import pytest

from hearthnet.errors import BadRequest
from hearthnet.frames import Frame
from hearthnet.transport.bus_stream import (
    Ack,
    BusStreamProtocol,
    CallRequest,
    CancelRequest,
    StreamState,
    ToolResult,
)
from hearthnet.transport.codec import SUBPROTOCOL_JSON, FrameCodec

# Frames a client may send mid-stream, each with a field it does not define, and what the
# refusal says (the core's here, the WebSocket's in test_bus_ws.py).
UNKNOWN_FIELDS_MID_STREAM: list[tuple[dict[str, object], str]] = [
    (
        {"type": "ack", "upto": 1, "seq": 1},
        "unknown field 'seq' in ack frame (did you mean upto?)",
    ),
    (
        {"type": "tool_result", "tool_call_id": "tc_1", "body": {}, "result": {}},
        "unknown field 'result' in tool_result frame (did you mean body?)",
    ),
    ({"type": "cancel", "reason": "bored"}, "unknown field 'reason' in cancel frame"),
]


def proto() -> BusStreamProtocol:
    """A fresh JSON session with the default window."""
    return BusStreamProtocol(FrameCodec(SUBPROTOCOL_JSON), window=16, max_message_bytes=1 << 20)


def feed(p: BusStreamProtocol, obj: object) -> object:
    """Receive one JSON text message."""
    return p.receive(json.dumps(obj).encode(), binary=False)


def test_first_frame_must_be_the_call() -> None:
    """Acks, cancels or tool results before the call frame are bad_request."""
    for early in ({"type": "ack", "upto": 1}, {"type": "cancel"}, {"type": "tool_result"}, {}):
        with pytest.raises(BadRequest, match="first frame"):
            feed(proto(), early)


def test_call_then_stream_frames() -> None:
    """A call frame parses; frames are numbered 1, 2, ...; the terminal frame ends the session."""
    p = proto()
    call = feed(p, {"type": "call", "envelope": {"x": 1}, "signature": "ed25519:s"})
    p.start()
    first = json.loads(p.encode(Frame("token", {"text": "a"})))
    last = json.loads(p.encode(Frame("done", {})))
    assert (CallRequest({"x": 1}, "ed25519:s", None), 1, 2, StreamState.ENDED) == (
        call,
        first["seq"],
        last["seq"],
        p.state,
    )


def test_client_frames_while_streaming() -> None:
    """Acks, tool results and cancel are recognised; a second call is refused."""
    p = proto()
    feed(p, {"type": "call", "envelope": {}})
    p.start()
    for _ in range(10):
        p.encode(Frame("token", {}))
    assert [Ack(8, 8), Ack(3, 0), ToolResult("tc_1", {"r": 1}), CancelRequest()] == [
        feed(p, {"type": "ack", "upto": 8}),
        feed(p, {"type": "ack", "upto": 3}),
        feed(p, {"type": "tool_result", "tool_call_id": "tc_1", "body": {"r": 1}}),
        feed(p, {"type": "cancel"}),
    ]
    with pytest.raises(BadRequest):
        feed(p, {"type": "call", "envelope": {}})
    with pytest.raises(BadRequest):
        feed(p, {"type": "dance"})


def test_window_full_blocks_non_terminal_frames() -> None:
    """After 16 unacked frames can_send is false; the terminal frame still goes."""
    p = proto()
    feed(p, {"type": "call", "envelope": {}})
    p.start()
    for _ in range(16):
        p.encode(Frame("token", {}))
    assert not p.can_send
    with pytest.raises(ValueError):
        p.encode(Frame("token", {}))
    assert 17 == json.loads(p.encode(Frame("error", {"code": "timeout"})))["seq"]


def test_illegal_transition_raises() -> None:
    """Starting twice is a bug, not a state."""
    p = proto()
    p.start()
    with pytest.raises(RuntimeError):
        p.start()


def test_late_frames_after_end_are_ignored() -> None:
    """An ack that arrives after the final frame is harmless."""
    p = proto()
    feed(p, {"type": "call", "envelope": {}})
    p.start()
    p.encode(Frame("done", {}))
    assert None is feed(p, {"type": "ack", "upto": 1})


@pytest.mark.parametrize(("frame", "message"), UNKNOWN_FIELDS_MID_STREAM)
def test_unknown_fields_while_streaming_are_refused_by_name(
    frame: dict[str, object], message: str
) -> None:
    """Every frame a client may send mid-stream refuses a field it does not define."""
    p = proto()
    feed(p, {"type": "call", "envelope": {}})
    p.start()
    with pytest.raises(BadRequest) as refused:
        feed(p, frame)
    assert message == refused.value.message


def test_unknown_field_in_the_call_frame_is_refused_by_name() -> None:
    """The first frame carries envelope and signature or token, nothing else."""
    with pytest.raises(BadRequest) as refused:
        feed(proto(), {"type": "call", "envelope": {}, "token": "t", "body": {}})
    assert "unknown field 'body' in call frame (the body goes inside envelope)" == (
        refused.value.message
    )


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        ({"type": "ack", "upto": "8"}, "ack.upto must be an integer"),
        (
            {"type": "tool_result", "tool_call_id": 7, "body": {}},
            "tool_result.tool_call_id must be a string",
        ),
        ({"type": "tool_result", "tool_call_id": "tc_1"}, "tool_result needs a body"),
    ],
)
def test_wrong_types_while_streaming_name_the_field(frame: dict[str, object], message: str) -> None:
    """A field of the wrong type is bad_request naming the field."""
    p = proto()
    feed(p, {"type": "call", "envelope": {}})
    p.start()
    with pytest.raises(BadRequest) as refused:
        feed(p, frame)
    assert message == refused.value.message


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        ({"type": "call", "envelope": []}, "call.envelope must be an object (the call envelope)"),
        ({"type": "call", "envelope": {}, "signature": 1}, "call.signature must be a string"),
        ({"type": "call", "envelope": {}, "token": 1}, "call.token must be a string"),
    ],
)
def test_wrong_types_in_the_call_frame_name_the_field(
    frame: dict[str, object], message: str
) -> None:
    """A call frame field of the wrong type is bad_request naming the field."""
    with pytest.raises(BadRequest) as refused:
        feed(proto(), frame)
    assert message == refused.value.message
