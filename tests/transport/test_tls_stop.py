"""Stopping a server (spec §9): no connection it accepted outlives ``close()``, be it cut
before it was served, mid-handshake or waiting for a peer that never answers the TLS
close; :class:`OpenTransports` ends such connections on asyncio's loop and on uvloop."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import cast

import aiohttp
import pytest
import uvloop
from aiohttp import web

from hearthnet.identity import KeyPair
from hearthnet.mesh.tls import client_context, ensure_certificate, server_context
from hearthnet.metrics import MetricsRegistry
from hearthnet.transport.closing import OpenTransports, TrackedConnector
from hearthnet.transport.server import HttpServer, TransportMetrics
from tests.helpers import closed_by_peer, wait_until

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,  # what `hearthnet node start` runs on
}


def handshaken(host: str, port: int) -> tuple[socket.socket, ssl.SSLSocket]:
    """A TLS connection whose handshake is done and that then reads nothing: a raw
    duplicate of its socket (to see the server's close) and the TLS socket (kept open)."""
    sock = socket.create_connection((host, port))
    raw = sock.dup()
    tls = client_context().wrap_socket(sock)
    return raw, tls


async def test_close_leaves_no_accepted_tls_connection_open(tmp_path: Path) -> None:
    """A connection mid-handshake is closed when ``stop_accepting()`` returns, and one whose
    peer never answers the TLS close when ``close()`` does (none is left to the garbage
    collector)."""
    tls = server_context(*ensure_certificate(tmp_path, KeyPair.generate()))
    server = HttpServer(
        routes=[],
        metrics=TransportMetrics.register(MetricsRegistry()),
        max_body_bytes=1024,
        tls=tls,
    )
    server.close_grace_s = 0.2
    host, port = await server.start("127.0.0.1", 0)
    raw_idle, tls_idle = await asyncio.to_thread(handshaken, host, port)
    mid = socket.create_connection((host, port))
    mid.sendall(b"\x16\x03\x01\x02\x00\x01\x00")  # a ClientHello record, cut short
    assert server.gate is not None
    gate = server.gate
    await wait_until(lambda: gate.table.open_count == 2, what="both connections accepted")
    await server.stop_accepting()
    mid_closed = closed_by_peer(mid)  # the handshake was cut as the server stopped
    await server.close()
    closed = (closed_by_peer(raw_idle), mid_closed)
    for s in (raw_idle, tls_idle, mid):
        s.close()
    assert (True, True) == closed


async def test_a_connection_cut_before_it_was_served_is_closed(tmp_path: Path) -> None:
    """A connection the gate closes (shed, or the node stopping) before the server's task
    for it ever ran is closed and no longer counted."""
    server = HttpServer(
        routes=[], metrics=TransportMetrics.register(MetricsRegistry()), max_body_bytes=1024
    )
    await server.start("127.0.0.1", 0)
    assert server.gate is not None
    gate = server.gate
    ours, theirs = socket.socketpair()
    try:
        served = server.serve_socket(ours, "127.0.0.1")
        gate.close_pending()  # no loop turn in between: its task has not started
        await wait_until(lambda: closed_by_peer(theirs), 1.0, "the connection closed")
        counted = gate.table.open_count
    finally:
        theirs.close()
        await server.close()
    assert (True, 0) == (served, counted)


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_a_tls_connection_closed_twice_is_ended_by_close_all(
    loop_name: str, tmp_path: Path
) -> None:
    """A TLS transport closed twice (as aiohttp closes a connection it lets go) whose peer
    never answers the TLS close is lost within ``close_all``, not at the 30 s shutdown
    timeout: on asyncio's loop its ``abort()`` alone does nothing then."""
    tls = server_context(*ensure_certificate(tmp_path, KeyPair.generate()))

    async def scenario() -> tuple[int, bool, bool]:
        loop = asyncio.get_running_loop()
        opened = OpenTransports()
        made: asyncio.Future[asyncio.Transport] = loop.create_future()
        lost: asyncio.Future[None] = loop.create_future()

        class Tracked(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                opened.add_until(cast(asyncio.Transport, transport), lost)
                made.set_result(cast(asyncio.Transport, transport))

            def connection_lost(self, exc: Exception | None) -> None:
                lost.set_result(None)

        server = await loop.create_server(Tracked, "127.0.0.1", 0, ssl=tls)
        port = server.sockets[0].getsockname()[1]
        raw, peer = await asyncio.to_thread(handshaken, "127.0.0.1", port)
        try:
            transport = await asyncio.wait_for(made, 10)
            transport.close()
            transport.close()
            aborted = await opened.close_all(grace_s=0.1)
            return aborted, lost.done(), closed_by_peer(raw)
        finally:
            raw.close()
            peer.close()
            server.close()
            await server.wait_closed()

    with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
        assert (1, True, True) == runner.run(scenario())


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_the_connector_tracks_its_connections_on_either_loop(
    loop_name: str, tmp_path: Path
) -> None:
    """A dialler's TLS connection is tracked until lost, on uvloop too (whose transports
    are not asyncio.Transport subclasses), and ``close_all`` leaves none."""
    tls = server_context(*ensure_certificate(tmp_path, KeyPair.generate()))

    async def hello(_request: web.Request) -> web.Response:
        return web.Response(text="hello")

    async def scenario() -> tuple[str, int, int]:
        app = web.Application()
        app.router.add_get("/", hello)
        runner = web.AppRunner(app)
        await runner.setup()
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        await web.SockSite(runner, listener, ssl_context=tls).start()
        opened = OpenTransports()
        try:
            connector = TrackedConnector(opened, ssl=client_context())
            async with aiohttp.ClientSession(connector=connector) as http:
                async with http.get(f"https://127.0.0.1:{port}/") as response:
                    text = await response.text()
                tracked = len(opened)
            await opened.close_all(grace_s=1.0)
            return text, tracked, len(opened)
        finally:
            await runner.cleanup()

    with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
        assert ("hello", 1, 0) == runner.run(scenario())
