"""Publish to committed, through the real message log at a fixed rate, with SQLite's
automatic WAL checkpoint on (the default, every 1,000 WAL pages, inside whichever commit
crosses the mark) and off (``wal_autocheckpoint = 0``: no checkpoint at all during the
run, the WAL grows), alternated.

The latency scenario's p99 at 2,000 msg/s (spec §11) is the tail of this path plus the
writes to subscribers; "off" is the floor that moving the checkpoint off the commit path
could reach (a checkpoint on another thread still shares the disk). Each publish's time is
from ``MessageLog.publish`` to its future being done (after the commit, ``fsync``
included with ``sync = "full"``).

``--retention S`` runs the node's retention beside (its default rules: 1,000 messages a
topic, so at the cap every pass deletes what came since the last one, as in the latency
scenario), a pass every S seconds, and reports each retention transaction's time in the
writer thread: what the publishes queued behind it waited.

``--lone N`` measures one publish in flight instead (spec §11's durable 1→1 at 1 in
flight, without the sockets): N publishes, each queued as the WebSocket path queues a
session's publishes (``MessageLog.publish_many`` with an ``answer``) and awaited before
the next, so every commit holds one message; per round the process CPU and the wall time
per publish and the publish → answered percentiles, with the node's garbage collector
settings (start-up objects frozen, the young generation every 10,000 allocations).

Run: python -m bench.bench_commit_latency [--rate 2000 --seconds 8 --rounds 2 --sync full]
     python -m bench.bench_commit_latency --retention 2 --checkpoint auto --seconds 12
     python -m bench.bench_commit_latency --lone 3000 --rounds 3 --sync normal
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import save
from hearthnet.config import PubSubSection
from hearthnet.identity import KeyPair
from hearthnet.metrics import MetricsRegistry
from hearthnet.pubsub.access import AccessPolicy
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.retention import RetentionPolicy
from hearthnet.pubsub.service import PubSub

PAYLOAD = "x" * 256
TICK_S = 0.005  # publishes go out in groups every 5 ms (rate * TICK_S each)


def _done(took: list[float], t0: float, _fut: object) -> None:
    took.append(time.perf_counter() - t0)


def _with_retention(log: MessageLog, every_s: float) -> tuple[PubSub, list[float]]:
    """The node's retention over ``log`` (default rules), a pass every ``every_s``; the
    list each retention transaction's writer time (ms) is appended to."""
    service = PubSub(
        node_id=log.keys.node_id,
        config=PubSubSection(retention_interval_s=every_s),
        log_store=log,
        policy=AccessPolicy(),
        retention=RetentionPolicy(),
        metrics=MetricsRegistry(),
    )
    log.listeners.append(service.retention_pass.on_commit)
    held: list[float] = []
    pruner = log._pruner  # the bench times the log's own retention transactions
    assert pruner is not None
    run = pruner._run

    async def timed(job: Any) -> Any:
        result, elapsed = await run(job)
        held.append(elapsed * 1e3)
        return result, elapsed

    pruner._run = timed  # type: ignore[method-assign]
    return service, held


def _timed_jobs(log: MessageLog) -> list[float]:
    """Time every job of the log's writer thread in the thread (commits and retention's
    transactions, checkpoints included): the list each job's wall time (ms) goes to."""
    writer = log._writer  # the bench times the log's own writer
    assert writer is not None
    run = writer.run
    took: list[float] = []

    def timed(job: Any, conn: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return job(conn)
        finally:
            took.append((time.perf_counter() - t0) * 1e3)

    async def run_timed(job: Any, **kwargs: Any) -> Any:
        return await run(partial(timed, job), **kwargs)

    writer.run = run_timed  # type: ignore[method-assign]
    return took


async def one_run(
    sync: str, rate: int, seconds: float, *, checkpoint: bool, retention_s: float = 0.0
) -> dict[str, Any]:
    """Publish at ``rate`` for ``seconds``; percentiles of publish → committed, ms."""
    with tempfile.TemporaryDirectory(prefix="hn-commit-latency-") as tmp:
        log = MessageLog(Path(tmp) / "log.db", KeyPair.generate(), synchronous=sync)
        await log.open()
        loop = asyncio.get_running_loop()
        flush = loop.create_task(log.run())
        held: list[float] = []
        jobs = _timed_jobs(log)
        pruning: asyncio.Task[None] | None = None
        if retention_s > 0:
            service, held = _with_retention(log, retention_s)
            pruning = loop.create_task(service.retention_pass.loop())
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
            for task in (flush, pruning):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            await log.close()
    took.sort()
    held.sort()
    jobs.sort()

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
        "over_10ms": sum(1 for t in took if t > 0.010),
        "writer_jobs": len(jobs),
        "writer_jobs_over_10ms": sum(1 for j in jobs if j > 10),
        "writer_job_ms_p99": round(jobs[int(0.99 * len(jobs))], 2) if jobs else None,
        "writer_job_ms_max": round(jobs[-1], 1) if jobs else None,
        "retention_transactions": len(held),
        "retention_ms_p50": round(held[len(held) // 2], 2) if held else None,
        "retention_ms_max": round(held[-1], 2) if held else None,
        "retention_ms_sum": round(sum(held), 1),
    }


async def lone_run(sync: str, count: int) -> dict[str, Any]:
    """``count`` publishes one at a time, each answered (committed) before the next."""
    with tempfile.TemporaryDirectory(prefix="hn-commit-lone-") as tmp:
        log = MessageLog(Path(tmp) / "log.db", KeyPair.generate(), synchronous=sync)
        await log.open()
        loop = asyncio.get_running_loop()
        flush = loop.create_task(log.run())
        item = [("bench.durable.r1", "bench", PAYLOAD, None, {"kind": "token", "id": "t1"})]
        try:
            took: list[float] = []
            for i in range(count + 50):  # the first 50: connection, schema, first pages
                done: asyncio.Future[Any] = loop.create_future()
                if i == 50:
                    c0, w0 = time.process_time(), time.perf_counter()
                t0 = time.perf_counter()
                log.publish_many(item, answer=done.set_result)
                await done
                took.append(time.perf_counter() - t0)
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        finally:
            flush.cancel()
            await log.close()
    took = sorted(took[50:])
    return {
        "sync": sync.lower(),
        "publishes": count,
        "cpu_us_per_publish": round(cpu / count * 1e6, 1),
        "wall_us_per_publish": round(wall / count * 1e6, 1),
        "p50_ms": round(took[len(took) // 2] * 1e3, 3),
        "p99_ms": round(took[min(len(took) - 1, int(0.99 * len(took)))] * 1e3, 3),
        "inline_commits": log.inline_batches,
    }


def main(argv: list[str] | None = None) -> None:
    """Run and save bench/results/commit_latency.json."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--rate", type=int, default=2000, help="publishes per second")
    p.add_argument("--seconds", type=float, default=8.0, help="per run")
    p.add_argument("--rounds", type=int, default=2, help="pairs of runs (auto, off)")
    p.add_argument("--sync", default="full", choices=("full", "normal"))
    p.add_argument(
        "--retention",
        type=float,
        default=0.0,
        metavar="S",
        help="retention beside (default rules), a pass every S seconds",
    )
    p.add_argument(
        "--checkpoint", default="auto,off", help="comma list of: auto, off (one run each a round)"
    )
    p.add_argument(
        "--lone",
        type=int,
        default=0,
        help="instead: this many publishes one in flight per round (CPU and wall per publish)",
    )
    p.add_argument("--name", default="commit_latency")
    opts = p.parse_args(argv)
    runs = []
    if opts.lone > 0:
        gc.freeze()  # as the node process: start-up objects out of the collector's way
        gc.set_threshold(10_000)
        for _ in range(opts.rounds):
            row = asyncio.run(lone_run(opts.sync.upper(), opts.lone))
            print(row, flush=True)
            runs.append(row)
        save(opts.name, {"runs": runs, "settings": vars(opts)})
        return
    for _ in range(opts.rounds):
        for mode in opts.checkpoint.split(","):
            row = asyncio.run(
                one_run(
                    opts.sync.upper(),
                    opts.rate,
                    opts.seconds,
                    checkpoint=mode.strip() == "auto",
                    retention_s=opts.retention,
                )
            )
            print(row, flush=True)
            runs.append(row)
    save(opts.name, {"runs": runs, "settings": vars(opts)})


if __name__ == "__main__":
    main()
