"""How far past ``pubsub.max_messages`` the log gets while messages keep coming.

Publishes ``--messages`` messages over ``--topics`` topics at ``--rate`` a second (groups
of at most 1,000 at once; a rate of 0 publishes as fast as the log commits) into a log
capped at ``--cap`` messages, with the retention loop and its commit trigger wired as the
node wires them, and reports the most messages the log held after any commit.

Run: python -m bench.bench_retention_cap [--cap 20000 --messages 60000 --rate 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from pathlib import Path

from hearthnet.config import PubSubSection
from hearthnet.identity import KeyPair
from hearthnet.metrics import MetricsRegistry
from hearthnet.pubsub.access import AccessPolicy
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.retention import RetentionPolicy
from hearthnet.pubsub.service import PubSub


async def run(cap: int, messages: int, rate: int, topics: int) -> str:
    """One run; its summary line."""
    with tempfile.TemporaryDirectory() as tmp:
        log = MessageLog(
            Path(tmp) / "log.db", KeyPair.from_seed(b"\x52" * 32), synchronous="normal"
        )
        await log.open()
        loop = asyncio.get_running_loop()
        service = PubSub(
            node_id=log.keys.node_id,
            config=PubSubSection(),
            log_store=log,
            policy=AccessPolicy(),
            retention=RetentionPolicy(max_messages=10**9, max_log_messages=cap),
            metrics=MetricsRegistry(),
        )
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
        f" {held} at the end"
    )


def main() -> None:
    """Parse arguments and print one line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=int, default=20_000)
    parser.add_argument("--messages", type=int, default=60_000)
    parser.add_argument("--rate", type=int, default=2000, help="messages/s; 0: as fast as it goes")
    parser.add_argument("--topics", type=int, default=500)
    args = parser.parse_args()
    print(asyncio.run(run(args.cap, args.messages, args.rate, args.topics)))


if __name__ == "__main__":
    main()
