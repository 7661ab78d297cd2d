"""When the message log's WAL is checkpointed (spec §6.4, §11).

SQLite's automatic checkpoint runs inside the commit that takes the WAL past its mark:
that commit copies the WAL's pages into the database file and syncs both files before it
returns. With ``pubsub.sync = "normal"`` a lone small batch is committed on the event
loop (``MessageLog.end_turn``), so half or more of a busy log's checkpoints ran there,
and every one held the commit that carried it: its publishers' answers, its fan-out and
(on the loop) everything else the node does waited for the copy and two ``fsync`` calls:
8-16 ms (p50) on a loaded machine, up to ~1 s when other work keeps the disk busy
(docs/benchmarks.md, "The first round after a start, and checkpoints off the event
loop").

With ``normal`` a checkpoint is a job of its own for the log's writer thread, queued at
most :data:`CHECKPOINT_EVERY_S` after a write and never on the event loop: the commit before
it is answered and delivered first, and while it runs the loop goes on (commits queued
meanwhile go to the writer thread, after it, in their order). Nothing writes beside it,
so it copies every frame and the next commit starts the WAL again from its beginning.
SQLite's own automatic checkpoint stays as a backstop at :data:`WAL_BACKSTOP_BYTES`
(four times the usual mark), for a WAL that outgrows the jobs. With ``full`` every commit
runs in the writer thread already, and SQLite checkpoints inside the commit that takes
the WAL past :data:`WAL_MARK_BYTES`, as before.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

# How long after a write the checkpoint job is queued (one per interval at most): ~1-2 MB
# of WAL at 2,000 publishes/s with `normal` (SQLite's 4 MB mark was reached every
# 0.5-0.7 s). Each job then took 2.6-4.8 ms (p50) against 10-16 ms for a checkpoint
# inside a commit; a job every second copied ~7 MB in ~14 ms, and the commits queued
# behind it waited that long (docs/benchmarks.md, "The first round after a start, and
# checkpoints off the event loop").
CHECKPOINT_EVERY_S = 0.25
# SQLite's automatic checkpoint: with `full`, where no commit runs on the loop, its mark
# (SQLite's default of 1,000 pages of 4 KiB, whatever the log's page size); with jobs, a
# backstop at four times that. Jobs with `full` too, every 0.25 s, put four times as many
# database fsyncs in front of its commits: p99 at 2,000 msg/s worse in 5 of 6 rounds.
WAL_MARK_BYTES = 4_096_000
WAL_BACKSTOP_BYTES = 4 * WAL_MARK_BYTES

log = logging.getLogger("hearthnet.pubsub.log")


def checkpoint(conn: sqlite3.Connection | None, path: Path) -> None:
    """In the writer thread: copy the WAL into the database file (``PASSIVE``: readers
    holding older pages are not waited for; what they hold is copied next time)."""
    if conn is None:
        return
    try:
        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
    except sqlite3.Error as exc:  # the next one tries again; the backstop stays
        log.warning("WAL checkpoint of %s failed: %s", path, exc)


class CheckpointTimer:
    """Queues a checkpoint job (``queue_job``, called on the event loop) ``every_s``
    after the first write since the last one; nothing while nothing is written, nothing
    at all for ``every_s`` None."""

    def __init__(self, queue_job: Callable[[], None], every_s: float | None):
        self.queue_job = queue_job
        self.every_s = every_s or 0.0
        self._due: asyncio.TimerHandle | None = None
        self._closed = every_s is None  # no jobs: SQLite checkpoints inside commits
        self.queued = 0  # checkpoint jobs queued so far

    def wrote(self) -> None:
        """On the loop, after a job of the writer's: a checkpoint is due ``every_s`` from
        now, unless one is due already."""
        if self._due is None and not self._closed:
            self._due = asyncio.get_running_loop().call_later(self.every_s, self._fire)

    def _fire(self) -> None:
        self._due = None
        if not self._closed:
            self.queued += 1
            self.queue_job()

    def close(self) -> None:
        """No checkpoint job any more (the writer closes: its last connection checkpoints
        the whole WAL as it closes)."""
        self._closed = True
        if self._due is not None:
            self._due.cancel()
            self._due = None
