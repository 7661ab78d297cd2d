"""The whole log's message cap (pubsub.max_messages) on real SQLite: oldest first, each
topic's newest kept without holes, durable consumers' allowance, a pass started by commits."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

from hearthnet.config import PubSubSection
from hearthnet.pubsub.consumers_http import describe
from hearthnet.pubsub.log import ConsumerRecord
from hearthnet.pubsub.logprune import ChunkSize
from hearthnet.pubsub.logread import READ_LAST_SEARCH, TopicMask
from tests.helpers import wait_until
from tests.pubsub.test_log import make_service, opened, publish_many
from tests.pubsub.test_log_batches import verified


async def test_message_cap_deletes_the_oldest_across_topics(tmp_path: Path) -> None:
    """30 messages on two interleaved topics, cap 10: the 20 oldest go; each topic keeps its
    newest 5, contiguous, and history pages forward over them with nothing missing."""
    async with opened(tmp_path / "log.db") as log:
        service = make_service(log, max_log_messages=10)
        for i in range(15):
            await log.publish(topic="a", msg_type="m", data=i)
            await log.publish(topic="b", msg_type="m", data=i)
        deleted = await service.apply_retention()
        a, a_more = await log.reader.history("a", since_seq=0, limit=50)
        b, _ = await log.reader.history("b", since_seq=0, limit=50)
        after_a, _ = await log.reader.history("a", since_seq=25, limit=50)
    assert (20, 10, [21, 23, 25, 27, 29], [22, 24, 26, 28, 30], False, [27, 29], (5, 5)) == (
        deleted,
        len(log.index),
        [m.seq for m in a],
        [m.seq for m in b],
        a_more,
        [m.seq for m in after_a],
        (log.topics["a"].messages, log.topics["b"].messages),
    )


async def test_message_cap_leaves_what_a_durable_consumer_holds(tmp_path: Path) -> None:
    """Unacked messages survive the message cap up to the consumer's allowance, as they
    survive the byte cap; beyond it, a gap is noted."""
    async with opened(tmp_path / "log.db") as log:
        service = make_service(log, PubSubSection(consumer_max_held=3), max_log_messages=2)
        log.save_consumer(ConsumerRecord("me", "work", ("jobs",), 0))
        for i in range(6):
            await log.publish(topic="jobs", msg_type="m", data=i)
        await service.apply_retention()
        held, _ = await log.reader.history("jobs", limit=50)
        record = log.consumers.get(("me", "work"))
    assert ([1, 2, 3, 5, 6], (4, 4)) == ([m.seq for m in held], record.lost if record else None)


async def test_a_commit_over_the_cap_starts_a_pass_before_the_interval(tmp_path: Path) -> None:
    """With passes an hour apart, the commit that takes the log 10% over its cap (cap 20:
    the 22nd message) starts a pass at once, which brings it back to the cap."""
    async with opened(tmp_path / "log.db") as log:
        service = make_service(log, PubSubSection(retention_interval_s=3600), max_log_messages=20)
        retention = service.retention_pass
        log.listeners.append(retention.on_commit)
        task = asyncio.get_running_loop().create_task(retention.loop())
        try:
            for i in range(21):
                await log.publish(topic="a", msg_type="m", data=i)
            set_at_21 = retention.over_cap.is_set()
            await log.publish(topic="a", msg_type="m", data=21)
            await wait_until(lambda: len(log.index) == 20, 30.0, "a pass down to the cap")
            kept, _ = await log.reader.history("a", limit=50)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert (False, [*range(3, 23)]) == (set_at_21, [m.seq for m in kept])


async def test_a_prefix_deletes_whole_rows_and_rewrites_the_one_it_cuts(tmp_path: Path) -> None:
    """Two batches of 4 (rows 1 and 5): everything below seq 3, then below 7, goes; the
    row cut in two keeps its other messages provable, and a restart rebuilds the same
    indexes and stats from the rows."""
    path = tmp_path / "log.db"
    async with opened(path) as log:
        await publish_many(log, 4)
        await publish_many(log, 4, topic="chat.b")
        first = await log.delete(before_seq=3)
        with contextlib.closing(sqlite3.connect(path)) as conn:
            after_first = conn.execute("SELECT seq, first, n FROM batches").fetchall()
        second = await log.delete(before_seq=7)
        with contextlib.closing(sqlite3.connect(path)) as conn:
            after_second = conn.execute("SELECT seq, first, n FROM batches").fetchall()
        read, _ = await log.reader.history("chat.b", limit=50)
    async with opened(path) as again:
        reread, _ = await again.reader.history("chat.b", limit=50)
        held = (len(again.index), list(again.index.rows), again.topics.get("chat.a"))
    assert (
        (2, [(1, 1, 4), (5, 5, 4)]),
        (4, [(5, 5, 4)]),
        [7, 8],
        [7, 8],
        [7, 8],
        (2, [5], None),
    ) == (
        (first, after_first),
        (second, after_second),
        [m.seq for m in read],
        [m.seq for m in reread],
        [verified(m.message.raw).origin_seq for m in reread],
        held,
    )


async def test_the_retention_loop_ends_when_cancelled_as_a_commit_starts_a_pass(
    tmp_path: Path,
) -> None:
    """A cancel (the node stopping) in the loop turn a commit starts a pass ends the loop;
    asyncio.wait_for around the event returned its result and swallowed the cancel."""
    async with opened(tmp_path / "log.db") as log:
        retention = make_service(log).retention_pass
        task = asyncio.get_running_loop().create_task(retention.loop())
        for _ in range(3):
            await asyncio.sleep(0)  # the loop waits for a pass to be due
        retention.over_cap.set()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=5.0)
        if not done:
            task.cancel()
    assert (True, True) == (task in done, task.cancelled())


async def test_a_long_prefix_goes_in_chunks_with_commits_in_between(tmp_path: Path) -> None:
    """Retention deletes a prefix a chunk a transaction: a publish made while it runs is
    committed between two chunks, not after the whole prefix (spec §11's p99)."""
    async with opened(tmp_path / "log.db") as log:
        for _ in range(8):
            await publish_many(log, 5)  # seqs 1..40, rows of 5
        assert log._pruner is not None
        log._pruner.prefix_chunk = ChunkSize(5, low=5, high=5)
        delete = asyncio.get_running_loop().create_task(log.delete(before_seq=36))
        await asyncio.sleep(0)  # its first transaction is under way
        late = await log.publish(topic="chat.b", msg_type="m", data={})
        pending_then = not delete.done()
        deleted = await delete
        left, _ = await log.reader.history("chat.a", limit=50)
    assert late is not None
    assert (35, True, 41, [36, 37, 38, 39, 40]) == (
        deleted,
        pending_then,
        late.seq,
        [m.seq for m in left],
    )


async def test_a_prefix_chunk_ends_at_a_row_so_only_the_last_row_is_rewritten(
    tmp_path: Path,
) -> None:
    """Chunks of 15 over rows of 10 end at the rows' first seqs (whole rows go by the range
    DELETE); only the row that ``before_seq`` itself cuts is rewritten."""
    statements: list[str] = []
    async with opened(tmp_path / "log.db") as log:
        for _ in range(4):
            await publish_many(log, 10)  # seqs 1..40, rows 1, 11, 21, 31
        assert log._pruner is not None
        assert log._writer is not None
        log._pruner.prefix_chunk = ChunkSize(15, low=15, high=15)
        await log._writer.run(lambda conn: conn.set_trace_callback(statements.append))
        deleted = await log.delete(before_seq=36)
        await log._writer.run(lambda conn: conn.set_trace_callback(None))
        left, _ = await log.reader.history("chat.a", limit=50)
    cuts = [s.split(" WHERE ")[1] for s in statements if s.startswith("DELETE FROM batches")]
    rewrites = [s for s in statements if s.startswith("UPDATE batches")]
    assert (35, ["seq < 2", "seq < 12", "seq < 31"], 1, [36, 37, 38, 39, 40]) == (
        deleted,
        cuts,
        len(rewrites),
        [m.seq for m in left],
    )


def test_chunk_size_fits_the_target_time_grows_at_most_twofold_and_stays_in_bounds() -> None:
    """A slow transaction shrinks the next (to what fits in the target), a fast one grows it
    no more than twice, and the size never leaves its bounds."""
    chunk = ChunkSize(2_000, low=256, high=20_000, target_s=0.005)
    seen = []
    for count, elapsed in [(2_000, 0.050), (500, 0.0001), (1_000, 0.0001), (2_000, 1.0)]:
        chunk.took(count, elapsed)
        seen.append(chunk.size)
    chunk.took(0, 0.0)  # nothing deleted: nothing learnt
    assert [256, 512, 1_024, 256, 256] == [
        *seen,
        chunk.size,
    ]


async def test_retention_commits_without_fsync_and_publishes_with_it(tmp_path: Path) -> None:
    """With ``sync = "full"`` retention's transactions run with ``synchronous=NORMAL``
    (no fsync of their own) and the connection is ``FULL`` again for the next publish."""
    statements: list[str] = []
    async with opened(tmp_path / "log.db", sync="full") as log:
        await publish_many(log, 4)
        await publish_many(log, 4, topic="chat.b")
        assert log._writer is not None
        await log._writer.run(lambda conn: conn.set_trace_callback(statements.append))
        deleted = await log.delete(before_seq=3)
        await publish_many(log, 1)
        mode = await log._writer.run(lambda conn: conn.execute("PRAGMA synchronous").fetchone())
        await log._writer.run(lambda conn: conn.set_trace_callback(None))
    steps = [
        s if s.startswith("PRAGMA") else s.split()[0]
        for s in statements
        if s.startswith(("PRAGMA synchronous=", "DELETE", "COMMIT", "INSERT INTO batches"))
    ]
    assert (2, (2,)) == (deleted, mode)
    # the lone publish after it is one INSERT in autocommit, with the fsync of FULL
    assert [
        "PRAGMA synchronous=NORMAL",
        "DELETE",
        "COMMIT",
        "PRAGMA synchronous=FULL",
        "INSERT",
    ] == steps


async def test_the_log_zeroes_deleted_content_only_where_no_page_more_is_written(
    tmp_path: Path,
) -> None:
    """The writer's connection runs with ``secure_delete = FAST`` (2), whatever the build's
    default: ``ON`` writes every page retention frees again, as zeros."""
    async with opened(tmp_path / "log.db", sync="full") as log:
        await publish_many(log, 1)
        assert log._writer is not None
        mode = await log._writer.run(lambda conn: conn.execute("PRAGMA secure_delete").fetchone())
    assert (2,) == mode


async def test_a_message_past_its_ttl_goes_though_a_consumer_has_not_acked_it(
    tmp_path: Path,
) -> None:
    """A message whose ttl ran out is delivered to no one, so a durable consumer that
    has not acked it does not keep it, and does not hear of it as lost; the consumer's
    live messages stay."""
    async with opened(tmp_path / "log.db") as log:
        service = make_service(log)
        log.save_consumer(ConsumerRecord("me", "work", ("jobs",), 0))
        await log.publish(topic="jobs", msg_type="m", data="short", ttl_s=1)
        await log.publish(topic="jobs", msg_type="m", data="long")
        deleted = await service.apply_retention(log.topics["jobs"].last_ts + 5_000)
        held, _ = await log.reader.history("jobs", limit=50)
        record = log.consumers.get(("me", "work"))
    assert (1, [2], None) == (deleted, [m.seq for m in held], record.lost if record else "gone")


async def test_a_consumer_learns_of_no_loss_it_acked_or_after_it_was_deleted(
    tmp_path: Path,
) -> None:
    """Holds are found a slice at a time, so a consumer may ack or be deleted before the
    pass deletes: the loss it hears of starts past its cursor of that moment, and a
    deleted consumer hears of none (its record is not written back)."""
    async with opened(tmp_path / "log.db") as log:
        service = make_service(log)
        acked = ConsumerRecord("me", "acked", ("jobs",), 5)
        log.save_consumer(acked)
        service.consumers.lose(acked, 3, 8)
        service.consumers.lose(acked, 1, 4)
        gone = ConsumerRecord("me", "gone", ("jobs",), 0)
        log.save_consumer(gone)
        await service.consumers.delete("me", "gone", lambda _sub: None)
        service.consumers.lose(gone, 1, 4)
    assert ((6, 8), None, None) == (acked.lost, gone.lost, log.consumers.get(("me", "gone")))


async def test_a_wildcard_consumer_over_more_topics_than_are_listed_holds_and_counts(
    tmp_path: Path,
) -> None:
    """Over a log of more topics than a wildcard's are listed for (READ_LAST_SEARCH), a
    consumer of ``room.*.alert`` that acked nothing keeps its first 3 alerts past the cap
    (and those among the cap's newest) and hears of those between as lost; the listing
    counts its pending before and after the pass, whose compaction numbered the topics
    left afresh (a topic mask made before is made again)."""
    cap = READ_LAST_SEARCH + 100
    async with opened(tmp_path / "log.db") as log:
        service = make_service(log, PubSubSection(consumer_max_held=3), max_log_messages=cap)
        log.save_consumer(ConsumerRecord("me", "alerts", ("room.*.alert",), 0))
        topics = [f"room.{i}.{'alert' if i % 2000 == 1 else 'msg'}" for i in range(5 * cap // 2)]
        for at in range(0, len(topics), 10_000):  # under the log's bound on waiting publishes
            await asyncio.gather(
                *(log.publish(topic=t, msg_type="m", data=1) for t in topics[at : at + 10_000])
            )
        record, masks = log.consumers[("me", "alerts")], dict[tuple[str, ...], TopicMask]()
        pending = describe(service.consumers, record, masks)["pending"]
        await service.apply_retention()
        kept = [seq for seq, *_ in log.index.live(0) if topics[seq - 1].endswith(".alert")]
        numbers = len(log.index.topic_names)
        pending_after = describe(service.consumers, record, masks)["pending"]
    alerts = [seq for seq, t in enumerate(topics, 1) if t.endswith(".alert")]
    newest = [seq for seq in alerts if seq > len(topics) - cap]
    lost = [seq for seq in alerts[3:] if seq not in newest]
    # the topics left: the newest ``cap`` messages' and the 3 alerts held before them
    assert (len(alerts), alerts[:3] + newest, (lost[0], lost[-1]), len(kept), cap + 3) == (
        pending,
        kept,
        record.lost,
        pending_after,
        numbers,
    )
