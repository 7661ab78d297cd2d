"""``hearthnet node start`` to ready, idle RSS and the first calls after it (spec §11).

    python -m bench.bench_start --starts 5          # ~10 s on a quiet machine

Each start is ``bench_bus``'s: :func:`bench.common.start_node` (``hearthnet node start``
on a free loopback port, default configuration, a fresh data directory), the time from
starting the process to its ready line, the node's CPU seconds at that moment (read
from /proc, steadier than wall time on a shared machine), then its RSS 1 s later. With
``--first-calls`` a client made before the node (its key is the node's own, the client
module imported and its session open) then times its first and second signed calls of
``echo@1.0`` (no request schema) and ``mesh.topics@1.0`` (a schema, compiled on its
first call), so what start-up leaves for later shows up where it lands; RSS is then read
after those calls instead.

To compare two trees, alternate them: ``PYTHONPATH=<tree>`` and run from that tree.
Python's bytecode cache counts: with ``PYTHONDONTWRITEBYTECODE=1`` and no
``__pycache__`` yet, every start compiles the node's ~200 modules again (~0.5 s of CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import proc_cpu_s, proc_rss_mb, save, start_node
from hearthnet.client import Client
from hearthnet.identity import load_or_create_keys

FIRST_CALLS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("echo@1.0", {"x": 1}),
    ("mesh.topics@1.0", {}),
)


async def one_start(first_calls: bool) -> dict[str, Any]:
    """Start one node, measure, stop it."""
    data = Path(tempfile.mkdtemp(prefix="hn-bench-start-"))
    keys = load_or_create_keys(data)  # the node's own key: the client is its first member
    node = start_node(data_dir=data)
    try:
        result: dict[str, Any] = {
            "ready_s": round(node.ready_s, 3),
            "cpu_at_ready_s": round(proc_cpu_s(node.pid), 3),
        }
        if first_calls:
            async with Client(node.url, keys=keys) as client:
                for capability, value in FIRST_CALLS:
                    took = []
                    for _ in range(2):
                        t0 = time.perf_counter()
                        await client.call(capability, value)
                        took.append(round((time.perf_counter() - t0) * 1000, 1))
                    result[f"{capability} first, second ms"] = took
        await asyncio.sleep(1.0)  # as bench_bus: let the node settle before reading RSS
        # idle: no call yet; after the first calls it holds what they loaded (jsonschema)
        result["rss_after_calls_mb" if first_calls else "idle_rss_mb"] = round(
            proc_rss_mb(node.pid), 1
        )
        return result
    finally:
        node.stop()
        shutil.rmtree(data, ignore_errors=True)


async def run(starts: int, first_calls: bool) -> dict[str, Any]:
    """``starts`` starts, one after another."""
    rows = [await one_start(first_calls) for _ in range(starts)]
    summary = {
        key: {"min": min(r[key] for r in rows), "median": statistics.median(r[key] for r in rows)}
        for key in ("ready_s", "cpu_at_ready_s", "idle_rss_mb", "rss_after_calls_mb")
        if key in rows[0]
    }
    return {"starts": rows, "summary": summary}


def main() -> None:
    """Parse arguments, run, save bench/results/NAME.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=5, help="node starts, one at a time")
    parser.add_argument(
        "--first-calls", action="store_true", help="time the first calls after the ready line"
    )
    parser.add_argument("--name", default="start", help="result file name")
    opts = parser.parse_args()
    save(opts.name, asyncio.run(run(max(1, min(opts.starts, 100)), opts.first_calls)))


if __name__ == "__main__":
    main()
