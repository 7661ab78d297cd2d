"""A bus WebSocket call pinned to another node (spec §2.3, §3.5): the call frame's
``target`` routes it through the mesh, here through a relay, like a pinned HTTP call; tool
results and cancel follow it there. Real nodes over loopback."""

from __future__ import annotations

from typing import Any

import pytest

from hearthnet.client import Client
from hearthnet.errors import BadRequest, Unavailable
from hearthnet.identity import KeyPair
from hearthnet.node import Node
from tests.capabilities.llm_chat.support import LOOKUP, LOOKUP_SCRIPT, USER
from tests.helpers import wait_until
from tests.mesh.conftest import RelayedTrio

SLOW = [{"text": " ".join(f"w{i}" for i in range(200)), "token_delay_ms": 20}]


def calls(node: Node, capability: str, result: str) -> float:
    """``hearthnet_calls_total{capability, result}`` on ``node``."""
    counter = node.metrics.counter("hearthnet_calls_total", "", ("capability", "result"))
    return counter.get(capability, result)


async def test_a_ws_chat_with_a_tool_call_runs_on_the_target(
    chat_trio: RelayedTrio,
) -> None:
    """llm.chat over WS pinned to b: b runs it, the caller's tool result reaches b's model."""
    a, b = chat_trio.a, chat_trio.b
    async with Client(a.url, keys=a.keys) as client:
        result = await client.chat(
            [USER],
            tools=[LOOKUP],
            tool_handler=lambda name, args: {"found": f"notes on {args['q']}"},
            params={"script": LOOKUP_SCRIPT},
            target=b.keys.node_id,
        )
    assert ("ws", 'Found: [{"found":"notes on water"}]', 1, 1.0) == (
        result.transport,
        result.text,
        result.tool_rounds,
        calls(b, "llm.chat", "ok"),
    )


async def test_a_ws_cancel_ends_the_stream_on_the_target(chat_trio: RelayedTrio) -> None:
    """A cancel mid-stream over WS: the caller gets error{cancelled}, b's call ends cancelled."""
    a, b = chat_trio.a, chat_trio.b
    seen: list[str] = []
    async with (
        Client(a.url, keys=a.keys) as client,
        client.stream(
            "llm.chat@2.0",
            {"messages": [USER], "stream": True},
            params={"script": SLOW},
            target=b.keys.node_id,
        ) as stream,
    ):
        async for frame in stream:
            seen.append(frame.event)
            if seen.count("token") == 3:
                await stream.cancel()
            if frame.terminal:
                last: Any = (frame.event, frame.data["code"])
        transport = stream.transport
    await wait_until(lambda: calls(b, "llm.chat", "cancelled") == 1.0, 5, "b's call cancelled")
    assert ("ws", ("error", "cancelled"), True) == (transport, last, seen.count("token") < 200)


async def test_a_ws_call_to_an_unknown_target_is_refused(chat_trio: RelayedTrio) -> None:
    """A target with no route: unavailable; one that is no NodeID: bad_request."""
    a = chat_trio.a
    nowhere = KeyPair.generate().node_id
    async with Client(a.url, keys=a.keys) as client:
        with pytest.raises(Unavailable):
            async with client.stream("echo.stream@1.0", {"count": 1}, target=nowhere) as s:
                await s.collect()
        with pytest.raises(BadRequest):
            async with client.stream("echo.stream@1.0", {"count": 1}, target="node-b") as s:
                await s.collect()
