"""How long the log takes to open, and what its in-memory indexes cost, per message held.

The log keeps one SQLite row per committed batch and rebuilds its per-message indexes
(ids, by topic, by origin, by seq) from the rows' headers when it opens
(:mod:`hearthnet.pubsub.logstore`). This writes a log of ``--messages`` messages
directly as rows of ``--batch`` (256-byte bodies over ``--topics`` topics; bodies are not
read at open, so their content does not matter), then times ``MessageLog.open`` and
measures the resident memory it added (``/proc/self/statm``), per message.

Run: python -m bench.bench_log_open [--messages 1000000 --batch 125 --topics 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import sqlite3
import tempfile
import time
from pathlib import Path

from bench.common import save
from hearthnet.identity import KeyPair
from hearthnet.ids import new_ulid
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.logindex import Head
from hearthnet.pubsub.logstore import INSERT_ROW, SCHEMA, Row


def rss_bytes() -> int:
    """The process's resident set size."""
    with open("/proc/self/statm", encoding="ascii") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def write_log(path: Path, keys: KeyPair, messages: int, batch: int, topics: int) -> None:
    """A log of ``messages`` messages of ours, in rows of ``batch``."""
    body = b"x" * 256
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.executescript("PRAGMA journal_mode=WAL; PRAGMA synchronous=OFF;" + SCHEMA)
        conn.execute("BEGIN")
        ts = 1_700_000_000_000
        for key in range(1, messages + 1, batch):
            n = min(batch, messages + 1 - key)
            heads = [
                Head(
                    s, new_ulid(ts + s), f"bench.t{s % topics}", keys.node_id, s, ts + s, None, 256
                )
                for s in range(key, key + n)
            ]
            row = Row(key, keys.node_id, key, n, heads, [body] * n, b"r" * 32, "sig", b"l" * 32 * n)
            conn.execute(INSERT_ROW, row.params())
        conn.execute("COMMIT")


async def measure(messages: int, batch: int, topics: int) -> dict[str, float]:
    """Open time and added RSS for a log of ``messages``."""
    keys = KeyPair.generate()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "log.db"
        write_log(path, keys, messages, batch, topics)
        gc.collect()
        before = rss_bytes()
        log = MessageLog(path, keys, synchronous="normal")
        t0, c0 = time.perf_counter(), time.process_time()
        await log.open()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        gc.collect()
        added = rss_bytes() - before
        held = len(log.index)
        await log.close()
    return {
        "messages": held,
        "open_s": round(wall, 3),
        "open_cpu_s": round(cpu, 3),
        "rss_added_mib": round(added / 2**20, 1),
        "bytes_per_message": round(added / max(1, held), 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--messages", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=125)
    p.add_argument("--topics", type=int, default=1000)
    p.add_argument("--name", default="log_open")
    args = p.parse_args()
    save(args.name, asyncio.run(measure(args.messages, args.batch, args.topics)))


if __name__ == "__main__":
    main()
