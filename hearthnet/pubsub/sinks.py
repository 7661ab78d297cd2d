"""Where subscribers' frames go: the I/O layer's end of a pub/sub session.

Fan-out hands each :class:`~hearthnet.pubsub.subscriber.Subscriber`'s frames to its sink:

- :class:`SocketSink`: a connection whose asyncio protocol is ours (a raw-upgraded
  WebSocket: :class:`~hearthnet.pubsub.wsupgrade.LeanWebSocket` is a socket sink): the
  transport calls its ``pause_writing``/``resume_writing``.
- :class:`AiohttpSink`: a connection aiohttp serves (SSE, a WebSocket upgraded on a reused
  connection): aiohttp's protocol receives pause/resume; the sink reads its
  ``writing_paused`` after a write and awaits the writer's ``drain()`` for the resume.
- :class:`LongPollSink`: frames collected for one response.

Both socket sinks set the transport's marks to :data:`WRITE_HIGH_WATER` and
:data:`WRITE_LOW_WATER`: a subscriber stops taking frames from its channel above the high
mark (its queue, then gap frames or a durable consumer's refill take over; spec §6.5) and
goes on below the low one. Writes go straight into a plain TCP socket while the transport
has nothing queued (:mod:`hearthnet.transport.direct`); a committed batch that goes to
many subscribers as one shared bytes object is sent from a memory file
(:class:`~hearthnet.transport.direct.SharedBytes`, given by fan-out).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol

from aiohttp.abc import AbstractStreamWriter

from hearthnet.pubsub.subscriber import Resumable
from hearthnet.transport.direct import (
    SharedBytes,
    SocketTransport,
    plain_socket_fd,
    write_through,
)

WRITE_HIGH_WATER = 1 << 20  # bytes buffered in a transport before a subscriber is paused
WRITE_LOW_WATER = 256 * 1024  # ... and below which it takes frames again


class Transport(SocketTransport, Protocol):
    """The part of an asyncio transport a sink writes to."""

    def is_closing(self) -> bool:
        """True once closing."""

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """When the protocol's pause_writing and resume_writing are called."""


class WritePaused(Protocol):
    """What an aiohttp protocol tells of its transport's flow control."""

    @property
    def writing_paused(self) -> bool:
        """True between the transport's pause_writing and resume_writing."""


class SocketSink:
    """Frames into a connection whose transport's ``pause_writing``/``resume_writing``
    reach :meth:`pause_writing`/:meth:`resume_writing` (the connection's protocol is a
    socket sink, or forwards them). ``chunked``: an SSE body over HTTP/1.1, whose chunk
    framing is written here."""

    __slots__ = ("chunked", "fd", "paused", "subscriber", "transport")
    stream = True

    def __init__(self, transport: Transport, *, chunked: bool = False) -> None:
        self.transport = transport
        self.chunked = chunked
        self.paused = False
        self.subscriber: Resumable | None = None  # set by the subscriber writing here
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER, low=WRITE_LOW_WATER)
        self.fd = plain_socket_fd(transport)

    def write(self, frames: list[bytes], shared: SharedBytes | None = None) -> bool:
        """One write of every frame; False when the connection is closing. ``shared``:
        bytes other sockets get too, sent from a file when ``frames`` is one of them."""
        transport = self.transport
        if transport.is_closing():
            return False
        if len(frames) == 1:
            data = frames[0]
            if shared is not None and self.fd >= 0 and not self.chunked:
                write_through(transport, self.fd, data, shared.file(data))
                return True
        else:
            data = b"".join(frames)
        if self.chunked:
            data = b"%x\r\n" % len(data) + data + b"\r\n"
        write_through(transport, self.fd, data)
        return True

    def pause_writing(self) -> None:
        """The transport went above its high-water mark."""
        self.paused = True

    def resume_writing(self) -> None:
        """The transport drained below its low-water mark."""
        if self.paused:
            self.paused = False
            if self.subscriber is not None:
                self.subscriber.resume()

    def close(self) -> None:
        """The session ended (nothing is waited for here)."""


class AiohttpSink(SocketSink):
    """Frames into a connection aiohttp serves: its protocol gets the transport's
    pause/resume; after a write that left it paused, one task awaits the writer's
    ``drain()`` (which returns on aiohttp's resume) and resumes the subscriber."""

    __slots__ = ("_drain_task", "_protocol", "_writer")

    def __init__(
        self,
        transport: Transport,
        protocol: WritePaused,
        writer: AbstractStreamWriter,
        *,
        chunked: bool = False,
    ) -> None:
        super().__init__(transport, chunked=chunked)
        self._protocol = protocol
        self._writer = writer
        self._drain_task: asyncio.Task[None] | None = None

    def write(self, frames: list[bytes], shared: SharedBytes | None = None) -> bool:
        """As :meth:`SocketSink.write`; notes a pause aiohttp's protocol received."""
        if not super().write(frames, shared):
            return False
        if self._protocol.writing_paused and self._drain_task is None:
            self.paused = True
            self._drain_task = asyncio.get_running_loop().create_task(self._drained())
        return True

    async def _drained(self) -> None:
        try:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self._writer.drain()  # returns on resume_writing, or when the peer left
        finally:
            self._drain_task = None
        if not self.transport.is_closing():
            self.resume_writing()

    def close(self) -> None:
        """The session ended: stop waiting for a drain."""
        if self._drain_task is not None:
            self._drain_task.cancel()


class LongPollSink:
    """Frames collected for one long-poll response; ``arrived`` wakes the handler."""

    __slots__ = ("arrived", "frames", "subscriber")
    stream = False
    paused = False

    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.arrived = asyncio.Event()
        self.subscriber: Resumable | None = None  # never paused: never resumed

    def write(self, frames: list[bytes], shared: SharedBytes | None = None) -> bool:
        """Collect (never counted here: the response counts what it returns)."""
        self.frames.extend(frames)
        self.arrived.set()
        return False
