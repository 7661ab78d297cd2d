"""WebSocket frames split out of a byte stream (spec §11's batched peer-link reads): any
chunking of a stream gives the same messages, and aiohttp's own reader, fed the same
chunks, gives the same messages and the same close code on a protocol error."""

from __future__ import annotations

import asyncio
import itertools
import struct

from aiohttp._websocket.helpers import websocket_mask
from aiohttp._websocket.models import WebSocketError, WSMsgType
from aiohttp._websocket.reader_py import WebSocketDataQueue, WebSocketReader
from aiohttp.base_protocol import BaseProtocol
from hypothesis import given, settings
from hypothesis import strategies as st

from hearthnet.mesh.wsframes import Control, Event, Failure, FrameSplitter, unmask_pure
from hearthnet.transport.websocket import (
    OP_BINARY,
    OP_CLOSE,
    OP_CONTINUATION,
    OP_PING,
    OP_PONG,
    OP_TEXT,
)

# a message limit small enough that generated streams cross it now and then
SMALL_LIMIT = 300
# what a test compares: a binary payload, ("control", opcode, data, code, reason) or
# ("failure", close code)
Seen = bytes | tuple[object, ...]


def frame(
    payload: bytes,
    opcode: int = OP_BINARY,
    *,
    fin: bool = True,
    rsv: int = 0,
    key: bytes | None = None,
    form: int = 0,
) -> bytes:
    """One RFC 6455 frame; ``form`` 16 or 64 forces that length form (0: the shortest)."""
    n = len(payload)
    first = (0x80 if fin else 0) | rsv << 4 | opcode
    mask = 0x80 if key is not None else 0
    if form == 0 and n < 126:
        head = bytes((first, mask | n))
    elif form in (0, 16) and n < 65536:
        head = struct.pack("!BBH", first, mask | 126, n)
    else:
        head = struct.pack("!BBQ", first, mask | 127, n)
    if key is None:
        return head + payload
    body = bytearray(payload)
    websocket_mask(key, body)
    return head + key + bytes(body)


def ours(chunks: list[bytes], limit: int = 0) -> list[Seen]:
    """What :class:`FrameSplitter` returns for ``chunks``, in a comparable form."""
    splitter = FrameSplitter(limit, unmask=websocket_mask)
    events: list[Event] = []
    for chunk in chunks:
        events += splitter.feed(chunk)
    return [comparable(e) for e in events]


def comparable(event: Event) -> Seen:
    """An event in the form aiohttp's messages are brought to."""
    if isinstance(event, Failure):
        return ("failure", event.code)
    if isinstance(event, Control):
        data = b"" if event.opcode == OP_CLOSE else event.data
        return ("control", event.opcode, data, event.code, event.reason)
    return event


def aiohttps(chunks: list[bytes], limit: int = 0) -> list[Seen]:
    """What aiohttp's (pure Python) ``WebSocketReader`` makes of the same ``chunks``."""
    loop = asyncio.new_event_loop()
    try:
        queue = WebSocketDataQueue(BaseProtocol(loop), 2**30, loop=loop)
        reader = WebSocketReader(queue, limit, compress=False, decode_text=True)
        for chunk in chunks:
            reader.feed_data(chunk)
    finally:
        loop.close()
    seen: list[Seen] = []
    for msg, _size in queue._buffer:
        if msg.type is WSMsgType.BINARY:
            seen.append(msg.data)
        elif msg.type is WSMsgType.TEXT:
            seen.append(("control", OP_TEXT, msg.data.encode(), 0, ""))
        elif msg.type is WSMsgType.CLOSE:
            seen.append(("control", OP_CLOSE, b"", msg.data, msg.extra))
        else:
            seen.append(("control", int(msg.type), msg.data, 0, ""))
    error = queue.exception()
    if isinstance(error, WebSocketError):
        seen.append(("failure", error.code))
    return seen


def cut(stream: bytes, points: list[int]) -> list[bytes]:
    """``stream`` cut at ``points`` (positions within it, any order, repeats allowed)."""
    edges = sorted({0, len(stream), *(p % (len(stream) + 1) for p in points)})
    return [stream[a:b] for a, b in itertools.pairwise(edges)]


KEYS = st.one_of(st.none(), st.binary(min_size=4, max_size=4))
PAYLOADS = st.one_of(
    st.binary(max_size=40),
    st.binary(min_size=120, max_size=140),
    st.binary(max_size=400),
    st.sampled_from([SMALL_LIMIT - 1, SMALL_LIMIT, SMALL_LIMIT + 1]).map(bytes),
)


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """A frame a peer could send: mostly well formed, some of every kind of wrong."""
    kind = draw(st.sampled_from(["binary"] * 6 + ["text", "frag", "ping", "close", "odd"]))
    key = draw(KEYS)
    form = draw(st.sampled_from([0, 0, 0, 16, 64]))
    if kind == "binary":
        return frame(draw(PAYLOADS), key=key, form=form)
    if kind == "text":
        text = draw(st.one_of(st.text(max_size=30).map(str.encode), st.binary(max_size=8)))
        return frame(text, OP_TEXT, key=key, form=form)
    if kind == "frag":  # a message in parts, sometimes broken off or interleaved
        parts = draw(st.lists(PAYLOADS, min_size=1, max_size=3))
        first = draw(st.sampled_from([OP_BINARY, OP_TEXT, OP_CONTINUATION]))
        out = [frame(parts[0], first, fin=False, key=key)]
        out += [frame(p, OP_CONTINUATION, fin=False, key=key) for p in parts[1:]]
        if draw(st.booleans()):
            out.append(frame(b"", OP_PING, key=key))
        end = draw(st.sampled_from([OP_CONTINUATION, OP_CONTINUATION, OP_BINARY]))
        out.append(frame(draw(st.binary(max_size=20)), end, key=key))
        return b"".join(out)
    if kind == "ping":
        size = draw(st.sampled_from([0, 5, 125, 126]))
        return frame(bytes(size), draw(st.sampled_from([OP_PING, OP_PONG])), key=key)
    if kind == "close":
        code = draw(st.sampled_from([None, 1000, 1001, 1004, 1005, 2999, 3000, 4999]))
        reason = draw(st.sampled_from([b"", b"bye", b"\xff\xfe"]))
        body = b"" if code is None else struct.pack("!H", code) + reason
        if draw(st.booleans()) and code is None:
            body = b"\x03"  # one byte: no whole code
        return frame(body, OP_CLOSE, key=key)
    opcode = draw(st.sampled_from([OP_BINARY, 0x3, 0xB, OP_PING]))  # reserved opcodes
    rsv = draw(st.sampled_from([0, 1, 2, 4]))
    return frame(draw(st.binary(max_size=10)), opcode, fin=draw(st.booleans()), rsv=rsv)


STREAMS = st.lists(frames(), min_size=1, max_size=8).map(b"".join)
CUTS = st.lists(st.integers(min_value=0, max_value=10_000), max_size=12)


@settings(max_examples=100, deadline=None)
@given(stream=STREAMS, points=CUTS)
def test_any_chunking_gives_the_messages_of_the_whole_stream(
    stream: bytes, points: list[int]
) -> None:
    """The stream fed in arbitrary pieces gives what it gives fed whole."""
    assert ours([stream]) == ours(cut(stream, points))


@settings(max_examples=200, deadline=None)
@given(stream=STREAMS, points=CUTS, limited=st.booleans())
def test_messages_and_errors_are_aiohttps(stream: bytes, points: list[int], limited: bool) -> None:
    """Messages, control frames and the close code of the first protocol error are what
    aiohttp's reader makes of the same chunks, with and without a message limit."""
    chunks = cut(stream, points)
    limit = SMALL_LIMIT if limited else 0
    assert aiohttps(chunks, limit) == ours(chunks, limit)


def test_a_message_at_the_limit_is_refused_before_its_payload_arrives() -> None:
    """A data frame of the limit's size fails on its header alone, as aiohttp's does."""
    splitter = FrameSplitter(1000)
    assert [Failure(1009, "message of 1000 bytes over the limit")] == splitter.feed(
        frame(bytes(1000))[:4]
    )
    assert [] == splitter.feed(b"\x82\x00")  # nothing is read after a failure


def test_whole_binary_frames_come_out_as_their_payloads() -> None:
    """Binary messages are plain bytes, masked ones unmasked; ``mixed`` stays False."""
    key = b"\x01\x02\x03\x04"
    splitter = FrameSplitter(0)
    got = splitter.feed(frame(b"one") + frame(b"two", key=key) + frame(b"thr"))
    assert ([b"one", b"two", b"thr"], False) == (got, splitter.mixed)
    last = frame(b"three")
    assert ([], [b"three"]) == (splitter.feed(last[:3]), splitter.feed(last[3:]))


def test_control_frames_between_fragments_keep_their_order() -> None:
    """A ping inside a fragmented message comes out before the message it interrupted."""
    stream = (
        frame(b"ab", fin=False)
        + frame(b"hi", OP_PING)
        + frame(b"cd", OP_CONTINUATION)
        + frame(struct.pack("!H", 1000) + b"done", OP_CLOSE)
    )
    splitter = FrameSplitter(0)
    assert [
        Control(OP_PING, b"hi"),
        b"abcd",
        Control(OP_CLOSE, struct.pack("!H", 1000) + b"done", 1000, "done"),
    ] == splitter.feed(stream)
    assert splitter.mixed


def test_a_frame_split_in_many_reads_is_joined_once() -> None:
    """A large frame fed a byte at a time is returned whole, once its last byte is in."""
    payload = bytes(range(256)) * 300
    data = frame(payload, key=b"abcd")
    splitter = FrameSplitter(0)
    got = [e for i in range(len(data)) for e in splitter.feed(data[i : i + 1])]
    assert [payload] == got


def test_pure_unmasking_matches_aiohttps() -> None:
    """The plain-Python unmasking gives what aiohttp's compiled one gives."""
    for n in (0, 1, 3, 4, 5, 126, 1000):
        a, b = bytearray(range(n % 256)) * (1 + n // 256), bytearray()
        b[:] = a
        websocket_mask(b"\x9a\x01\xff\x10", a)
        unmask_pure(b"\x9a\x01\xff\x10", b)
        assert a == b
