"""A tool result lost with a settled direct link (spec §5 tool loop over the mesh, §8
fall-back): a's client answers the model's tool call on b, and the direct link a-b dies
with that ``tool_result`` on it. Both ends fall back to the relay, a sends the tool
result again (mesh/call_hold.py), and b's model goes on with it. Real nodes over
loopback; the settled link and the cut of tests/mesh/test_path_switch_calls.py."""

from __future__ import annotations

from hearthnet.client import Client
from tests.capabilities.llm_chat.support import LOOKUP, LOOKUP_SCRIPT, USER
from tests.mesh.conftest import RelayedTrio
from tests.mesh.switch_cuts import counts_since, cut_on, fallback_counts, settle_direct


async def test_a_tool_result_that_dies_with_the_direct_link_reaches_the_model(
    chat_trio: RelayedTrio,
) -> None:
    """llm.chat pinned to b over a settled direct link; the link dies with a's tool result
    on it: a sends it again through the relay and the chat ends with the tool's answer."""
    a, b = chat_trio.a, chat_trio.b
    await settle_direct(chat_trio)
    before = fallback_counts(chat_trio), a.mesh.remote.counts.status()["resent"]["tool_result"]
    cut = cut_on(chat_trio, "tool_result")
    async with Client(a.url, keys=a.keys) as client:
        result = await client.chat(
            [USER],
            tools=[LOOKUP],
            tool_handler=lambda name, args: {"found": f"notes on {args['q']}"},
            params={"script": LOOKUP_SCRIPT},
            target=b.keys.node_id,
            deadline_ms=30_000,
        )
    since = counts_since(chat_trio, before[0])
    resent = a.mesh.remote.counts.status()["resent"]["tool_result"] - before[1]
    assert (["tool_result"], 'Found: [{"found":"notes on water"}]', 1, (1, 1), True) == (
        cut,
        result.text,
        result.tool_rounds,
        since[:2],
        resent >= 1,
    )
