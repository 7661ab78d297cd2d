"""Frame encodings: JSON, CBOR and SSE carry the same shapes (spec §3.3, §3.4, §3.8)."""

from __future__ import annotations

import json

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hearthnet.errors import BadRequest, PayloadTooLarge, WrongFrameType
from hearthnet.frames import Frame
from hearthnet.transport.codec import (
    SUBPROTOCOL_CBOR,
    SUBPROTOCOL_JSON,
    FrameCodec,
    SseParser,
    cbor_dumps,
    sse_event,
)

data = st.dictionaries(
    st.text(max_size=8),
    st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20) | st.booleans(),
    max_size=5,
)


@given(st.text(min_size=1, max_size=12), data, st.integers(min_value=1, max_value=2**31))
def test_ws_frame_shape_matches_sse(event: str, payload: dict[str, object], seq: int) -> None:
    """The same frame is the same {event, data} on JSON WS, CBOR WS and SSE."""
    frame = Frame(event.replace("\n", " ").replace("\r", " "), payload, seq)
    as_json = json.loads(FrameCodec(SUBPROTOCOL_JSON).encode_frame(frame))
    as_cbor = cbor2.loads(FrameCodec(SUBPROTOCOL_CBOR).encode_frame(frame))
    ((sse_name, sse_data, sse_id),) = SseParser().feed(sse_event(frame, with_id=True))
    assert (as_json, as_json, (as_json["event"], as_json["data"], str(seq))) == (
        frame.to_json(),
        as_cbor,
        (sse_name, json.loads(sse_data), sse_id),
    )


def test_reused_cbor_encoder_gives_cbor2s_bytes_after_a_failure_and_a_large_value() -> None:
    """cbor_dumps equals cbor2.dumps for a frame, after an encode that failed half-way,
    and for a value larger than the buffer it keeps."""
    frame = {"event": "token", "data": {"i": 1, "text": "é" * 3}, "seq": 1}
    big = {"data": "x" * 100_000, "seq": 2}
    with pytest.raises(cbor2.CBOREncodeError):
        cbor_dumps({"a": [1, object()]})
    assert [cbor2.dumps(v) for v in (frame, big, frame)] == [
        cbor_dumps(v) for v in (frame, big, frame)
    ]


def test_sse_parser_handles_split_chunks_and_comments() -> None:
    """Events split across reads and keepalive comments parse into whole events."""
    raw = b": keepalive\n\n" + sse_event(Frame("token", {"t": "a"})) + sse_event(Frame("done", {}))
    parser = SseParser()
    events = []
    for i in range(len(raw)):
        events += parser.feed(raw[i : i + 1])
    assert [("token", '{"t":"a"}', None), ("done", "{}", None)] == events


def test_sse_parser_bounds_an_event_and_a_line() -> None:
    """Data lines that never end their event, or one endless line, are refused at the
    bound instead of piling up (a model server is not trusted to behave)."""
    refused = []
    for raw in (b"data: " + b"x" * 90 + b"\n", b"y" * 150):
        parser = SseParser(max_event_bytes=1000)
        try:
            for _ in range(20):
                parser.feed(raw)
        except PayloadTooLarge as exc:
            refused.append(str(exc))
    ok = SseParser(max_event_bytes=1000).feed((b"data: " + b"x" * 90 + b"\n\n") * 20)
    assert (["SSE event too large", "SSE line too long"], 20) == (refused, len(ok))


def test_binary_frame_on_json_subprotocol_refused() -> None:
    """A binary message on hearthnet-bus.v2 is a WrongFrameType (closes 1003)."""
    with pytest.raises(WrongFrameType):
        FrameCodec(SUBPROTOCOL_JSON).decode(b"{}", binary=True, max_bytes=100)
    with pytest.raises(WrongFrameType):
        FrameCodec(SUBPROTOCOL_CBOR).decode(b"{}", binary=False, max_bytes=100)


@pytest.mark.parametrize("raw", [b"{", b"[1]", b"null", b"\xff"])
def test_malformed_client_frames(raw: bytes) -> None:
    """Not-JSON and not-an-object frames are bad_request."""
    with pytest.raises(BadRequest):
        FrameCodec(SUBPROTOCOL_JSON).decode(raw, binary=False, max_bytes=100)


def test_oversized_frame() -> None:
    """A frame over the limit is payload_too_large."""
    with pytest.raises(PayloadTooLarge):
        FrameCodec(SUBPROTOCOL_JSON).decode(b"{}" + b" " * 100, binary=False, max_bytes=100)
