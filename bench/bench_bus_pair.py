"""Two checkouts' nodes under the same load, in alternating batches of signed calls
(spec §11: calls/s per node): the node's CPU per call, calls/s and the load generator's
CPU for each batch.

On a shared machine the load of the moment moves every figure by ±20 % from one minute
to the next, so one run per tree, minutes apart, cannot show a 10 % change. Here both
nodes run at once, each started with ``python -m hearthnet.cli node start`` from its own
checkout (``PYTHONPATH`` and working directory set to it), and the batches alternate
(base, new, then new, base, ...), so each round's pair saw the same machine. The load
generator is ``bench_bus``'s (pre-signed requests, one raw keep-alive connection per
worker); the node's CPU is ``utime + stime`` from ``/proc`` (all its threads).

``--node-cpus``, ``--loadgen-cpus`` and ``--fifo`` place both nodes and the load
generator as ``bench_bus`` does (``--fifo``: as on a quiet machine). ``--checker-cpus``
pins the nodes' child processes (the signature checker) apart from their event loops:
``--fifo --node-cpus 0 --loadgen-cpus 0 --checker-cpus 1`` keeps the load generator
from running while the loop works, as the kernel's wake-up placement often does on a
quiet machine with normal scheduling.

Run: python -m bench.bench_bus_pair BASE_TREE NEW_TREE [--rounds 8] [--calls 3000]
     [--connections 32] [--node-cpus 0] [--loadgen-cpus 1] [--checker-cpus 1] [--fifo]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import uvloop

from bench.bench_bus import cpus_arg, http_phase, per_thread, place, thread_stats
from bench.common import proc_cpu_s, save
from hearthnet.identity import load_or_create_keys


def start(tree: str) -> tuple[subprocess.Popen[str], str, Path, str]:
    """A node from ``tree``: its process, URL, data directory and community."""
    data = Path(tempfile.mkdtemp(prefix="hn-pair-"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "hearthnet.cli", "node", "start", "--data-dir", str(data),
         "--host", "127.0.0.1", "--port", "0", "--log-level", "warning"],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": tree},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("hearthnet ready"):
        proc.terminate()
        raise RuntimeError(f"node in {tree} did not start: {line!r}")
    fields = dict(p.split("=", 1) for p in line.split()[2:])
    return proc, fields["url"], data, fields["community"]


def _load() -> float:
    with open("/proc/loadavg", encoding="ascii") as f:
        return float(f.read().split()[0])


async def run(
    trees: dict[str, str],
    rounds: int,
    calls: int,
    conns: int,
    placement: tuple[set[int] | None, set[int] | None, bool, set[int] | None] = (
        None,
        None,
        False,
        None,
    ),
) -> dict[str, Any]:
    """Alternate batches between the two nodes; per-batch figures and medians."""
    node_cpus, loadgen_cpus, fifo, checker_cpus = placement
    nodes = {name: start(tree) for name, tree in trees.items()}
    place(0, loadgen_cpus, fifo)
    per: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    try:
        keys = {name: load_or_create_keys(n[2]) for name, n in nodes.items()}
        for name, (_, url, _, community) in nodes.items():
            await http_phase(url, keys[name], community, 1000, 4)  # warm-up
        order = list(trees)
        for r in range(rounds):
            for name in order if r % 2 == 0 else order[::-1]:
                proc, url, _, community = nodes[name]
                place(proc.pid, node_cpus, fifo, checker_cpus)
                threads0 = thread_stats(proc.pid)
                cpu0 = proc_cpu_s(proc.pid)
                out = await http_phase(url, keys[name], community, calls, conns)
                cpu = proc_cpu_s(proc.pid) - cpu0
                threads = per_thread(threads0, thread_stats(proc.pid), out["calls"])
                family = sum(t["cpu_us_per_call"] for t in threads.values())
                per[name].append(
                    {
                        "node_cpu_us_per_call": round(cpu / out["calls"] * 1e6, 1),
                        # with its child processes' (schedstat; threads under 1 % left out)
                        "node_family_cpu_us_per_call": round(family, 1),
                        "calls_per_s": out["calls_per_s"],
                        "loadgen_cpu_us_per_call": round(
                            out["loadgen_cpu_s"] / out["calls"] * 1e6, 1
                        ),
                        "errors": out["errors"],
                        "p50_ms": out["p50_ms"],
                        "load": _load(),
                        "switches_per_call": round(
                            sum(t["switches_per_call"] for t in threads.values()), 3
                        ),
                    }
                )
            print(
                f"round {r + 1}: "
                + "  ".join(
                    f"{n} {per[n][-1]['node_cpu_us_per_call']:.0f} "
                    f"({per[n][-1]['node_family_cpu_us_per_call']:.0f}) µs/call "
                    f"{per[n][-1]['calls_per_s']} calls/s "
                    f"{per[n][-1]['switches_per_call']:.2f} sw/call"
                    for n in trees
                ),
                flush=True,
            )
    finally:
        for proc, *_ in nodes.values():
            proc.terminate()
            proc.wait()
        if fifo:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    medians = {
        name: {k: statistics.median(b[k] for b in batches) for k in batches[0]}
        for name, batches in per.items()
    }
    ratios = [
        n["node_cpu_us_per_call"] / b["node_cpu_us_per_call"]
        for n, b in zip(per["new"], per["base"], strict=True)
    ]
    return {
        "trees": trees,
        "connections": conns,
        "calls_per_batch": calls,
        "rounds": per,
        "medians": medians,
        "cpu_ratio_median": round(statistics.median(ratios), 3),
        "cpu_lower_in": f"{sum(r < 1 for r in ratios)}/{len(ratios)}",
    }


def main() -> None:
    """Parse arguments, run, save bench/results/bus_pair.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="checkout of the base")
    parser.add_argument("new", help="checkout of the change")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--calls", type=int, default=3000, help="calls per batch")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--name", default="bus_pair", help="result file name under bench/results/")
    parser.add_argument("--node-cpus", default="", help="pin both nodes' threads, e.g. 0")
    parser.add_argument("--loadgen-cpus", default="", help="pin the load generator, e.g. 1")
    parser.add_argument(
        "--checker-cpus", default="", help="pin the nodes' child processes apart, e.g. 1"
    )
    parser.add_argument(
        "--fifo", action="store_true", help="nodes and load generator SCHED_FIFO (root)"
    )
    args = parser.parse_args()
    trees = {"base": os.path.abspath(args.base), "new": os.path.abspath(args.new)}
    placement = (
        cpus_arg(args.node_cpus),
        cpus_arg(args.loadgen_cpus),
        args.fifo,
        cpus_arg(args.checker_cpus),
    )
    result = uvloop.run(run(trees, args.rounds, args.calls, args.connections, placement))
    save(args.name, result)
    for name, m in result["medians"].items():
        print(f"{name}: medians {m}")
    print(f"node CPU per call new/base: median {result['cpu_ratio_median']}, "
          f"lower in {result['cpu_lower_in']} rounds")  # fmt: skip


if __name__ == "__main__":
    main()
