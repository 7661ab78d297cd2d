"""Groups of publishes answered in their commit's loop turn, and the writer thread's trips
(spec §6.4)."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from pathlib import Path

import pytest

from hearthnet.errors import WireError
from hearthnet.pubsub.envelope import Message, StoredMessage
from hearthnet.pubsub.logcommit import Outcome
from hearthnet.pubsub.logstore import SqliteWriter
from tests.pubsub.test_log import PEER, opened


def _seen(outcome: Outcome) -> object:
    """An outcome as the tests compare it: a seq, an error code, or None."""
    if isinstance(outcome, StoredMessage):
        return outcome.seq
    return outcome.code if isinstance(outcome, WireError) else outcome


@pytest.mark.parametrize("sync", ["normal", "full"])
async def test_answers_come_after_the_commit_and_before_fan_out(tmp_path: Path, sync: str) -> None:
    """With ``answer`` there is no future: a group of publishes is told its outcomes, in
    order (an unsignable one its error), before the commit listeners run; an answer that
    raises stops neither the next group's answer nor the listeners."""
    events: list[tuple[str, object]] = []
    committed = asyncio.Event()

    def listener(batch: list[StoredMessage]) -> None:
        events.append(("commit", [s.seq for s in batch]))
        committed.set()

    def failing(outcomes: list[Outcome]) -> None:
        events.append(("answer", [_seen(o) for o in outcomes]))
        raise RuntimeError("a broken session")

    async with opened(tmp_path / "log.db", sync) as log:
        log.listeners.append(listener)
        returned = [
            log.publish_many([("a", "m", 0, None, None)], answer=failing),
            log.publish_many(
                [("a", "m", 2**53 + 1, None, None), ("a", "m", 2, None, None)],
                answer=lambda outcomes: events.append(("answer", [_seen(o) for o in outcomes])),
            ),
        ]
        await asyncio.wait_for(committed.wait(), 10)
    assert (
        [None, None],
        [("answer", [1]), ("answer", ["bad_request", 2]), ("commit", [1, 2])],
    ) == (returned, events)


async def test_the_writer_thread_returns_results_and_errors_and_stops_on_close(
    tmp_path: Path,
) -> None:
    """A job's result and a job's exception reach the task that awaits it, the writer goes
    on after a failed job, and close stops its thread."""
    writer = SqliteWriter(tmp_path / "w.db", "NORMAL")
    first = await writer.run(lambda conn: conn.execute("SELECT 41 + 1").fetchone()[0])
    with pytest.raises(sqlite3.OperationalError):
        await writer.run(lambda conn: conn.execute("SELECT * FROM nowhere"))
    after = await writer.run(lambda conn: conn.execute("SELECT 7").fetchone()[0])
    thread = writer._thread
    await writer.close()
    assert thread is not None
    await asyncio.get_running_loop().run_in_executor(None, thread.join, 10)
    assert (42, 7, False, False) == (first, after, thread.is_alive(), writer.idle)


async def test_a_cancelled_job_keeps_the_writer_busy_until_its_thread_is_done(
    tmp_path: Path,
) -> None:
    """A job whose waiter was cancelled keeps the writer busy (nothing runs on the
    connection beside it) until the thread is done with it."""
    writer = SqliteWriter(tmp_path / "w.db", "NORMAL")
    await writer.run(lambda conn: None)
    release = threading.Event()
    task = asyncio.get_running_loop().create_task(writer.run(lambda conn: release.wait(10)))
    await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    busy_after_cancel = not writer.idle
    release.set()
    await writer.run(lambda conn: None)  # behind it in the queue
    idle_after = writer.idle
    await writer.close()
    assert (True, True) == (busy_after_cancel, idle_after)


async def test_a_group_split_over_commits_is_answered_once_in_order(tmp_path: Path) -> None:
    """A group larger than max_batch commits over several commits, and a group retried
    message by message after its batch failed (a peer's message SQLite cannot store)
    keeps its unsignable publish's error: each group gets every outcome once, in order."""
    body = Message.unsigned(
        PEER.node_id, topic="chat.a", msg_type="m", data={}, origin_seq=2**64, ts=1
    )
    unstorable = Message.trusted({**body, "sig": "ed25519:x"}, b"{}")
    sizes: list[int] = []
    async with opened(tmp_path / "log.db") as log:
        log.listeners.append(lambda batch: sizes.extend([len(batch)] if batch else []))
        log.max_batch = 4
        big = await log.publish_many([("chat.a", "m", i, None, None) for i in range(10)])
        log.max_batch = 1024
        group = log.publish_many(
            [
                ("chat.a", "m", {"i": 0}, None, None),
                ("chat.a", "m", 2**53 + 1, None, None),
                ("chat.a", "m", {"i": 2}, None, None),
            ]
        )
        bad = log.ingest(unstorable, source=PEER.node_id)
        retried = await group
        refused = await asyncio.gather(bad, return_exceptions=True)
    assert (
        [*range(1, 11)],
        [4, 4, 2],
        [11, "bad_request", 12],
        ["internal_error"],
        [1, 1],
    ) == (
        [_seen(o) for o in big],
        sizes[:3],
        [_seen(o) for o in retried],
        [getattr(e, "code", e) for e in refused],
        sizes[3:],
    )
