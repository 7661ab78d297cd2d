"""RFC 6455 server side without sockets: handshake, frame reader, limits."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hearthnet.transport.keepalive import CLOSE_TOO_BIG
from hearthnet.transport.websocket import (
    CLOSE_INVALID_DATA,
    CLOSE_NO_STATUS,
    CLOSE_PROTOCOL_ERROR,
    OP_BINARY,
    OP_CLOSE,
    OP_CONTINUATION,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    CloseReceived,
    FrameReader,
    Message,
    Ping,
    Pong,
    WsProtocolError,
    accept_key,
    parse_head,
    unmask,
    upgrade_response,
)

HANDSHAKE = (
    b"GET /pubsub/v1/subscribe HTTP/1.1\r\nHost: x\r\nUpgrade: WebSocket\r\n"
    b"Connection: keep-alive, Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
    b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: a\r\nSec-WebSocket-Protocol: b"
)


def client_frame(
    payload: bytes, opcode: int = OP_TEXT, *, fin: bool = True, masked: bool = True
) -> bytes:
    """A client frame as a browser would send it (masked with a random key)."""
    n = len(payload)
    first = (0x80 if fin else 0) | opcode
    mask_bit = 0x80 if masked else 0
    if n < 126:
        head = bytes((first, mask_bit | n))
    elif n < 65536:
        head = struct.pack("!BBH", first, mask_bit | 126, n)
    else:
        head = struct.pack("!BBQ", first, mask_bit | 127, n)
    if not masked:
        return head + payload
    key = os.urandom(4)
    return head + key + unmask(payload, key)  # masking is its own inverse


def test_accept_key_is_the_rfc_example() -> None:
    """RFC 6455 §1.3: the sample nonce's accept value."""
    assert "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" == accept_key("dGhlIHNhbXBsZSBub25jZQ==")


def test_parse_head_lowercases_names_and_joins_repeats() -> None:
    """Header names are case-insensitive; repeated headers are one comma list."""
    head = parse_head(HANDSHAKE)
    assert head is not None
    assert ("GET", "/pubsub/v1/subscribe", "", "a, b") == (
        head.method,
        head.path,
        head.query,
        head.headers["sec-websocket-protocol"],
    )


@pytest.mark.parametrize(
    "raw",
    [b"GET / HTTP/1.0", b"GET /x HTTP/1.1\r\nno colon", b"GET /x HTTP/1.1\r\n bad: fold", b"X"],
)
def test_parse_head_refuses_malformed_heads(raw: bytes) -> None:
    """Not HTTP/1.1, a header without a colon, folded headers."""
    assert parse_head(raw) is None


def test_upgrade_response_accepts_a_valid_handshake() -> None:
    """101 with the accept key and the chosen subprotocol."""
    head = parse_head(HANDSHAKE)
    assert head is not None
    response = upgrade_response(head, "a")
    assert response is not None
    assert response.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
    assert b"Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" in response
    assert response.endswith(b"Sec-WebSocket-Protocol: a\r\n\r\n")


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (b"Upgrade: WebSocket", b"Upgrade: h2c"),
        (b"keep-alive, Upgrade", b"keep-alive"),
        (b"Version: 13", b"Version: 8"),
        (b"dGhlIHNhbXBsZSBub25jZQ==", b"c2hvcnQ="),
        (b"dGhlIHNhbXBsZSBub25jZQ==", b"not base64!"),
        (b"GET /", b"POST /"),
    ],
)
def test_upgrade_response_declines_what_is_not_a_handshake(old: bytes, new: bytes) -> None:
    """Anything else goes to the ordinary HTTP server to be answered there."""
    head = parse_head(HANDSHAKE.replace(old, new))
    assert head is not None
    assert upgrade_response(head, None) is None


def test_reader_unmasks_and_answers_control_frames_between_fragments() -> None:
    """A fragmented text message with a ping in the middle, then pong and close."""
    reader = FrameReader(1024)
    data = (
        client_frame(b'{"a":', OP_TEXT, fin=False)
        + client_frame(b"hi", OP_PING)
        + client_frame(b"1}", OP_CONTINUATION)
        + client_frame(b"\x01\x02", OP_BINARY)
        + client_frame(b"", OP_PONG)
        + client_frame(struct.pack("!H", 4000) + b"bye", OP_CLOSE)
    )
    assert [
        Ping(b"hi"),
        Message(b'{"a":1}', binary=False),
        Message(b"\x01\x02", binary=True),
        Pong(b""),
        CloseReceived(4000, "bye"),
    ] == reader.feed(data)


@given(st.binary(max_size=70_000), st.integers(1, 9000))
def test_reader_gives_the_same_messages_however_the_bytes_are_split(
    payload: bytes, chunk: int
) -> None:
    """Any payload size (7-bit, 16-bit, 64-bit lengths), fed in any chunk size."""
    reader = FrameReader(100_000)
    data = client_frame(payload, OP_BINARY) + client_frame(b"end")
    events = []
    for i in range(0, len(data), chunk):
        events += reader.feed(data[i : i + chunk])
    assert [Message(payload, binary=True), Message(b"end", binary=False)] == events


def test_a_close_without_code_is_1005() -> None:
    """An empty close payload means no status."""
    assert [CloseReceived(CLOSE_NO_STATUS, "")] == FrameReader(10).feed(client_frame(b"", OP_CLOSE))


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (client_frame(b"x", masked=False), CLOSE_PROTOCOL_ERROR),
        (bytes((0xC1, 0x80)) + b"\0\0\0\0", CLOSE_PROTOCOL_ERROR),  # RSV1 (no extensions)
        (client_frame(b"x", 0x3), CLOSE_PROTOCOL_ERROR),  # reserved opcode
        (client_frame(b"x", OP_CONTINUATION), CLOSE_PROTOCOL_ERROR),
        (client_frame(b"a", fin=False) + client_frame(b"b"), CLOSE_PROTOCOL_ERROR),
        (client_frame(b"p", OP_PING, fin=False), CLOSE_PROTOCOL_ERROR),
        (client_frame(b"p" * 126, OP_PING), CLOSE_PROTOCOL_ERROR),
        (client_frame(b"\x03", OP_CLOSE), CLOSE_PROTOCOL_ERROR),
        (client_frame(struct.pack("!H", 1005), OP_CLOSE), CLOSE_PROTOCOL_ERROR),
        (client_frame(struct.pack("!H", 1000) + b"\xff", OP_CLOSE), CLOSE_INVALID_DATA),
        (client_frame(b'{"type":"ping","x":"\xff"}'), CLOSE_INVALID_DATA),
        (
            client_frame(b"caf\xc3", fin=False) + client_frame(b"", OP_CONTINUATION),
            CLOSE_INVALID_DATA,
        ),
    ],
)
def test_protocol_errors_carry_their_close_code(data: bytes, code: int) -> None:
    """Everything a client must not send is refused with the right close code."""
    with pytest.raises(WsProtocolError) as caught:
        FrameReader(100).feed(data)
    assert code == caught.value.code


def test_utf8_is_checked_on_whole_text_messages_only() -> None:
    """A character split across fragments is fine; binary messages are not text."""
    data = (
        client_frame("café".encode()[:4], fin=False)
        + client_frame("café".encode()[4:], OP_CONTINUATION)
        + client_frame(b"\xff\xfe", OP_BINARY)
    )
    assert [Message("café".encode(), False), Message(b"\xff\xfe", True)] == FrameReader(100).feed(
        data
    )


def test_oversized_messages_are_refused_from_the_header() -> None:
    """1009 as soon as a frame header (or the fragments so far) says it is too big: the
    reader never buffers the payload."""
    header_only = client_frame(b"x" * 2000)[:8]
    with pytest.raises(WsProtocolError) as one:
        FrameReader(1000).feed(header_only)
    reader = FrameReader(1000)
    reader.feed(client_frame(b"x" * 600, fin=False))
    with pytest.raises(WsProtocolError) as fragments:
        reader.feed(client_frame(b"x" * 600, OP_CONTINUATION)[:8])
    assert (CLOSE_TOO_BIG, CLOSE_TOO_BIG) == (one.value.code, fragments.value.code)
