"""Two home nodes behind symmetric NATs that reach each other only through one relay
(spec §5, §6, §8), shared by the tests of this module (one lab, nodes started once):

- The direct upgrade is tried and fails on both sides (the NATs map every connection to
  a new port), the pair stays relayed, and a publish and a pinned call cross the relay
  (``hearthnet pub``, ``hearthnet call``).
- ``llm.chat@2.0`` pinned to home B from a client of home A over the bus WebSocket: the
  model's tool call comes back over the relay, the client's answer reaches B's model,
  and a cancel mid-stream ends the call on B. Both homes run the demo model, so only the
  target sends the call to B.
- Loss: 10 % and then 30 % of the frames crossing the internet dropped (every link,
  home ↔ relay both ways): every acknowledged publish reaches B's subscriber exactly
  once, and a stream pinned across completes or ends with an error frame, never hangs.

Real node processes, real nftables NAT."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

from tests.chaos.nat_lab import NatLab
from tests.chaos.netns import wait_until_sync
from tests.chaos.relay_lab import RelayPair, metric, probe, start_all, stop_all, url
from tests.chaos.test_punch_netns import publish_numbers, received, upgrades
from tests.chaos.test_relay_netns import both_paths, cli, paths, prepare, relayed_in, subscribe
from tests.helpers import eventually

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

CHAT_CALLS = 'hearthnet_calls_total{capability="llm.chat",result='
LOSSES = (10, 30)
N = 12  # messages per loss rate
STREAM_FRAMES = 200
STREAM_WITHIN_S = 60.0  # past every deadline on the path: a stream still open then hung
ARRIVE_WITHIN_S = 90.0


@pytest.fixture(scope="module")
def pair(nat_lab_support: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayPair]:
    """Relay and homes A and B (demo model on both), relayed to each other."""
    root = tmp_path_factory.mktemp("relayed-pair")
    with NatLab(["fully-random", "fully-random"], public=("relay",)) as lab:
        relay = lab.public["relay"]
        home_a, home_b = lab.homes
        keys = prepare(root, [relay, home_a, home_b])
        homes = ("--relay-url", url(relay), "--llm-demo")
        procs = start_all(root, [(relay, ("--relay",)), (home_a, homes), (home_b, homes)])
        try:
            want = ("relayed", keys[0].node_id)
            wait_until_sync(
                lambda: (
                    paths(root, home_a).get(keys[2].node_id) == want
                    and paths(root, home_b).get(keys[1].node_id) == want
                ),
                within_s=60,
                what="each home node relayed to the other",
                interval_s=0.5,
            )
            yield RelayPair(lab, root, relay, home_a, home_b, keys)
        finally:
            stop_all(procs)


async def test_symmetric_nats_stay_relayed_and_publishes_and_calls_cross(
    pair: RelayPair,
) -> None:
    """The punch fails on both sides, the link stays relayed, messages and a call cross."""
    root, home_a, home_b = pair.root, pair.a, pair.b
    relay_keys, a_keys, b_keys = pair.keys
    failed = await eventually(
        lambda: asyncio.gather(
            asyncio.to_thread(upgrades, home_a), asyncio.to_thread(upgrades, home_b)
        ),
        lambda got: all(side.get("failed", 0) >= 1 for side in got),
        within_s=90,
        what="a punch tried and failed on both sides",
    )
    seen = await both_paths(root, home_a, home_b)
    subs = [subscribe(root, home_b, "home.punch", 3), subscribe(root, home_b, "home.news", 1)]
    try:
        await publish_numbers(root, home_a, "home.punch", range(3))
        got = await asyncio.to_thread(received, subs[0], 3, 60)
        published = await asyncio.to_thread(
            cli, root, home_a, "pub", "home.news", "--json", "--data", '{"n": 42}'
        )
        line = await asyncio.to_thread(subs[1].wait_for_line, lambda ln: '"n": 42' in ln, 30)
        answer = await asyncio.to_thread(
            cli, root, home_a, "call", "echo", "--body", '{"x": 7}', "--target", b_keys.node_id
        )
        opened = await asyncio.to_thread(relayed_in, root, home_b)
    finally:
        stop_all(subs)
    news = json.loads(line)
    assert (
        ("relayed", relay_keys.node_id),
        ("relayed", relay_keys.node_id),
        [0, 1, 2],
        0.0,
        (published["id"], {"n": 42}),
        {"echo": {"x": 7}},
        True,
    ) == (
        seen[0][b_keys.node_id],
        seen[1][a_keys.node_id],
        sorted(got),
        failed[0].get("succeeded", 0.0) + failed[1].get("succeeded", 0.0),
        (news["id"], news["data"]),
        answer,
        opened > 0,
    )


async def test_a_tool_loop_and_a_cancel_reach_a_node_behind_a_relay(pair: RelayPair) -> None:
    """A's client chats with B's model over WS via the relay, answers its tool, cancels."""
    target = pair.keys[2].node_id
    got = await asyncio.to_thread(probe, pair.root, pair.a, "chat", target, "60")
    cancelled = await eventually(
        lambda: asyncio.to_thread(metric, pair.b, CHAT_CALLS + '"cancelled"}'),
        lambda n: n >= 1,
        within_s=10,
        what="the cancelled call ended on B",
    )
    ok = await asyncio.to_thread(metric, pair.b, CHAT_CALLS + '"ok"}')
    opened = await asyncio.to_thread(relayed_in, pair.root, pair.b)
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


async def test_publishes_and_streams_cross_a_lossy_relayed_path(pair: RelayPair) -> None:
    """10 % then 30 % loss: every acked message arrives once; streams end, none hangs."""
    lab, root, home_a, home_b = pair.lab, pair.root, pair.a, pair.b
    sub = home_b.popen(
        *home_b.python(
            "-m", "hearthnet.cli", "sub", "loss.*", "--full",
            "--last", str(N * len(LOSSES)), "--count", str(N * len(LOSSES)),
            "--data-dir", str(root / home_b.name),
        ),
    )  # fmt: skip
    acked: dict[int, list[dict[str, object]]] = {}
    streams: dict[int, dict[str, object]] = {}
    try:
        for pct in LOSSES:
            lab.internet_loss(pct)
            published, streamed = await asyncio.gather(
                asyncio.to_thread(probe, root, home_a, "publish", f"loss.p{pct}", str(N)),
                asyncio.to_thread(
                    probe, root, home_a, "stream", pair.keys[2].node_id,
                    str(STREAM_FRAMES), str(STREAM_WITHIN_S),
                ),
            )  # fmt: skip
            acked[pct] = published["acked"]
            streams[pct] = streamed
        await asyncio.to_thread(sub.wait, ARRIVE_WITHIN_S)
        lost = lab.lost_frames()
        got = sub.json_lines()
    finally:
        lab.internet_loss(0)
        stop_all([sub])
    print(f"relay loss: {lost} frames dropped; streams {json.dumps(streams)}")
    delivered = sorted((m["topic"], m["origin_seq"], m["id"]) for m in got)
    want = sorted((f"loss.p{pct}", m["origin_seq"], m["id"]) for pct in LOSSES for m in acked[pct])
    ends = {
        pct: (s.get("hung", False), s.get("end") in ("done", "error")) for pct, s in streams.items()
    }
    assert (want, {pct: (False, True) for pct in LOSSES}, True) == (delivered, ends, lost > 0)
