"""Fan-out writes straight into the socket: same bytes, same order, never under TLS; bytes
shared by many sockets are sent from one memory file.

Each case runs on the standard asyncio loop and on uvloop (what ``hearthnet node start``
uses), over real loopback sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import uvloop

from hearthnet.identity import KeyPair
from hearthnet.mesh.tls import client_context, ensure_certificate, server_context
from hearthnet.transport.direct import SharedBytes, plain_socket_fd, write_through

LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def run(loop_name: str, scenario: Callable[[], Awaitable[None]]) -> None:
    with asyncio.Runner(loop_factory=LOOPS[loop_name]) as runner:
        runner.run(asyncio.wait_for(scenario(), 30))


class Sink(asyncio.Protocol):
    """The server side of a connection: keeps its transport, reads nothing itself."""

    def __init__(self, ready: asyncio.Future[Any]) -> None:
        self.ready = ready
        self.lost: asyncio.Future[Exception | None] = ready.get_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.ready.set_result(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)


@contextlib.asynccontextmanager
async def serve(
    ssl_ctx: ssl.SSLContext | None = None,
) -> AsyncIterator[tuple[asyncio.Future[Any], Sink, int]]:
    """A server for one connection; the connection and the server are closed on the way out,
    also when the test failed (uvloop cannot close a loop that still has them)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[Any] = loop.create_future()
    sink = Sink(ready)
    server = await loop.create_server(lambda: sink, "127.0.0.1", 0, ssl=ssl_ctx)
    try:
        yield ready, sink, server.sockets[0].getsockname()[1]
    finally:
        if ready.done():
            ready.result().abort()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_writes_past_a_full_socket_arrive_whole_and_in_order(loop_name: str) -> None:
    """More than the socket takes: the rest is queued in the transport, and what is written
    next goes behind it even when the socket has room again; every byte arrives in order."""

    async def scenario() -> None:
        async with serve() as (ready, _, port):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
                transport = await ready
                fd = plain_socket_fd(transport)
                assert fd >= 0
                first = os.urandom(16 * 1024 * 1024)  # more than loopback buffers hold
                second = os.urandom(100_000)
                write_through(transport, fd, first)
                assert transport.get_write_buffer_size() > 0  # the socket took only part
                # Make room in the socket without letting the loop run (the transport
                # cannot send its queue meanwhile): a write that skipped the queue would
                # land first.
                received = bytearray(client.recv(4 * 1024 * 1024))
                write_through(transport, fd, second)
                client.setblocking(False)
                while len(received) < len(first) + len(second):
                    try:
                        chunk = client.recv(4 * 1024 * 1024)
                    except BlockingIOError:
                        await asyncio.sleep(0)  # the loop sends the transport's queue
                        continue
                    assert chunk, "connection closed early"
                    received += chunk
                assert first + second == bytes(received)
                assert 0 == transport.get_write_buffer_size()
                write_through(transport, fd, b"tail")  # empty buffer: straight to the socket
                client.settimeout(5)
                assert b"tail" == client.recv(4)

    run(loop_name, scenario)


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_a_write_to_a_reset_connection_is_reported_by_the_transport(loop_name: str) -> None:
    """The peer is gone: no exception escapes, and the transport closes as it would."""

    async def scenario() -> None:
        async with serve() as (ready, sink, port):
            client = socket.create_connection(("127.0.0.1", port), timeout=5)
            transport = await ready
            fd = plain_socket_fd(transport)
            # An abortive close: the server's next send fails with ECONNRESET or EPIPE.
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            client.close()
            for _ in range(200):
                write_through(transport, fd, b"x" * 65536)
                if sink.lost.done() or transport.is_closing():
                    break
                await asyncio.sleep(0.01)  # the reset is on its way over loopback
            await asyncio.wait_for(sink.lost, 5)
            assert transport.is_closing()

    run(loop_name, scenario)


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_tls_transports_are_never_written_around(loop_name: str, tmp_path: Path) -> None:
    """Under TLS the socket carries ciphertext: no descriptor, every write goes through the
    transport, and the reader gets the plaintext."""
    cert, key = ensure_certificate(tmp_path, KeyPair.generate())

    async def scenario() -> None:
        async with serve(server_context(cert, key)) as (ready, _, port):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context())
            try:
                transport = await ready
                fd = plain_socket_fd(transport)
                assert -1 == fd
                write_through(transport, fd, b"over tls")
                assert b"over tls" == await reader.readexactly(8)
            finally:
                writer.close()

    run(loop_name, scenario)


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_shared_bytes_have_a_file_only_while_offered_large_and_asked_for_enough() -> None:
    """Offered large bytes get one file with their content from the third socket that
    asks (the same object only); small or unoffered bytes get none; close closes the files
    and forgets the bytes."""
    shared = SharedBytes(min_bytes=1024, min_uses=3)
    big = os.urandom(100_000)
    equal = bytes(bytearray(big))  # same content, another object
    small = b"s" * 100
    shared.offer(big)
    shared.offer(small)
    first = [shared.file(big), shared.file(big)]
    fd = shared.file(big)
    content = os.pread(fd, len(big) + 1, 0)
    again = shared.file(big)
    others = (shared.file(equal), shared.file(small), shared.file(b"never offered"))
    shared.close()
    assert ([-1, -1], True, big, fd, (-1, -1, -1), False, -1, False) == (
        first,
        fd >= 0,
        content,
        again,
        others,
        _open(fd),
        shared.file(big),
        bool(shared),
    )


@pytest.mark.parametrize("loop_name", sorted(LOOPS))
def test_shared_bytes_sent_from_a_file_arrive_whole_and_in_order(loop_name: str) -> None:
    """Sent from a file, past a full socket: the rest is queued in the transport, what is
    written next goes behind it, and closing the file early loses nothing."""

    async def scenario() -> None:
        async with serve() as (ready, _, port):
            with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
                transport = await ready
                fd = plain_socket_fd(transport)
                shared = SharedBytes(min_uses=1)
                first = os.urandom(16 * 1024 * 1024)  # more than loopback buffers hold
                second = os.urandom(100_000)
                shared.offer(first)
                shared.offer(second)
                write_through(transport, fd, first, shared.file(first))
                assert transport.get_write_buffer_size() > 0  # the socket took only part
                received = bytearray(client.recv(4 * 1024 * 1024))
                write_through(transport, fd, second, shared.file(second))
                shared.close()  # the socket still holds pages of the files
                client.setblocking(False)
                while len(received) < len(first) + len(second):
                    try:
                        chunk = client.recv(4 * 1024 * 1024)
                    except BlockingIOError:
                        await asyncio.sleep(0)
                        continue
                    assert chunk, "connection closed early"
                    received += chunk
                assert first + second == bytes(received)

    run(loop_name, scenario)
