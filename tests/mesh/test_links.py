"""A peer link's own bookkeeping (spec §7.2) over a socket whose writes fail.

A write failure while reads still wait cannot be produced on demand with a loopback
socket, so :class:`ResetSocket` stands in for the network end: aiohttp's WebSocket
interface, with the errors aiohttp raises when the peer has reset the connection.
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import WSMsgType

from hearthnet.mesh.links import LinkErrors, PeerLink, send_referral
from hearthnet.mesh.protocol import LinkState, PeerInfo
from hearthnet.metrics import MetricsRegistry
from tests.helpers import wait_until


class ResetSocket:
    """A WebSocket whose peer reset the connection: writes fail, reads wait for close()."""

    def __init__(self) -> None:
        self._closed = asyncio.Event()

    async def send_bytes(self, data: bytes) -> None:
        """Fail as aiohttp does on a reset connection."""
        raise ConnectionResetError("Cannot write to closing transport")

    async def receive(self, timeout: float | None = None) -> aiohttp.WSMessage:  # noqa: ASYNC109
        """Nothing arrives; closing ends the wait, as aiohttp's close() does."""
        await self._closed.wait()
        return aiohttp.WSMessage(WSMsgType.CLOSED, None, None)

    async def close(self, *, code: int = 1000, message: bytes = b"") -> bool:
        """Close."""
        self._closed.set()
        return True

    @property
    def closed(self) -> bool:
        """True once closed."""
        return self._closed.is_set()


async def test_a_write_failure_takes_the_link_down() -> None:
    """The writer fails: the socket is closed, the link reports down and queues nothing."""
    downs: list[str] = []
    socket = ResetSocket()
    link = PeerLink(
        PeerInfo("ed25519:peer", "peer", None, "0"),
        socket,
        outbound=True,
        on_frame=lambda link, frame: None,
        on_down=lambda link, reason: downs.append(reason),
    )
    run = asyncio.get_running_loop().create_task(link.run())
    link.send("ping", seq=1, ts=1)
    await wait_until(lambda: bool(downs), what="the link reported down")
    await run
    assert (
        ["write failed: Cannot write to closing transport"],
        LinkState.DOWN,
        True,
        False,
        0,
    ) == (downs, link.state, socket.closed, link.send("ping", seq=2, ts=2), link.queued)


class ResetOnCloseSocket(ResetSocket):
    """A reset connection whose close fails too, as a transport torn down under it can."""

    async def close(self, *, code: int = 1000, message: bytes = b"") -> bool:
        """Close, then fail."""
        await super().close(code=code, message=message)
        raise ConnectionResetError("Cannot write to closing transport")


async def test_failures_on_the_way_down_are_counted() -> None:
    """A failing close after a failed write still takes the link down; each is counted."""
    errors = LinkErrors.register(MetricsRegistry())
    downs: list[str] = []
    link = PeerLink(
        PeerInfo("ed25519:peer", "peer", None, "0"),
        ResetOnCloseSocket(),
        outbound=True,
        on_frame=lambda link, frame: None,
        on_down=lambda link, reason: downs.append(reason),
        errors=errors,
    )
    run = asyncio.get_running_loop().create_task(link.run())
    link.send("ping", seq=1, ts=1)
    await wait_until(lambda: bool(downs), what="the link reported down")
    await run
    assert (
        LinkState.DOWN,
        {
            ("close_after_write_error", "ConnectionResetError"): 1.0,
            ("close", "ConnectionResetError"): 1.0,
        },
    ) == (link.state, errors.counter.values)


async def test_a_referral_to_a_gone_member_is_counted() -> None:
    """A referral whose member already left is counted, and the socket still closed."""
    errors = LinkErrors.register(MetricsRegistry())
    socket = ResetSocket()
    await send_referral(socket, [{"url": "http://127.0.0.1:1"}], errors)
    assert ({("referral", "ConnectionResetError"): 1.0}, True) == (
        errors.counter.values,
        socket.closed,
    )
