"""Publish to committed, through the real message log at a fixed rate, with SQLite's
automatic WAL checkpoint on (the default, every 1,000 WAL pages, inside whichever commit
crosses the mark) and off (``wal_autocheckpoint = 0``: no checkpoint at all during the
run, the WAL grows), alternated.

The latency scenario's p99 at 2,000 msg/s (spec §11) is the tail of this path plus the
writes to subscribers; "off" is the floor that moving the checkpoint off the commit path
could reach (a checkpoint on another thread still shares the disk). Each publish's time is
from ``MessageLog.publish`` to its future being done (after the commit, ``fsync``
included with ``sync = "full"``).

Run: python -m bench.bench_commit_latency [--rate 2000 --seconds 8 --rounds 2 --sync full]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import save
from hearthnet.identity import KeyPair
from hearthnet.pubsub.log import MessageLog

PAYLOAD = "x" * 256
TICK_S = 0.005  # publishes go out in groups every 5 ms (rate * TICK_S each)


def _done(took: list[float], t0: float, _fut: object) -> None:
    took.append(time.perf_counter() - t0)


async def one_run(sync: str, rate: int, seconds: float, *, checkpoint: bool) -> dict[str, Any]:
    """Publish at ``rate`` for ``seconds``; percentiles of publish → committed, ms."""
    with tempfile.TemporaryDirectory(prefix="hn-commit-latency-") as tmp:
        log = MessageLog(Path(tmp) / "log.db", KeyPair.generate(), synchronous=sync)
        await log.open()
        flush = asyncio.get_running_loop().create_task(log.run())
        try:
            await log.publish(topic="b.t", msg_type="m", data=PAYLOAD)  # connect, schema
            if not checkpoint:
                writer = log._writer  # the bench reaches the log's own connection
                assert writer is not None
                await writer.run(lambda conn: conn.execute("PRAGMA wal_autocheckpoint=0"))
            took: list[float] = []
            waiting: list[asyncio.Future[Any]] = []
            per_tick = max(1, round(rate * TICK_S))
            end = time.perf_counter() + seconds
            due = time.perf_counter()
            while time.perf_counter() < end:
                for _ in range(per_tick):
                    t0 = time.perf_counter()
                    fut = log.publish(topic="b.t", msg_type="m", data=PAYLOAD)
                    assert fut is not None
                    fut.add_done_callback(partial(_done, took, t0))
                    waiting.append(fut)
                due += TICK_S
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
            await asyncio.gather(*waiting)
        finally:
            flush.cancel()
            await log.close()
    took.sort()

    def ms(p: float) -> float:
        return round(took[min(len(took) - 1, int(p * len(took)))] * 1e3, 2)

    return {
        "checkpoint": "auto" if checkpoint else "off",
        "messages": len(took),
        "p50_ms": ms(0.5),
        "p90_ms": ms(0.9),
        "p99_ms": ms(0.99),
        "p999_ms": ms(0.999),
        "max_ms": round(took[-1] * 1e3, 1),
    }


def main(argv: list[str] | None = None) -> None:
    """Run and save bench/results/commit_latency.json."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--rate", type=int, default=2000, help="publishes per second")
    p.add_argument("--seconds", type=float, default=8.0, help="per run")
    p.add_argument("--rounds", type=int, default=2, help="pairs of runs (auto, off)")
    p.add_argument("--sync", default="full", choices=("full", "normal"))
    p.add_argument("--name", default="commit_latency")
    opts = p.parse_args(argv)
    runs = []
    for _ in range(opts.rounds):
        for checkpoint in (True, False):
            row = asyncio.run(
                one_run(opts.sync.upper(), opts.rate, opts.seconds, checkpoint=checkpoint)
            )
            print(row, flush=True)
            runs.append(row)
    save(opts.name, {"runs": runs, "settings": vars(opts)})


if __name__ == "__main__":
    main()
