"""How far past ``pubsub.max_messages`` the log gets while messages keep coming, and what
retention costs per message it deletes.

Publishes ``--messages`` messages over ``--topics`` topics at ``--rate`` a second (groups
of at most 1,000 at once; a rate of 0 publishes as fast as the log commits) into a log
capped at ``--cap`` messages, with the retention loop and its commit trigger wired as the
node wires them, and reports the most messages the log held after any commit, and the
retention passes' time on the event loop.

Then, alone (nothing else running), one pass over a log of ``2 × --cap`` messages over the
same topics that deletes the oldest half: the process's CPU time (event loop and the
log's writer thread) and wall time, per message deleted (median of ``--repeat``);
``--consumer``: that pass alone, with a durable consumer of ``t.1`` that acked nothing.

Run: python -m bench.bench_retention_cap [--cap 20000 --messages 60000 --rate 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from hearthnet.config import PubSubSection
from hearthnet.identity import KeyPair
from hearthnet.metrics import MetricsRegistry
from hearthnet.pubsub.access import AccessPolicy
from hearthnet.pubsub.log import ConsumerRecord, MessageLog
from hearthnet.pubsub.retention import RetentionPolicy
from hearthnet.pubsub.service import PubSub


def service_over(log: MessageLog, cap: int) -> PubSub:
    """A pub/sub service over ``log`` whose only limit is the message cap."""
    return PubSub(
        node_id=log.keys.node_id,
        config=PubSubSection(),
        log_store=log,
        policy=AccessPolicy(),
        retention=RetentionPolicy(max_messages=10**9, max_log_messages=cap),
        metrics=MetricsRegistry(),
    )


async def run(cap: int, messages: int, rate: int, topics: int) -> str:
    """One run; its summary line."""
    with tempfile.TemporaryDirectory() as tmp:
        log = MessageLog(
            Path(tmp) / "log.db", KeyPair.from_seed(b"\x52" * 32), synchronous="normal"
        )
        await log.open()
        loop = asyncio.get_running_loop()
        service = service_over(log, cap)
        retention = service.retention_pass
        passes, deleted, pass_s = 0, 0, 0.0
        apply = retention.apply

        async def timed_apply(*args: Any, **kwargs: Any) -> int:
            nonlocal passes, deleted, pass_s
            start = time.thread_time()
            try:
                gone = await apply(*args, **kwargs)
            finally:
                pass_s += time.thread_time() - start
            passes += 1
            deleted += gone
            return gone

        retention.apply = timed_apply  # type: ignore[method-assign]
        peak = 0

        def watch(_batch: object) -> None:
            nonlocal peak
            peak = max(peak, len(log.index))

        log.listeners += [service.retention_pass.on_commit, watch]
        tasks = [loop.create_task(log.run()), loop.create_task(service.retention_pass.loop())]
        step = min(1000, max(1, rate // 10)) if rate else 1000
        start = time.monotonic()
        try:
            for first in range(0, messages, step):
                await asyncio.gather(
                    *(
                        log.publish(topic=f"t.{i % topics}", msg_type="m", data=i)
                        for i in range(first, min(messages, first + step))
                    )
                )
                if rate:
                    await asyncio.sleep(max(0.0, start + (first + step) / rate - time.monotonic()))
            took = time.monotonic() - start
            held = len(log.index)
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await log.close()
    return (
        f"cap {cap}, {messages} messages over {topics} topics in {took:.1f} s"
        f" ({messages / took:,.0f}/s): peak held {peak} ({peak / cap:.2f}x the cap),"
        f" {held} at the end; {passes} passes deleted {deleted}"
        f" (event loop thread {pass_s * 1e6 / max(1, deleted):.1f} µs a message)"
    )


async def one_pass(cap: int, topics: int, consumer: bool) -> tuple[int, float, float]:
    """A log of ``2 * cap`` messages over ``topics`` topics, then one pass alone that
    deletes the oldest half (with ``consumer``, a durable consumer of ``t.1`` that acked
    nothing holds that topic's): (deleted, CPU seconds of the process, wall seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        log = MessageLog(
            Path(tmp) / "log.db", KeyPair.from_seed(b"\x52" * 32), synchronous="normal"
        )
        await log.open()
        if consumer:
            log.save_consumer(ConsumerRecord("bench", "held", ("t.1",), 0))
        task = asyncio.get_running_loop().create_task(log.run())
        try:
            for first in range(0, 2 * cap, 1000):
                await asyncio.gather(
                    *(
                        log.publish(topic=f"t.{i % topics}", msg_type="m", data=i)
                        for i in range(first, min(2 * cap, first + 1000))
                    )
                )
            service = service_over(log, cap)
            cpu, wall = time.process_time(), time.monotonic()
            deleted = await service.apply_retention()
            return deleted, time.process_time() - cpu, time.monotonic() - wall
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await log.close()


async def pass_cost(cap: int, topics: int, repeat: int, consumer: bool) -> str:
    """The one-pass measurement, median of ``repeat``; its summary line."""
    runs = [await one_pass(cap, topics, consumer) for _ in range(repeat)]
    deleted = runs[0][0]
    cpu = statistics.median(r[1] for r in runs)
    wall = statistics.median(r[2] for r in runs)
    return (
        f"one pass alone deleting {deleted} of {2 * cap} messages over {topics} topics"
        f"{', a durable consumer holding t.1' if consumer else ''}:"
        f" {cpu * 1000:.0f} ms CPU ({cpu * 1e6 / max(1, deleted):.2f} µs a message),"
        f" {wall * 1000:.0f} ms wall (median of {repeat})"
    )


def main() -> None:
    """Parse arguments and print one line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=int, default=20_000)
    parser.add_argument("--messages", type=int, default=60_000)
    parser.add_argument("--rate", type=int, default=2000, help="messages/s; 0: as fast as it goes")
    parser.add_argument("--topics", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=3, help="one-pass runs (0: none)")
    parser.add_argument(
        "--consumer", action="store_true", help="one pass only, a durable consumer holding t.1"
    )
    args = parser.parse_args()
    if not args.consumer:
        print(asyncio.run(run(args.cap, args.messages, args.rate, args.topics)))
    if args.repeat:
        print(asyncio.run(pass_cost(args.cap, args.topics, args.repeat, args.consumer)))


if __name__ == "__main__":
    main()
