"""Several binary WebSocket messages in one write (spec §11): the framing, and a peer
link's queued frames arriving whole and in order over a real loopback WebSocket."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web
from aiohttp._websocket.helpers import websocket_mask
from aiohttp.test_utils import TestServer

from hearthnet.mesh.wsbatch import BatchWriter, encode_frames
from tests.mesh.conftest import ServeWs

SIZES = (0, 1, 125, 126, 65_535, 65_536, 300)


def unframe(data: bytes) -> list[tuple[bool, bytes]]:
    """RFC 6455 frames of ``data``: (masked, unmasked payload) each, FIN and binary checked."""
    out = []
    i = 0
    while i < len(data):
        assert 0x82 == data[i]
        masked, n = bool(data[i + 1] & 0x80), data[i + 1] & 0x7F
        i += 2
        if n == 126:
            n, i = int.from_bytes(data[i : i + 2], "big"), i + 2
        elif n == 127:
            n, i = int.from_bytes(data[i : i + 8], "big"), i + 8
        key = data[i : i + 4] if masked else b""
        i += len(key)
        body = bytearray(data[i : i + n])
        if masked:
            websocket_mask(key, body)
        out.append((masked, bytes(body)))
        i += n
    return out


@pytest.mark.parametrize("masked", [False, True])
def test_frames_are_encoded_as_rfc6455_binary_frames(masked: bool) -> None:
    """Each message becomes one FIN binary frame with its length form, masked by a client."""
    messages = [bytes([i % 251]) * n for i, n in enumerate(SIZES)]
    assert [(masked, m) for m in messages] == unframe(encode_frames(messages, masked))


@pytest.fixture
async def echo_server(serve_ws: ServeWs) -> tuple[TestServer, list[bytes]]:
    """A WebSocket server that collects the binary messages it reads."""
    got: list[bytes] = []

    async def session(ws: web.WebSocketResponse) -> None:
        async for msg in ws:
            got.append(msg.data)
            await ws.send_bytes(msg.data)  # back, one at a time

    return await serve_ws(session), got


async def test_a_batch_arrives_whole_and_in_order_both_ways(
    echo_server: tuple[TestServer, list[bytes]],
) -> None:
    """A client batch (masked) goes out as one write and reaches the server in order; the
    server's echoes too."""
    server, got = echo_server
    messages = [f"frame {i}".encode() * (1 + i % 7) for i in range(200)]
    async with (
        aiohttp.ClientSession() as http,
        http.ws_connect(f"http://127.0.0.1:{server.port}/") as ws,
    ):
        writer = BatchWriter(ws)
        batching = writer._usable() is not None  # this aiohttp's writer has the parts it uses
        await writer.send(messages)
        echoed = [(await asyncio.wait_for(ws.receive(), 10)).data for _ in range(len(messages))]
    assert (True, messages, messages) == (batching, got, echoed)
