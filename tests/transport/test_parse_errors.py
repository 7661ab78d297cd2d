"""Requests aiohttp's parser refuses are answered in JSON (spec §2.4), whether first on a
connection (where the front door reads the head) or later on a kept-alive one, over
loopback sockets."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from hearthnet.node import Node

CALL = b"POST /bus/v1/call HTTP/1.1\r\nHost: n\r\nContent-Type: application/json\r\n"
# (name, request bytes, expected status, expected code)
MALFORMED = [
    ("nul method", b"\x00\r\nHost: n\r\n\r\n", 400, "bad_request"),
    ("bad method", b"G(T / HTTP/1.1\r\nHost: n\r\n\r\n", 400, "bad_request"),
    ("bad header name", b"GET / HTTP/1.1\r\nHost: n\r\nBad Name: v\r\n\r\n", 400, "bad_request"),
    ("folded line", b"GET / HTTP/1.1\r\nHost: n\r\nX-A: a\r\n b\r\n\r\n", 400, "bad_request"),
    ("negative length", CALL + b"Content-Length: -1\r\n\r\n", 400, "bad_request"),
    (
        "bad chunk size",
        CALL + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n",
        400,
        "bad_request",
    ),
    ("control in value", b"GET / HTTP/1.1\r\nHost: n\r\nX-A: a\x01b\r\n\r\n", 400, "bad_request"),
    (
        "header over 64 KiB",
        b"GET / HTTP/1.1\r\nHost: n\r\nX-A: " + b"a" * 70_000 + b"\r\n\r\n",
        431,
        "payload_too_large",
    ),
    ("brotli", CALL + b"Content-Encoding: br\r\nContent-Length: 2\r\n\r\n{}", 400, "bad_request"),
    ("data after close", b"GET / HTTP/1.0\r\n\r\n\xf22\xbd", 400, "bad_request"),
]
KEEP_ALIVE = b"GET /nothing HTTP/1.1\r\nHost: n\r\n\r\n"


async def read_response(reader: asyncio.StreamReader) -> tuple[int, str, bytes]:
    """One response: status, Content-Type and body (sized, or up to the close)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    fields = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    if "content-length" in fields:
        body = await reader.readexactly(int(fields["content-length"]))
    else:
        body = await reader.read()
    return int(lines[0].split(" ")[1]), fields.get("content-type", ""), body


async def answer(node: Node, request: bytes, *, later: bool) -> tuple[int, str, str]:
    """Send ``request`` (after a good request on the same connection when ``later``):
    the status, content type and error code of its answer."""
    reader, writer = await asyncio.open_connection(node.server.host, node.server.port)
    try:
        async with asyncio.timeout(5):
            if later:
                writer.write(KEEP_ALIVE)
                first = await read_response(reader)
                assert 404 == first[0], first
            writer.write(request)
            status, content_type, body = await read_response(reader)
    finally:
        writer.close()
    code = orjson.loads(body)["error"] if content_type == "application/json" else body.decode()
    return status, content_type, code


@pytest.mark.parametrize("later", [False, True], ids=["first", "kept-alive"])
@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [case[1:] for case in MALFORMED],
    ids=[case[0] for case in MALFORMED],
)
async def test_a_malformed_request_is_answered_in_json(
    node: Node, request_bytes: bytes, status: int, code: str, later: bool
) -> None:
    """A request the HTTP parser refuses gets the spec §2.4 error in JSON, not plain text."""
    assert (status, "application/json", code) == await answer(node, request_bytes, later=later)
