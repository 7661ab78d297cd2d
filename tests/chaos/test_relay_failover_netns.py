"""Relay failover (spec §8, §11): two home nodes behind NAT, each configured with two
federated relays; the relay they use is killed with -9 and traffic resumes through the
other within the spec's hard limit, nothing acknowledged lost. Real node processes in
network namespaces; neither home node can dial the other, and the NATs are symmetric
(fully-random) so the direct upgrade fails and traffic stays on the relays."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from tests.chaos.conftest import MakeNatLab
from tests.chaos.netns import HostProcess
from tests.chaos.test_relay_netns import FAST, PORT, cli, paths, prepare, relayed_in, start
from tests.helpers import eventually

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

RESUME_LIMIT_S = 15.0  # spec §8's hard limit (the target is 5 s, spec §11)


def through(relay: str) -> tuple[tuple[str, str], ...]:
    """The paths through ``relay``: relayed, or relayed with a direct upgrade tried."""
    return (("relayed", relay), ("upgrading", relay))


async def test_killing_the_relay_in_use_moves_traffic_to_the_other(
    make_nat_lab: MakeNatLab, tmp_path: Path
) -> None:
    """Relay in use killed -9: a publish from before and one after arrive, a pinned call goes."""
    lab = make_nat_lab(["fully-random", "fully-random"], public=("relay", "relay2"))
    relay1, relay2 = lab.public["relay"], lab.public["relay2"]
    home_a, home_b = lab.homes
    r1_keys, r2_keys, _a_keys, b_keys = prepare(tmp_path, [relay1, relay2, home_a, home_b])
    url1, url2 = f"http://{relay1.ip}:{PORT}", f"http://{relay2.ip}:{PORT}"
    both = ("--relay-url", url1, "--relay-url", url2)
    procs: list[HostProcess] = []
    try:
        procs.append(start(tmp_path, relay2, "--relay", "--relay-peer", url1))
        procs.append(start(tmp_path, relay1, "--relay", "--relay-peer", url2))
        procs.append(start(tmp_path, home_a, *both))
        procs.append(start(tmp_path, home_b, *both))
        relays = {r1_keys.node_id: relay1, r2_keys.node_id: relay2}
        relays_procs = {r1_keys.node_id: procs[1], r2_keys.node_id: procs[0]}
        before = await eventually(
            lambda: asyncio.to_thread(paths, tmp_path, home_a),
            lambda got: got.get(b_keys.node_id, ("", None))[0] == "relayed",
            within_s=60,
            what="home A relayed to home B",
        )
        used = before[b_keys.node_id][1]
        assert used in relays
        sub = home_b.popen(
            *home_b.python(
                "-m", "hearthnet.cli", "sub", "home.news", "--last", "10", "--count", "2",
                "--data-dir", str(tmp_path / home_b.name),
            ),
            env=FAST,
        )  # fmt: skip
        procs.append(sub)
        other = next(r for r in relays if r != used)
        # home B is cut off from both relays while home A's publish is acknowledged, so it
        # can only arrive after the failover
        for host in relays.values():
            lab.block(host, home_b.router)
        first = await asyncio.to_thread(
            cli, tmp_path, home_a, "pub", "home.news", "--json", "--data", '{"n": 1}'
        )
        killed_at = time.monotonic()
        relays[used].kill(relays_procs[used], signal.SIGKILL)
        lab.unblock_all()  # the dead relay's host now answers home B with resets
        second = await asyncio.to_thread(
            cli, tmp_path, home_a, "pub", "home.news", "--json", "--data", '{"n": 2}'
        )
        await asyncio.to_thread(sub.wait_for_line, lambda ln: '"n": 2' in ln, RESUME_LIMIT_S)
        resumed_s = time.monotonic() - killed_at
        await asyncio.to_thread(sub.wait_for_line, lambda ln: '"n": 1' in ln, RESUME_LIMIT_S)
        # through the other relay: relayed, or relayed while a direct upgrade is tried
        # (behind these NATs it fails after several seconds; the path is moved already)
        after = await eventually(
            lambda: asyncio.to_thread(paths, tmp_path, home_a),
            lambda got: got.get(b_keys.node_id) in through(other),
            within_s=RESUME_LIMIT_S,
            what="home A relayed to home B through the other relay",
        )
        switched_s = time.monotonic() - killed_at
        opened = await asyncio.to_thread(relayed_in, tmp_path, home_b)
        answer = await asyncio.to_thread(
            cli, tmp_path, home_a, "call", "echo", "--body", '{"x": 7}', "--target", b_keys.node_id
        )
        got = sub.json_lines()
        # the call's frames came relayed through the relay left
        more = await asyncio.to_thread(relayed_in, tmp_path, home_b)
    finally:
        for proc in reversed(procs):
            if proc.returncode is None:
                proc.host.kill(proc, signal.SIGTERM)
    print(
        f"relay failover: pub/sub resumed {resumed_s:.2f} s after the kill, "
        f"the relayed path moved within {switched_s:.2f} s"
    )
    assert (
        [(first["id"], {"n": 1}), (second["id"], {"n": 2})],
        True,
        {"echo": {"x": 7}},
        True,
        True,
    ) == (
        sorted((m["id"], m["data"]) for m in got),
        after[b_keys.node_id] in through(other),
        answer,
        resumed_s <= RESUME_LIMIT_S and switched_s <= RESUME_LIMIT_S,
        more > opened,
    )
