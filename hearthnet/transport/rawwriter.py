"""aiohttp's WebSocket writer, when frames may be written to its transport directly.

Batched writes (the peer link's :class:`~hearthnet.mesh.wsbatch.BatchWriter`, the bus
session's :class:`~hearthnet.transport.bus_ws.TurnWriter`) build the frame bytes
themselves and hand them to the transport in one write. They use parts of aiohttp's
writer that are not API (its transport, closing flag, mask setting and the protocol's
pause state), checked here at run time: a newer aiohttp may move them, and then frames
go through aiohttp one at a time, which is correct, only slower.
"""

from __future__ import annotations

from typing import Any

from aiohttp._websocket.writer import WebSocketWriter


def raw_writer(ws: object) -> WebSocketWriter | None:
    """``ws``'s writer if it can take pre-built frames: present (a server response has
    it once prepared), without compression (that needs the writer's own compressor
    state) and with the private parts batched writes use; else None."""
    writer: Any = getattr(ws, "_writer", None)
    if not isinstance(writer, WebSocketWriter) or getattr(writer, "compress", True):
        return None
    protocol = getattr(writer, "protocol", None)
    if (
        all(hasattr(writer, name) for name in ("transport", "_closing", "use_mask"))
        and hasattr(protocol, "_paused")
        and hasattr(protocol, "_drain_helper")
    ):
        return writer
    return None
