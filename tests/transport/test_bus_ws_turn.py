"""The frames a bus WebSocket sends in one event-loop turn leave in one write (spec §11)."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import WSMsgType, web
from aiohttp.test_utils import TestServer

from hearthnet.transport.bus_ws import TurnWriter

BURST = [bytes([i % 251]) * (0, 1, 125, 126, 300, 1000)[i % 6] for i in range(120)]
LARGE = [b"a" * 65_535, b"b" * 65_536, b"c" * 7]  # 16- and 64-bit lengths, over the flush mark


async def test_a_burst_in_one_turn_is_one_write_and_arrives_in_order() -> None:
    """120 frames sent in one turn: one transport write, received whole and in order."""
    writes: list[int] = []

    async def handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(compress=False)
        await ws.prepare(request)
        out = TurnWriter(ws, WSMsgType.BINARY)
        assert ws._writer is not None
        transport: Any = ws._writer.transport
        write = transport.write

        def counted(data: bytes) -> None:
            writes.append(len(data))
            write(data)

        transport.write = counted  # asyncio's transport: its writes counted
        for data in BURST:
            await out.send(data)
        await asyncio.sleep(0)  # the turn ends: the burst is written
        burst_writes = len(writes)
        for data in LARGE:
            await out.send(data)
        out.flush()
        await ws.close()
        writes[:] = [burst_writes]
        return ws

    app = web.Application()
    app.router.add_get("/", handler)
    got = []
    async with (
        TestServer(app, host="127.0.0.1") as server,
        aiohttp.ClientSession() as http,
        http.ws_connect(f"http://127.0.0.1:{server.port}/") as ws,
        asyncio.timeout(10),
    ):
        async for msg in ws:
            assert WSMsgType.BINARY == msg.type
            got.append(msg.data)
    assert (BURST + LARGE, [1]) == (got, writes)
