"""Stopping a server (spec §9): no connection it accepted outlives ``close()``, be it cut
before it was served, mid-handshake or waiting for a peer that never answers the TLS
close."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

from hearthnet.identity import KeyPair
from hearthnet.mesh.tls import client_context, ensure_certificate, server_context
from hearthnet.metrics import MetricsRegistry
from hearthnet.transport.server import HttpServer, TransportMetrics
from tests.helpers import closed_by_peer, wait_until


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
