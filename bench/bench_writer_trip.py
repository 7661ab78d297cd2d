"""What one trip to the message log's writer thread costs the event loop (spec §6.4, §11).

Every commit the log does not make on the loop (all of them with ``sync = "full"``, large
batches with ``normal``) is one trip: the job goes to the writer thread, its result comes
back to the loop. Measured here with a job that does nothing, so only the trip is left:
the log's :class:`~hearthnet.pubsub.logstore.SqliteWriter` (its own thread blocked on a
queue, one ``call_soon_threadsafe`` back) against the same trip through a one-thread
``ThreadPoolExecutor`` and ``loop.run_in_executor`` (what the writer used before). CPU is
the whole process's (loop and thread) per trip; wall is the mean per trip, trips one at a
time, as at one publish in flight.

Run: python -m bench.bench_writer_trip [--trips 3000 --repeat 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import uvloop

from bench.common import save
from hearthnet.pubsub.logstore import SqliteWriter


def nothing(conn: sqlite3.Connection | None = None) -> None:
    """The job: no work, so what is measured is the trip."""


async def via_writer(path: Path, trips: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per trip through the log's writer."""
    writer = SqliteWriter(path, "NORMAL")
    await writer.run(nothing)  # the thread and the connection exist before timing
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(trips):
        await writer.run(nothing)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    await writer.close()
    return cpu / trips * 1e6, wall / trips * 1e6


async def via_pool(trips: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per trip through a one-thread pool."""
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=1) as pool:
        await loop.run_in_executor(pool, nothing)
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(trips):
            await loop.run_in_executor(pool, nothing)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    return cpu / trips * 1e6, wall / trips * 1e6


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    """Alternate the two, ``--repeat`` rounds; medians kept."""
    rounds: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="hn-trip-") as tmp:
        for r in range(opts.repeat):
            writer_cpu, writer_wall = await via_writer(Path(tmp) / f"w{r}.db", opts.trips)
            pool_cpu, pool_wall = await via_pool(opts.trips)
            rounds.append(
                {
                    "writer_cpu_us": writer_cpu,
                    "writer_wall_us": writer_wall,
                    "pool_cpu_us": pool_cpu,
                    "pool_wall_us": pool_wall,
                }
            )
            print(
                f"  round {r}: writer thread {writer_cpu:5.1f} µs CPU, {writer_wall:6.1f} µs wall;"
                f" thread pool {pool_cpu:5.1f} µs CPU, {pool_wall:6.1f} µs wall",
                flush=True,
            )
    median = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    return {"load1": os.getloadavg()[0], "trips": opts.trips, "rounds": rounds, "median": median}


def main() -> None:
    """Parse options, run, save under bench/results/."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trips", type=int, default=3000, help="trips per measurement")
    parser.add_argument("--repeat", type=int, default=5, help="alternated rounds")
    parser.add_argument("--name", default="writer_trip")
    opts = parser.parse_args()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:  # as the node runs
        result = runner.run(run(opts))
    print({key: round(value, 1) for key, value in result["median"].items()})
    save(opts.name, result)


if __name__ == "__main__":
    main()
