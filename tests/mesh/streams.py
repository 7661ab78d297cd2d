"""A call streaming across a path change, for the real-node mesh tests (spec §8: the link
moves, falls back or is held "without losing or duplicating a frame"): ``echo.stream``
from b to a, and a step run once a given number of chunks has arrived."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from hearthnet.client import Client
from hearthnet.node import Node
from tests.mesh.test_relaying import path_to

Step = Callable[[], Coroutine[Any, Any, None]]


@dataclass
class Streamed:
    """What a stream brought: the chunks' numbers, every frame's kind, the paths from a
    to b seen as chunks arrived."""

    got: list[int] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    paths: set[str] = field(default_factory=set)
    last: dict[str, Any] = field(default_factory=dict)  # the last frame's data


async def stream_chunks(
    a: Node,
    b: Node,
    *,
    chunks: int,
    at: int,
    step: Step | None = None,
    dial: bool = True,
    deadline_ms: int = 60_000,
) -> Streamed:
    """``echo.stream`` of ``chunks`` from b to a (10 ms a chunk); once ``at`` chunks have
    arrived, a dials b (with ``dial``) and ``step`` is spawned. Returns what came."""
    out = Streamed()
    async with (
        Client(a.url, keys=a.keys) as client,
        client.stream(
            "echo.stream@1.0",
            {"count": chunks, "size": 64, "interval_ms": 10},
            target=b.keys.node_id,
            prefer_ws=False,
            deadline_ms=deadline_ms,
        ) as stream,
    ):
        async for frame in stream:
            out.kinds.append(frame.event)
            out.last = frame.data if isinstance(frame.data, dict) else {}
            if frame.event != "token":
                continue
            out.got.append(frame.data["i"])
            out.paths.add(str(path_to(a, b)))
            if len(out.got) == at:
                if dial:
                    a.mesh.spawn(a.mesh.dial(b.url), "dial-b")
                if step is not None:
                    a.mesh.spawn(step(), "at-switch")
    return out
