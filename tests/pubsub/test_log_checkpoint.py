"""The log's WAL is checkpointed by a job of its own in the writer thread, never inside a
commit on the event loop (hearthnet/pubsub/logcheckpoint.py). Real SQLite files."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

from hearthnet.pubsub.logcheckpoint import WAL_BACKSTOP_BYTES
from hearthnet.pubsub.logstore import SqliteWriter
from tests.helpers import wait_until

ROW = bytes(12_000)  # under a 16 KiB page: one row, one leaf page
SQLITE_MARK_BYTES = 4_096_000  # where SQLite's own automatic checkpoint sat before


def _size(path: Path | str) -> int:
    return os.stat(path).st_size


def _insert(conn: sqlite3.Connection) -> None:
    conn.execute("INSERT INTO t (b) VALUES (?)", (ROW,))  # autocommit: a commit each


def _rows_in_database_file(path: Path) -> int:
    """Rows the database file itself holds, the WAL left unread (``immutable``)."""
    conn = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM t").fetchone()[0])
    finally:
        conn.close()


async def _checkpointed(writer: SqliteWriter, jobs: int) -> None:
    """Wait (bounded) until ``jobs`` checkpoint jobs were queued, then until the thread
    is done with them (a job queued behind returns after them)."""
    await wait_until(lambda: writer.checkpoints.queued >= jobs, 30, "a checkpoint job")
    await writer.run(lambda conn: None)


async def test_commits_on_the_loop_never_copy_the_wal(tmp_path: Path) -> None:
    """More than SQLite's old checkpoint mark committed on the loop (``run_here``, as a
    lone batch with sync=normal is) leaves the database file as it was: the WAL holds it
    all until the checkpoint job."""
    path = tmp_path / "log.db"
    writer = SqliteWriter(path, "NORMAL", checkpoint_every_s=3600)
    await writer.run(lambda conn: conn.execute("CREATE TABLE t (b BLOB)"))
    await _checkpointed(writer, 0)
    before = _size(path)
    wal_path = f"{path}-wal"
    for _ in range(2_000):  # bounded: ~2-3 pages of WAL a commit
        writer.run_here(_insert)
        if _size(wal_path) > SQLITE_MARK_BYTES * 3 // 2:
            break
    wal = _size(wal_path)
    after = _size(path)
    await writer.close()
    assert SQLITE_MARK_BYTES < wal < WAL_BACKSTOP_BYTES
    assert before == after


async def test_the_checkpoint_job_copies_the_wal_and_the_wal_starts_again(
    tmp_path: Path,
) -> None:
    """After writes the checkpoint job runs in the writer thread: the database file holds
    every row, and the next commit writes the WAL from its start again."""
    path = tmp_path / "log.db"
    writer = SqliteWriter(path, "FULL", checkpoint_every_s=0.05)
    await writer.run(lambda conn: conn.execute("CREATE TABLE t (b BLOB)"))
    for _ in range(100):
        await writer.run(_insert)
    queued = writer.checkpoints.queued
    await _checkpointed(writer, queued + 1)
    in_file = _rows_in_database_file(path)
    await writer.run(_insert)  # starts the WAL again: frames from its beginning

    def frames(conn: sqlite3.Connection) -> int:
        busy, log_frames, _done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        assert busy == 0
        return int(log_frames)

    frames_after = await writer.run(frames)
    await writer.close()
    assert in_file == 100
    assert 0 < frames_after <= 4


async def test_no_checkpoint_job_while_nothing_is_written(tmp_path: Path) -> None:
    """An idle log queues no job: one checkpoint after the last write, then none."""
    path = tmp_path / "log.db"
    writer = SqliteWriter(path, "NORMAL", checkpoint_every_s=0.02)
    await writer.run(lambda conn: conn.execute("CREATE TABLE t (b BLOB)"))
    await writer.run(_insert)
    await wait_until(lambda: writer.checkpoints.queued >= 1, 30, "a checkpoint job")
    await asyncio.sleep(0.3)
    queued = writer.checkpoints.queued
    await asyncio.sleep(0.3)
    later = writer.checkpoints.queued
    await writer.close()
    assert 1 <= queued == later


async def test_with_full_sqlite_checkpoints_inside_the_writer_threads_commits(
    tmp_path: Path,
) -> None:
    """With sync=full no commit runs on the loop: no checkpoint job, and SQLite's own
    checkpoint copies the WAL inside the thread's commit that takes it past its mark."""
    path = tmp_path / "log.db"
    writer = SqliteWriter(path, "FULL")
    await writer.run(lambda conn: conn.execute("CREATE TABLE t (b BLOB)"))
    before = _size(path)
    for _ in range(2_000):  # bounded: past the mark after ~100-150 commits
        await writer.run(_insert)
        if _size(path) > before:
            break
    after = _size(path)
    await asyncio.sleep(0.3)
    queued = writer.checkpoints.queued
    await writer.close()
    assert (queued, after > before) == (0, True)
