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
``--consumers N``: that pass alone, with ``N`` durable consumers that acked nothing (the
first of ``t.1``, then alternately of one topic and of ``t.*``), each holding up to
``--held`` messages (``--consumer``: one).

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


def service_over(log: MessageLog, cap: int, held: int = 10_000) -> PubSub:
    """A pub/sub service over ``log`` whose only limit is the message cap (durable
    consumers hold up to ``held``)."""
    return PubSub(
        node_id=log.keys.node_id,
        config=PubSubSection(consumer_max_held=held),
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


def consumer_patterns(n: int, topics: int) -> list[str]:
    """The patterns of ``n`` bench consumers: ``t.1`` first, then alternately one topic
    and ``t.*``."""
    return ["t.1" if i == 0 else f"t.{i % topics}" if i % 2 == 0 else "t.*" for i in range(n)]


async def one_pass(cap: int, topics: int, consumers: int, held: int) -> tuple[int, float, float]:
    """A log of ``2 * cap`` messages over ``topics`` topics, then one pass alone that
    deletes the oldest half (with ``consumers``, that many durable consumers that acked
    nothing hold up to ``held`` each): (deleted, CPU seconds of the process, wall
    seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        log = MessageLog(
            Path(tmp) / "log.db", KeyPair.from_seed(b"\x52" * 32), synchronous="normal"
        )
        await log.open()
        for i, pattern in enumerate(consumer_patterns(consumers, topics)):
            log.save_consumer(ConsumerRecord("bench", f"held{i}", (pattern,), 0))
        task = asyncio.get_running_loop().create_task(log.run())
        try:
            for first in range(0, 2 * cap, 1000):
                await asyncio.gather(
                    *(
                        log.publish(topic=f"t.{i % topics}", msg_type="m", data=i)
                        for i in range(first, min(2 * cap, first + 1000))
                    )
                )
            service = service_over(log, cap, held)
            cpu, wall = time.process_time(), time.monotonic()
            deleted = await service.apply_retention()
            return deleted, time.process_time() - cpu, time.monotonic() - wall
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await log.close()


async def pass_cost(cap: int, topics: int, repeat: int, consumers: int, held: int) -> str:
    """The one-pass measurement, median of ``repeat``; its summary line."""
    runs = [await one_pass(cap, topics, consumers, held) for _ in range(repeat)]
    deleted = runs[0][0]
    cpu = statistics.median(r[1] for r in runs)
    wall = statistics.median(r[2] for r in runs)
    return (
        f"one pass alone deleting {deleted} of {2 * cap} messages over {topics} topics"
        f"{f', {consumers} durable consumers holding up to {held}' if consumers else ''}:"
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
    parser.add_argument("--consumers", type=int, default=0, help="one pass only, with N consumers")
    parser.add_argument("--consumer", action="store_true", help="as --consumers 1")
    parser.add_argument("--held", type=int, default=10_000, help="pubsub.consumer_max_held")
    args = parser.parse_args()
    consumers = max(args.consumers, int(args.consumer))
    if not consumers:
        print(asyncio.run(run(args.cap, args.messages, args.rate, args.topics)))
    if args.repeat:
        print(asyncio.run(pass_cost(args.cap, args.topics, args.repeat, consumers, args.held)))


if __name__ == "__main__":
    main()
