"""``llm.chat@2.0`` through a relay (spec §5, §8): a client of home node A runs a tool loop
on home node B, which A reaches only through a relay (symmetric NATs, so no direct
upgrade): the model's tool call comes back over the bus WebSocket, the client answers it,
and the answer goes back to B's model. A cancel mid-stream ends the call on B. Real node
processes, real nftables NAT, the demo model on both home nodes (the target decides)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.chaos.conftest import MakeNatLab
from tests.chaos.relay_lab import metric, probe, start_all, stop_all, url
from tests.chaos.test_relay_netns import both_paths, prepare, relayed_in
from tests.helpers import eventually

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

CHAT_CALLS = 'hearthnet_calls_total{capability="llm.chat",result='


async def test_a_tool_loop_and_a_cancel_reach_a_node_behind_a_relay(
    make_nat_lab: MakeNatLab, tmp_path: Path
) -> None:
    """A's client chats with B's model over WS via the relay, answers its tool, cancels."""
    lab = make_nat_lab(["fully-random", "fully-random"], public=("relay",))
    relay = lab.public["relay"]
    home_a, home_b = lab.homes
    relay_keys, _a_keys, b_keys = prepare(tmp_path, [relay, home_a, home_b])
    relayed = ("--relay-url", url(relay))
    procs = start_all(
        tmp_path,
        # A offers llm.chat too: only the target sends the call to B
        [
            (relay, ("--relay",)),
            (home_a, (*relayed, "--llm-demo")),
            (home_b, (*relayed, "--llm-demo")),
        ],
    )
    try:
        await eventually(
            lambda: both_paths(tmp_path, home_a, home_b),
            lambda got: got[0].get(b_keys.node_id) == ("relayed", relay_keys.node_id),
            within_s=60,
            what="home A relayed to home B",
        )
        got = await asyncio.to_thread(probe, tmp_path, home_a, "chat", b_keys.node_id, "60")
        cancelled = await eventually(
            lambda: asyncio.to_thread(metric, home_b, CHAT_CALLS + '"cancelled"}'),
            lambda n: n >= 1,
            within_s=10,
            what="the cancelled call ended on B",
        )
        ok = await asyncio.to_thread(metric, home_b, CHAT_CALLS + '"ok"}')
        opened = await asyncio.to_thread(relayed_in, tmp_path, home_b)
    finally:
        stop_all(procs)
    chat, cancel = got["chat"], got["cancel"]
    assert (
        ("ws", 'Found: [{"found":"notes on water"}]', 1),
        [{"name": "lookup", "arguments": {"q": "water"}}],
        ("ws", ["error", "cancelled"], True),
        (1.0, 1.0, True),
    ) == (
        (chat["transport"], chat["text"], chat["tool_rounds"]),
        chat["asked"],
        (cancel["transport"], cancel["terminal"], cancel["tokens"] < 300),
        (ok, cancelled, opened > 0),
    )
