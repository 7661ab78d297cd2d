"""``echo@1.0`` and ``echo.stream@1.0`` (spec §2.1): the contracts tests and benchmarks use."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from hearthnet.bus.capability import CallContext
from hearthnet.bus.descriptor import CapabilityDescriptor
from hearthnet.frames import Frame

MAX_STREAM_COUNT = 1_000_000
MAX_FRAME_TEXT = 64 * 1024


class Echo:
    """``echo@1.0``: input ``{...any JSON...}`` -> output ``{"echo": <input>}``."""

    descriptor = CapabilityDescriptor(
        name="echo",
        version="1.0",
        request_schema={},
        response_schema={"type": "object", "required": ["echo"]},
        max_concurrent=256,
        idempotent=True,
        description="Returns its input.",
        check_on_first_call=True,  # a constant: checked by the tests
    )

    async def call(self, ctx: CallContext, value: Any) -> dict[str, Any]:
        """Echo the input back."""
        return {"echo": value}


class EchoStream:
    """``echo.stream@1.0``: ``count`` token frames of ``size`` characters, then ``done``."""

    descriptor = CapabilityDescriptor(
        name="echo.stream",
        version="1.0",
        request_schema={
            "type": "object",
            "required": ["count"],
            "properties": {
                "count": {"type": "integer", "minimum": 1, "maximum": MAX_STREAM_COUNT},
                "size": {"type": "integer", "minimum": 0, "maximum": MAX_FRAME_TEXT},
                "interval_ms": {"type": "integer", "minimum": 0, "maximum": 60_000},
            },
            "additionalProperties": False,
        },
        stream_schema={
            "type": "object",
            "properties": {"i": {"type": "integer"}, "text": {"type": "string"}},
        },
        max_concurrent=256,
        idempotent=True,
        description="Streams count frames; for tests and benchmarks.",
        check_on_first_call=True,  # a constant: checked by the tests
    )

    async def stream(self, ctx: CallContext, value: Any) -> AsyncIterator[Frame]:
        """Yield the frames; cancellation stops it at the next frame or sleep."""
        count = value["count"]
        text = "x" * value.get("size", 16)
        interval = value.get("interval_ms", 0) / 1000
        for i in range(1, count + 1):
            yield Frame("token", {"i": i, "text": text})
            if interval:
                await asyncio.sleep(interval)
        yield Frame("done", {"count": count})
