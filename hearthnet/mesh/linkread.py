"""A peer link's reads handled in batches (spec §11: a relay forwards a frame for ≤ 5 µs of
CPU): aiohttp glue around :class:`~hearthnet.mesh.wsframes.FrameSplitter`.

aiohttp parses each WebSocket frame into a ``WSMessage``, queues it and wakes the task
awaiting ``receive()`` once per message: a future, a task step and a queue round trip per
frame. :class:`LinkReader` takes the place of aiohttp's frame parser on the connection's
protocol (the object aiohttp hands every socket read to, over TLS after decryption), so
each read is split in place and, once the link is up, every binary message of that read
goes to the link in one call, from the read itself.

Everything else stays aiohttp's. Before the link is up (the handshake, a referral) and
for every frame that is not a binary message after it (ping, pong, close) and for the
end of the stream or a protocol error, the reader puts on aiohttp's own message queue
what aiohttp's parser would have put there, so ``receive()``, the automatic pong, the
closing handshake and close codes work as they always did. The private parts this uses
are checked when the reader is installed; on an aiohttp without them (or with
compression negotiated) :func:`install` leaves aiohttp's parser in place and the link
reads with ``receive()`` as before.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import WSMessage, WSMsgType
from aiohttp._websocket.helpers import websocket_mask
from aiohttp._websocket.models import WebSocketError
from aiohttp._websocket.reader import WebSocketReader

from hearthnet.mesh.wsframes import Control, Failure, FrameSplitter
from hearthnet.transport.websocket import OP_CLOSE, OP_TEXT

log = logging.getLogger("hearthnet.mesh.link")

# takes the binary messages of one read, in order; False: the link reads no more of them
Sink = Callable[[list[bytes]], bool]

_FED = (False, b"")
_BROKEN = (True, b"")
# what ends a pending ``receive()`` when the link stops reading (its reason is the link's)
STOPPED = WSMessage(WSMsgType.ERROR, None, "the link stopped reading")


class LinkReader:
    """Stands in for aiohttp's ``WebSocketReader`` on one connection (same two methods)."""

    __slots__ = ("_queue", "_sink", "_splitter", "_stopped")

    def __init__(self, queue: Any, max_size: int) -> None:
        self._queue = queue  # aiohttp's WebSocketDataQueue, which receive() reads
        self._splitter = FrameSplitter(max_size, unmask=websocket_mask)
        self._sink: Sink | None = None
        self._stopped = False

    @property
    def queued(self) -> int:
        """Messages on aiohttp's queue that ``receive()`` has not returned yet."""
        return len(self._queue._buffer)

    def attach(self, sink: Sink) -> None:
        """From now on binary messages go to ``sink`` as they are read. The caller has
        taken what was queued before (``queued`` is 0), so the order holds."""
        self._sink = sink

    def feed_data(self, data: bytes | bytearray | memoryview) -> tuple[bool, bytes]:
        """One socket read (aiohttp's protocol calls this); True: a protocol error, which
        is on the queue for ``receive()`` to raise."""
        if type(data) is not bytes:
            data = bytes(data)
        events = self._splitter.feed(data)
        sink = self._sink
        if not events:
            return _FED
        if sink is not None and not self._splitter.mixed:
            self._give(events)  # type: ignore[arg-type]
            return _FED
        batch: list[bytes] = []
        for event in events:
            if type(event) is bytes:
                if sink is None:
                    self._queue.feed_data(WSMessage(WSMsgType.BINARY, event, ""), len(event))
                else:
                    batch.append(event)
                continue
            if batch:
                self._give(batch)
                batch = []
            if isinstance(event, Failure):
                self._queue.set_exception(WebSocketError(event.code, event.reason))
                return _BROKEN
            assert isinstance(event, Control)
            self._queue.feed_data(_message(event), len(event.data))
            if sink is not None and event.opcode in (OP_CLOSE, OP_TEXT):
                # the link stops at either (as its receive() loop does): nothing after
                # them in this read reaches it
                self._stopped = True
        if batch:
            self._give(batch)
        return _FED

    def feed_eof(self) -> None:
        """The connection ended: ``receive()`` returns ``CLOSED``."""
        self._queue.feed_eof()

    def _give(self, batch: list[bytes]) -> None:
        assert self._sink is not None
        if self._stopped:
            return
        try:
            going = self._sink(batch)
        except Exception:  # a bug behind the link: it stops reading, the connection lives on
            log.exception("a peer link failed handling what it read")
            going = False
        if not going:
            self._stop()

    def _stop(self) -> None:
        # later binary messages are dropped unread (the link is going down, as when a
        # read loop stops reading); control frames still reach the closing handshake
        self._stopped = True
        self._queue.feed_data(STOPPED, 0)


def _message(event: Control) -> WSMessage:
    if event.opcode == OP_CLOSE:
        return WSMessage(WSMsgType.CLOSE, event.code, event.reason)
    if event.opcode == OP_TEXT:
        return WSMessage(WSMsgType.TEXT, event.data.decode("utf-8"), "")
    return WSMessage(WSMsgType(event.opcode), event.data, "")


def _protocol_of(ws: Any) -> Any:
    """The aiohttp protocol object a WebSocket's reads go through (server or client)."""
    request = getattr(ws, "_req", None)
    if request is not None:
        return getattr(request, "protocol", None)
    connection = getattr(ws, "_conn", None)
    return getattr(connection, "protocol", None)


def install(ws: Any, max_size: int) -> LinkReader | None:
    """Put a :class:`LinkReader` in place of aiohttp's parser on ``ws``'s connection.

    Call it right after the upgrade, before the event loop runs again and before
    anything is sent (so aiohttp's parser has not seen a byte of a frame: a peer link's
    dialer speaks first, and the acceptor calls this straight after ``prepare``).
    None, and aiohttp's parser stays, where the private parts this needs are missing,
    compression was negotiated, or aiohttp already queued a message.
    """
    protocol = _protocol_of(ws)
    queue: Any = getattr(ws, "_reader", None)
    parser = getattr(protocol, "_payload_parser", None)
    compress: Any = getattr(ws, "compress", True)
    if (
        not isinstance(parser, WebSocketReader)
        or compress
        or not hasattr(queue, "_buffer")
        or queue._buffer
    ):
        return None
    reader = LinkReader(queue, max_size)
    protocol._payload_parser = reader
    if hasattr(ws, "_parser"):  # the server side keeps its parser alive through this
        ws._parser = reader
    return reader


def abort(ws: Any) -> bool:
    """Drop ``ws``'s connection at once, without the closing handshake (a peer gone silent
    answers none: aiohttp would wait for it up to its close timeout, 10 s). The link's
    read ends as at a reset. False where the connection is not found (closed already)."""
    transport = getattr(_protocol_of(ws), "transport", None)
    if transport is None:
        return False
    transport.abort()
    return True


def reader_of(ws: Any) -> LinkReader | None:
    """The :class:`LinkReader` installed on ``ws``'s connection, if any."""
    parser = getattr(_protocol_of(ws), "_payload_parser", None)
    return parser if isinstance(parser, LinkReader) else None
