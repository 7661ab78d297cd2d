"""Connections a node must see closed before it stops (spec §9).

Closing a TLS transport starts the TLS close (close_notify both ways): its socket stays
open until the peer answers, up to asyncio's 30 s shutdown timeout. A node that stopped
without waiting would leave such sockets to the garbage collector ("unclosed transport")
or, once its event loop is gone, open for good. :class:`OpenTransports` tracks each
connection from its ``connection_made`` to its ``connection_lost`` and, on stop, waits a
bounded time for the closes in flight and aborts what is left.

asyncio's TLS transport, closed a second time (aiohttp closes a connection it lets go
twice), lets go of its TLS protocol: its ``abort()`` then does nothing and its socket waits
for the peer's TLS close up to the 30 s shutdown timeout. An aborted transport's socket is
therefore shut down too: it reads end of file, and the transport under TLS closes (the TLS
protocol answers end of file in its shutdown by closing it). uvloop's TLS transport keeps
its protocol, and its ``abort()`` closes the socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from asyncio.trsock import TransportSocket
from collections.abc import Iterator
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ClientRequest
from aiohttp.tracing import Trace

# spec §9: how long a stopping node waits for TLS closes in flight before aborting them
CLOSE_GRACE_S = 1.0
# an aborted socket closes a loop turn or two later; this only bounds a misbehaving loop
_ABORT_WAIT_S = 1.0


class OpenTransports:
    """Transports whose connection is not lost yet, and a bounded wait for them to go."""

    def __init__(self) -> None:
        # each transport, with its socket where that is asyncio's (uvloop's needs none)
        self._open: dict[asyncio.Transport, TransportSocket | None] = {}
        self._empty: asyncio.Event | None = None

    def __len__(self) -> int:
        return len(self._open)

    def __iter__(self) -> Iterator[asyncio.Transport]:
        return iter(list(self._open))

    def add(self, transport: asyncio.Transport) -> None:
        """``transport``'s connection is made."""
        sock = transport.get_extra_info("socket")  # asked now: a TLS transport closed twice
        self._open[transport] = sock if isinstance(sock, TransportSocket) else None

    def lost(self, transport: asyncio.Transport) -> None:
        """``transport``'s connection is lost (its socket is closed)."""
        self._open.pop(transport, None)
        if not self._open and self._empty is not None:
            self._empty.set()

    def add_until(self, transport: asyncio.Transport, lost: asyncio.Future[None]) -> None:
        """``transport``'s connection is made; it is lost when ``lost`` completes."""

        def forget(future: asyncio.Future[None]) -> None:
            if not future.cancelled():
                future.exception()  # a reset is how many connections end; not reported
            self.lost(transport)

        self.add(transport)
        lost.add_done_callback(forget)

    async def close_all(self, grace_s: float = CLOSE_GRACE_S) -> int:
        """Close every transport, wait up to ``grace_s`` for their connections to be lost
        (TLS closes finishing), then abort the rest; returns how many were aborted."""
        for transport in list(self._open):
            if not transport.is_closing():
                transport.close()
        if await self._wait(grace_s):
            return 0
        late = list(self._open.items())
        for transport, sock in late:
            transport.abort()
            # see the module's docstring; a socket closed already (fileno -1, so never
            # another connection's) or not connected raises OSError
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        await self._wait(_ABORT_WAIT_S)
        # a transport whose protocol never hears connection_lost is not waited for again
        self._open.clear()
        return len(late)

    async def _wait(self, timeout_s: float) -> bool:
        if not self._open:
            return True
        self._empty = asyncio.Event()
        try:
            async with asyncio.timeout(timeout_s):
                await self._empty.wait()
        except TimeoutError:
            return False
        finally:
            self._empty = None
        return True


class TrackedConnector(aiohttp.TCPConnector):
    """aiohttp's TCP connector, each connection it opens in ``connections`` until lost
    (aiohttp's own close leaves a TLS close of a connection it already let go running)."""

    def __init__(self, connections: OpenTransports, **options: Any) -> None:
        super().__init__(**options)
        self.connections = connections

    async def _create_connection(
        self,
        req: ClientRequest,
        traces: list[Trace],
        timeout: aiohttp.ClientTimeout,  # noqa: ASYNC109 (aiohttp's own signature)
    ) -> ResponseHandler:
        protocol = await super()._create_connection(req, traces, timeout)
        transport, lost = protocol.transport, protocol.closed
        # uvloop's transports are not asyncio.Transport subclasses; they behave as one
        if transport is not None and lost is not None:
            self.connections.add_until(transport, lost)
        return protocol
