"""The front door over loopback sockets (spec §2.5): first bodies, chunked or sized, leave
the unauthenticated count once they are in; a trickled one is cut after the grace."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
import pytest

from hearthnet.node import Node
from hearthnet.transport.server import HttpServer
from tests.conftest import MakeConfig
from tests.helpers import wait_until


@pytest.fixture
async def node(make_config: MakeConfig) -> AsyncIterator[Node]:
    """A node whose first bodies must keep 1 KiB/s after a 0.3 s grace."""
    config = make_config(transport={"body_grace_s": 0.3, "body_min_bytes_per_s": 1024})
    async with Node(config) as node:
        yield node


def pending(server: HttpServer) -> int:
    """Connections the node still counts as unauthenticated."""
    assert server.gate is not None
    return server.gate.table.pending_count


async def exchange(node: Node, *parts: bytes) -> tuple[bytes, int]:
    """Send ``parts`` one write each on a fresh connection: the status line, and the
    pending count once it is in (the connection still open)."""
    reader, writer = await asyncio.open_connection(node.server.host, node.server.port)
    try:
        for part in parts:
            writer.write(part)
            await writer.drain()
        async with asyncio.timeout(5):
            head: bytes = await reader.readuntil(b"\r\n\r\n")
        return head.split(b"\r\n", 1)[0], pending(node.server)
    finally:
        writer.close()


async def test_sized_and_chunked_first_bodies_are_admitted(node: Node) -> None:
    """A body sent in pieces, sized or chunked, is answered and no longer pending."""
    sized = await exchange(
        node,
        b"POST /bus/v1/call HTTP/1.1\r\nHost: n\r\nContent-Type: application/json\r\n"
        b"Content-Length: 4\r\n\r\n{}",
        b"  ",
    )
    chunked = await exchange(
        node,
        b"POST /bus/v1/call HTTP/1.1\r\nHost: n\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n",
        b"0\r\n\r\n",
    )
    assert ((b"HTTP/1.1 400 Bad Request", 0), (b"HTTP/1.1 400 Bad Request", 0)) == (
        sized,
        chunked,
    )


async def stall(node: Node, request: bytes) -> tuple[bytes, float, int]:
    """Send ``request`` and nothing more, once it counts as a pending body: what the node
    sent before it closed, the body_rate refusals, and the pending count after."""
    reader, writer = await asyncio.open_connection(node.server.host, node.server.port)
    try:
        writer.write(request)
        await writer.drain()
        await wait_until(lambda: pending(node.server) == 1, what="the body pending")
        async with asyncio.timeout(5):
            rest = await reader.read()
    finally:
        writer.close()
    refused = node.metrics.counter("hearthnet_connections_refused_total", "", ("limit",))
    return rest, refused.get("body_rate"), pending(node.server)


async def test_a_stalled_first_body_is_cut_after_the_grace(node: Node) -> None:
    """A body that stops after its first bytes is closed once the grace has passed."""
    assert (b"", 1.0, 0) == await stall(
        node,
        b"POST /bus/v1/call HTTP/1.1\r\nHost: n\r\nContent-Type: application/json\r\n"
        b"Content-Length: 5000\r\n\r\n{",
    )


async def test_a_chunk_that_looks_like_the_last_one_does_not_escape_the_body_pace(
    node: Node,
) -> None:
    """A chunk whose data is `0\\r\\n` (bytes `3\\r\\n0\\r\\n\\r\\n`) leaves the body pending,
    so a stalled body after it is still cut by the body pace."""
    assert (b"", 1.0, 0) == await stall(
        node,
        b"POST /bus/v1/call HTTP/1.1\r\nHost: n\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n3\r\n0\r\n\r\n",
    )


async def test_an_endless_head_gets_431_while_the_client_still_sends(node: Node) -> None:
    """A head over the limit is answered 431 in JSON even as more of it keeps coming."""
    reader, writer = await asyncio.open_connection(node.server.host, node.server.port)
    try:
        writer.write(b"GET /health HTTP/1.1\r\nHost: n\r\nX-Pad: " + b"p" * 30_000)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.write(b"p" * 10_000)  # the client has not read the answer yet
        await writer.drain()
        length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        body = await asyncio.wait_for(reader.readexactly(length), 5)
        rest = await asyncio.wait_for(reader.read(), 5)
    finally:
        writer.close()
    assert (b"HTTP/1.1 431 Request Header Fields Too Large", "payload_too_large", b"") == (
        head.split(b"\r\n", 1)[0],
        orjson.loads(body)["error"],
        rest,
    )
