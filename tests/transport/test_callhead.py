"""Which heads the lean call path takes (spec §2.5, §3.3): one exact shape, everything
else left to the full server; fuzzed against aiohttp's own parser (llhttp)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import HttpRequestParser
from hypothesis import given, settings
from hypothesis import strategies as st

from hearthnet.transport.callhead import CallHeadLimits, plain_call

LIMITS = CallHeadLimits(max_headers=16, max_header_bytes=1024, max_body_bytes=100)
HEAD = (
    b"POST /bus/v1/call HTTP/1.1\r\nHost: n\r\nContent-Type: application/json\r\n"
    b"X-HearthNet-Capability: echo\r\nX-HearthNet-Capability-Version:1.0 \r\n"
    b"X-HearthNet-Signature: ed25519:abc\r\nContent-Length: 12"
)


def test_the_plain_shape_is_taken_with_its_headers() -> None:
    """A plain call's headers are read case-insensitively, values trimmed; close noted."""
    plain = plain_call(HEAD, LIMITS)
    assert plain is not None
    closing = plain_call(HEAD + b"\r\nconnection: Close", LIMITS)
    assert closing is not None
    assert (
        plain.headers["x-hearthnet-capability-version"],
        plain.content_length,
        plain.close,
        closing.close,
    ) == ("1.0", 12, False, True)


@pytest.mark.parametrize(
    "head",
    [
        HEAD.replace(b"POST ", b"post "),
        HEAD.replace(b"HTTP/1.1", b"HTTP/1.0"),
        HEAD.replace(b"/bus/v1/call", b"/bus/v1/call?x=1"),
        HEAD.replace(b"/bus/v1/call", b"/bus/v1/call/"),
        HEAD.replace(b"POST /bus", b"POST  /bus"),
        HEAD.replace(b"Host: n\r\n", b""),
        HEAD + b"\r\nContent-Length: 12",
        HEAD.replace(b"Length: 12", b"Length: +12"),
        HEAD.replace(b"Length: 12", b"Length: 1_2"),
        HEAD.replace(b"Length: 12", b"Length: 101"),
        HEAD.replace(b"Length: 12", b"Length: 99999999999999999999999"),
        HEAD.replace(b"Content-Length: 12", b"Transfer-Encoding: chunked"),
        HEAD + b"\r\nTransfer-Encoding: identity",
        HEAD + b"\r\nContent-Encoding: gzip",
        HEAD + b"\r\nExpect: 100-continue",
        HEAD + b"\r\nUpgrade: websocket",
        HEAD + b"\r\nOrigin: http://evil.example",
        HEAD + b"\r\nAccept: text/event-stream",
        HEAD + b"\r\nConnection: upgrade",
        HEAD + b"\r\nConnection: close\r\nConnection: close",
        HEAD + b"\r\nx-hearthnet-signature: ed25519:def",
        HEAD + b"\r\n folded: continuation",
        HEAD + b"\r\nName : value",
        HEAD + b"\r\nNo-Colon",
        HEAD + b"\r\n: no name",
        HEAD + b"\r\nBad\x01Name: v",
        HEAD + b"\r\nX: a\x00b",
        HEAD + b"\r\nX: a\x7fb",
        HEAD + b"\r\nX: caf\xc3\xa9",
        HEAD + b"\r\nX: a\rb",
        HEAD + b"\r\nX: a\nY: b",
        HEAD + b"".join(b"\r\nX-%d: y" % i for i in range(16)),
        HEAD + b"\r\nX: " + b"y" * 1024,
    ],
)
def test_anything_else_goes_to_the_full_server(head: bytes) -> None:
    """Every other request line, framing, header shape or size is not taken."""
    assert plain_call(head, LIMITS) is None


def _llhttp(loop: asyncio.AbstractEventLoop, head: bytes) -> tuple[dict[str, str], str] | None:
    """What aiohttp's parser makes of ``head`` (headers, Content-Length), or None."""
    parser = HttpRequestParser(BaseProtocol(loop), loop, 2**16, max_line_size=8190)
    try:
        messages, _, _ = parser.feed_data(head + b"\r\n\r\n")
    except HttpProcessingError:
        return None
    if not messages:
        return None
    message = messages[0][0]
    return {k.lower(): v for k, v in message.headers.items()}, message.headers.get(
        "Content-Length", "0"
    )


_SPLICES = st.sampled_from(
    [b"\r\n", b"\n", b"\r", b" ", b"\t", b":", b"\x00", b"\x7f", b"\xff", b"\r\n ", b"0"]
)


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop for the parser's protocol object (nothing runs on it)."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, len(HEAD)), st.integers(0, 3), _SPLICES | st.binary(max_size=3)),
        min_size=1,
        max_size=3,
    )
)
def test_what_is_taken_llhttp_reads_the_same(
    loop: asyncio.AbstractEventLoop, edits: list[tuple[int, int, bytes]]
) -> None:
    """A mutated head taken here is read alike by aiohttp's parser (headers, length)."""
    head = HEAD
    for at, cut, insert in edits:
        head = head[:at] + insert + head[at + cut :]
    plain = plain_call(head, LIMITS)
    if plain is None:
        return
    theirs = _llhttp(loop, head)
    assert theirs is not None
    ours = {k.lower(): v for k, v in plain.headers.items()}
    assert (ours, str(plain.content_length)) == (theirs[0], str(int(theirs[1])))
