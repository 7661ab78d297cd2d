"""``since: {last: N}`` over a wildcard: how long the log takes to find the newest N.

A late joiner subscribing to ``rooms.*`` with ``last: N`` gets the newest N messages of
every matching topic. This builds a message log on real SQLite (in a temporary directory,
``sync = normal`` to build it quickly) with ``--rooms`` quiet topics, one message each,
followed by ``--busy`` messages of one busy topic, and times ``MessageLog.read_last`` (the
query a subscribe runs before going live) for each N in ``--last``, median of
``--repeat``. It measures the log alone: no socket, no frame encoding.

Run: python -m bench.bench_read_last [--rooms 300 --busy 200000 --last 10,100,300]
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

from bench.common import save
from hearthnet.identity import KeyPair
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.topics import TopicPattern

BATCH = 2000  # publishes queued at once while building the log


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="hn-read-last-") as tmp:
        log = MessageLog(Path(tmp) / "log.db", KeyPair.generate(), synchronous="normal")
        await log.open()
        flush = asyncio.get_running_loop().create_task(log.run())
        try:
            for i in range(opts.rooms):
                await log.publish(topic=f"rooms.r{i}", msg_type="m", data=i)
            for start in range(0, opts.busy, BATCH):
                n = min(BATCH, opts.busy - start)
                await asyncio.gather(
                    *[log.publish(topic="busy.feed", msg_type="m", data=0) for _ in range(n)]
                )
            head = log.head_seq
            pattern = [TopicPattern.parse("rooms.*")]
            results = []
            for count in opts.last:
                times = []
                for _ in range(opts.repeat):
                    t0 = time.perf_counter()
                    rows = await log.reader.read_last(pattern, count, upto_seq=head)
                    times.append((time.perf_counter() - t0) * 1000)
                expected = min(count, opts.rooms)
                if len(rows) != expected:
                    raise RuntimeError(f"last {count}: {len(rows)} rows, expected {expected}")
                p50 = statistics.median(times)
                results.append({"last": count, "ms_p50": p50, "rows": len(rows)})
                print(f"rooms.* last {count:>5}: {p50:8.1f} ms (median)")
        finally:
            await log.close()
            flush.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flush
    return {"rooms": opts.rooms, "busy": opts.busy, "log_messages": head, "runs": results}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rooms", type=int, default=300, help="quiet topics, one message each")
    p.add_argument("--busy", type=int, default=200_000, help="messages of the busy topic after")
    p.add_argument("--last", default="10,100,300", help="comma list of N")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--name", default="read_last")
    opts = p.parse_args()
    opts.last = [int(x) for x in opts.last.split(",")]
    result = asyncio.run(run(opts))
    save(opts.name, result)


if __name__ == "__main__":
    main()
