"""Loss on a relayed path (spec §8, §6): two home nodes behind symmetric NATs reach each
other only through a relay while 10 % and then 30 % of the frames crossing the internet
are dropped (every link: home ↔ relay both ways). Every acknowledged publish reaches the
other node's subscriber exactly once, and a stream pinned across either completes or
ends with an error frame, never hangs. Real node processes, real nftables NAT."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.chaos.conftest import MakeNatLab
from tests.chaos.relay_lab import probe, start_all, stop_all, url
from tests.chaos.test_relay_netns import both_paths, prepare
from tests.helpers import eventually

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

LOSSES = (10, 30)
N = 12  # messages per loss rate
STREAM_FRAMES = 200
STREAM_WITHIN_S = 60.0  # past every deadline on the path: a stream still open then hung
ARRIVE_WITHIN_S = 90.0


async def test_publishes_and_streams_cross_a_lossy_relayed_path(
    make_nat_lab: MakeNatLab, tmp_path: Path
) -> None:
    """10 % then 30 % loss: every acked message arrives once; streams end, none hangs."""
    lab = make_nat_lab(["fully-random", "fully-random"], public=("relay",))
    relay = lab.public["relay"]
    home_a, home_b = lab.homes
    relay_keys, a_keys, b_keys = prepare(tmp_path, [relay, home_a, home_b])
    relayed = ("--relay-url", url(relay))
    procs = start_all(tmp_path, [(relay, ("--relay",)), (home_a, relayed), (home_b, relayed)])
    try:
        await eventually(
            lambda: both_paths(tmp_path, home_a, home_b),
            lambda got: (
                (got[0].get(b_keys.node_id), got[1].get(a_keys.node_id))
                == (("relayed", relay_keys.node_id),) * 2
            ),
            within_s=60,
            what="each home node relayed to the other",
        )
        sub = home_b.popen(
            *home_b.python(
                "-m", "hearthnet.cli", "sub", "loss.*", "--full",
                "--last", str(N * len(LOSSES)), "--count", str(N * len(LOSSES)),
                "--data-dir", str(tmp_path / home_b.name),
            ),
        )  # fmt: skip
        procs.append(sub)
        acked: dict[int, list[dict[str, object]]] = {}
        streams: dict[int, dict[str, object]] = {}
        for pct in LOSSES:
            lab.internet_loss(pct)
            published, streamed = await asyncio.gather(
                asyncio.to_thread(probe, tmp_path, home_a, "publish", f"loss.p{pct}", str(N)),
                asyncio.to_thread(
                    probe, tmp_path, home_a, "stream", b_keys.node_id,
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
        stop_all(procs)
    print(f"relay loss: {lost} frames dropped; streams {json.dumps(streams)}")
    delivered = sorted((m["topic"], m["origin_seq"], m["id"]) for m in got)
    want = sorted((f"loss.p{pct}", m["origin_seq"], m["id"]) for pct in LOSSES for m in acked[pct])
    ends = {
        pct: (s.get("hung", False), s.get("end") in ("done", "error")) for pct, s in streams.items()
    }
    assert (want, {pct: (False, True) for pct in LOSSES}, True) == (
        delivered,
        ends,
        lost > 0,
    )
