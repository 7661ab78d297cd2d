"""Several binary WebSocket messages in one socket write (spec §11: a relay forwards a
frame for ≤ 5 µs of CPU, and a system call per frame alone costs more than that).

A peer link queues frames and its writer drains the queue once per wake-up; written one
``send_bytes`` each, every frame is one ``write`` system call and one wake-up of the
receiver. :class:`BatchWriter` frames them all (RFC 6455 §5.2: FIN, opcode 2, length,
the client's mask) and hands the bytes to the transport at once, as the pub/sub fan-out
does for a subscriber's frames. It works under aiohttp's WebSocket classes (their writer
and transport); anything else (a socket without them, or with compression negotiated)
gets one ``send_bytes`` per frame, which is correct, only slower.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Protocol

from aiohttp import ClientConnectionResetError
from aiohttp._websocket.helpers import websocket_mask
from aiohttp._websocket.writer import WebSocketWriter

from hearthnet.transport.rawwriter import raw_writer
from hearthnet.transport.websocket import OP_BINARY, frame_head


class _Sends(Protocol):
    async def send_bytes(self, data: bytes) -> None:
        """Send one binary message."""


_RANDOM = random.Random()  # as aiohttp masks: the key need only be unpredictable to a page


def _mask_key() -> bytes:
    return _RANDOM.getrandbits(32).to_bytes(4, "big")


def encode_frames(
    messages: Sequence[bytes], masked: bool, mask_key: Callable[[], bytes] = _mask_key
) -> bytes:
    """``messages`` as consecutive binary frames (masked, with a fresh key each, when the
    client writes them: RFC 6455 §5.3)."""
    parts: list[bytes | bytearray] = []
    for data in messages:
        parts.append(frame_head(len(data), OP_BINARY, masked))
        if masked:
            key = mask_key()
            body = bytearray(data)
            websocket_mask(key, body)
            parts.append(key)
            parts.append(body)
        else:
            parts.append(data)
    return b"".join(parts)


def frame_parts(messages: Sequence[bytes]) -> list[bytes]:
    """``messages`` as consecutive unmasked binary frames (a server's), each header and
    body its own buffer, for a gathered write (no copy of the bodies into one)."""
    parts: list[bytes] = []
    for data in messages:
        parts.append(frame_head(len(data), OP_BINARY))
        parts.append(data)
    return parts


class BatchWriter:
    """Writes a batch of binary messages (one or more) on one WebSocket with one
    transport write."""

    __slots__ = ("_writer", "ws")

    def __init__(self, ws: _Sends) -> None:
        self.ws = ws
        self._writer = raw_writer(ws)

    def _usable(self) -> WebSocketWriter | None:
        if self._writer is None:  # the server side has its writer once the upgrade is prepared
            self._writer = raw_writer(self.ws)
        return self._writer

    @property
    def paused(self) -> bool:
        """The socket's buffer is full: a write now would wait for it to drain."""
        writer = self._writer
        return writer is not None and bool(writer.protocol._paused)

    def send_now(self, messages: Sequence[bytes]) -> bool:
        """Write ``messages`` in order without waiting, when the raw path is usable and
        the connection is open; False (nothing written) otherwise: :meth:`send` them."""
        writer = self._usable()
        if writer is None or writer._closing or writer.transport.is_closing():
            return False
        if writer.use_mask:
            writer.transport.write(encode_frames(messages, True))
        else:
            writer.transport.writelines(frame_parts(messages))
        return True

    async def send(self, messages: Sequence[bytes]) -> None:
        """Send ``messages`` in order.

        Raises:
            ConnectionError: the connection is closing or gone (aiohttp's
                ``ClientConnectionResetError``, as ``send_bytes`` raises).
        """
        writer = self._usable()
        if writer is None:
            for data in messages:
                await self.ws.send_bytes(data)
            return
        transport = writer.transport
        if writer._closing or transport.is_closing():
            raise ClientConnectionResetError("Cannot write to closing transport")
        if writer.use_mask:
            transport.write(encode_frames(messages, True))
        else:  # one gathered write of the headers and the bodies as they are
            transport.writelines(frame_parts(messages))
        protocol = writer.protocol
        if protocol._paused:  # the socket's buffer is full: wait until it drains
            await protocol._drain_helper()
