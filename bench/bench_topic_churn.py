"""What the log's in-memory index keeps of topics seen once: a node that publishes on
topics never used again (a topic per conversation or agent run), under retention.

Publishes ``--rounds`` rounds of ``--per-round`` messages, each on a topic of its own, into
a log capped at ``--cap`` messages, with a retention pass after each round (as the node's
loop runs them), and reports the topic numbers the index keeps and the memory traced
(``tracemalloc``) after the last round.

Run: python -m bench.bench_topic_churn [--rounds 20 --per-round 10000 --cap 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import tempfile
import tracemalloc
from pathlib import Path

from bench.bench_retention_cap import service_over
from hearthnet.identity import KeyPair
from hearthnet.pubsub.log import MessageLog


async def run(rounds: int, per_round: int, cap: int) -> str:
    """One run; its summary line."""
    with tempfile.TemporaryDirectory() as tmp:
        log = MessageLog(
            Path(tmp) / "log.db", KeyPair.from_seed(b"\x53" * 32), synchronous="normal"
        )
        await log.open()
        task = asyncio.get_running_loop().create_task(log.run())
        try:
            service = service_over(log, cap)
            tracemalloc.start()
            for r in range(rounds):
                for first in range(0, per_round, 1000):  # under the log's waiting bound
                    await asyncio.gather(
                        *(
                            log.publish(topic=f"agent.{r}-{i}.tokens", msg_type="m", data=i)
                            for i in range(first, min(per_round, first + 1000))
                        )
                    )
                await service.apply_retention()
            gc.collect()
            traced, _ = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            return (
                f"{rounds * per_round:,} topics seen, {len(log.index):,} messages held:"
                f" {len(log.index.topic_names):,} topic numbers kept,"
                f" {traced / 2**20:.1f} MiB traced"
            )
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await log.close()


def main() -> None:
    """Parse arguments and print one line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=10_000)
    parser.add_argument("--cap", type=int, default=1000, help="pubsub.max_messages")
    args = parser.parse_args()
    print(asyncio.run(run(args.rounds, args.per_round, args.cap)))


if __name__ == "__main__":
    main()
