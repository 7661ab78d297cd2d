"""Direct-upgrade benchmark (spec §8): how often two relayed home nodes punch a direct
link, per NAT type, in the NAT lab (``tests/chaos/nat_lab.py``: network namespaces, real
nftables NAT; needs root and ``nft``).

Each round builds a fresh lab: a relay on a public address and ``--homes`` home nodes,
each behind its own router of the NAT type under test, all attached to the relay. Every
pair of homes starts relayed and tries the direct upgrade; a round ends when every node
has reported an outcome for every other home (``hearthnet_path_upgrades`` tried =
succeeded + failed, at least homes - 1 of them) or after ``--round-s``. Rounds repeat
until ``--seconds`` per NAT type are used up. Reported per type: punches tried, succeeded
and failed (each side of a pair counts its own), the success rate, and how many pairs
ended direct. ``plain`` is ``masquerade`` (endpoint-independent mapping, port kept);
``fully-random`` maps every connection to a new port (symmetric NAT).

Every node is stopped by PID and every lab removed, also on failure; every loop is
bounded in count and time.

Run (as root): python -m bench.bench_punch [--seconds 60] [--homes 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from itertools import combinations
from pathlib import Path
from typing import Any

from bench.common import save
from tests.chaos.nat_lab import NatLab, nat_unavailable_reason
from tests.chaos.netns import Machine
from tests.chaos.relay_lab import launch as start
from tests.chaos.test_relay_netns import PORT, paths, prepare

MODES = ("plain", "fully-random")
MAX_ROUNDS = 50
POLL_S = 1.0


def upgrades(machine: Machine) -> dict[str, float]:
    """``hearthnet_path_upgrades`` by outcome, from the node's ``/metrics``."""
    done = machine.run("curl", "-s", "-m", "10", f"http://{machine.ip}:{PORT}/metrics", check=False)
    out = {"tried": 0.0, "succeeded": 0.0, "failed": 0.0}
    for line in done.stdout.splitlines():
        if line.startswith("hearthnet_path_upgrades{"):
            outcome = line.split('outcome="', 1)[1].split('"', 1)[0]
            out[outcome] = float(line.split()[-1])
    return out


def one_round(mode: str, homes: int, round_s: float) -> dict[str, Any]:
    """One lab, every pair of homes tries once; the outcomes."""
    with (
        tempfile.TemporaryDirectory(prefix="hn-punch-") as tmp,
        NatLab([mode] * homes, public=("relay",)) as lab,
    ):
        root = Path(tmp)
        relay = lab.public["relay"]
        keys = prepare(root, [relay, *lab.homes])
        ids = {h.name: k.node_id for h, k in zip(lab.homes, keys[1:], strict=True)}
        procs = [start(root, relay, "--relay")]
        procs += [start(root, h, "--relay-url", f"http://{relay.ip}:{PORT}") for h in lab.homes]
        started = time.monotonic()
        try:
            for proc in procs:
                proc.wait_for_line(lambda line: line.startswith("hearthnet ready"), 60)
            while True:
                counts = [upgrades(h) for h in lab.homes]
                settled = all(
                    c["tried"] == c["succeeded"] + c["failed"]
                    and c["succeeded"] + c["failed"] >= homes - 1
                    for c in counts
                )
                if settled or time.monotonic() - started > round_s:
                    break
                time.sleep(POLL_S)
            seen = {h.name: paths(root, h) for h in lab.homes}
        finally:
            for proc in reversed(procs):
                if proc.returncode is None:
                    proc.host.kill(proc, 15)
    pairs = list(combinations([h.name for h in lab.homes], 2))
    direct = sum(
        1
        for a, b in pairs
        if seen[a].get(ids[b], ("",))[0] == "direct" and seen[b].get(ids[a], ("",))[0] == "direct"
    )
    return {
        "settled": settled,
        "seconds": round(time.monotonic() - started, 1),
        "tried": sum(c["tried"] for c in counts),
        "succeeded": sum(c["succeeded"] for c in counts),
        "failed": sum(c["failed"] for c in counts),
        "pairs": len(pairs),
        "pairs_direct": direct,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Rounds per NAT type within the time budget; totals and rates."""
    result: dict[str, Any] = {"homes": args.homes, "seconds_per_mode": args.seconds, "modes": {}}
    for mode in args.modes:
        rounds: list[dict[str, Any]] = []
        until = time.monotonic() + args.seconds
        while time.monotonic() < until and len(rounds) < MAX_ROUNDS:
            rounds.append(one_round(mode, args.homes, args.round_s))
            print(mode, json.dumps(rounds[-1]), file=sys.stderr, flush=True)
        ended = sum(r["succeeded"] + r["failed"] for r in rounds)
        result["modes"][mode] = {
            "rounds": len(rounds),
            "unsettled_rounds": sum(1 for r in rounds if not r["settled"]),
            "tried": sum(r["tried"] for r in rounds),
            "succeeded": sum(r["succeeded"] for r in rounds),
            "failed": sum(r["failed"] for r in rounds),
            "success_rate": round(sum(r["succeeded"] for r in rounds) / ended, 3)
            if ended
            else None,
            "pairs": sum(r["pairs"] for r in rounds),
            "pairs_direct": sum(r["pairs_direct"] for r in rounds),
            "round_s_median": sorted(r["seconds"] for r in rounds)[len(rounds) // 2],
        }
    return result


def main() -> None:
    """Run and save bench/results/punch.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60, help="time budget per NAT type")
    parser.add_argument("--homes", type=int, default=4, help="home nodes per round")
    parser.add_argument("--round-s", type=float, default=60, help="longest round")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    args = parser.parse_args()
    reason = nat_unavailable_reason()
    if reason is not None:
        raise SystemExit(f"the NAT lab cannot run here: {reason}")
    save("punch", run(args))


if __name__ == "__main__":
    main()
