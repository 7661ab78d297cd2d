"""The message log on real SQLite: group commit, seq, epoch, dedupe, history, retention."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from hearthnet.config import PubSubSection
from hearthnet.errors import Unavailable, WireError
from hearthnet.identity import KeyPair
from hearthnet.metrics import MetricsRegistry
from hearthnet.pubsub.access import AccessPolicy
from hearthnet.pubsub.envelope import Message, StoredMessage
from hearthnet.pubsub.log import INLINE_MAX, READ_LAST_QUERIES, ConsumerRecord, MessageLog
from hearthnet.pubsub.retention import RetentionPolicy, RetentionRule
from hearthnet.pubsub.retention_plan import SCAN_MAX as AGED_PAGE
from hearthnet.pubsub.service import PubSub
from hearthnet.pubsub.topics import TopicPattern

KEYS = KeyPair.from_seed(b"\x50" * 32)
PEER = KeyPair.from_seed(b"\x51" * 32)


@contextlib.asynccontextmanager
async def opened(
    path: Path, sync: str = "normal", keys: KeyPair = KEYS
) -> AsyncIterator[MessageLog]:
    """An open log (of ``keys``' node) with its flush loop running."""
    log = MessageLog(path, keys, synchronous=sync)
    await log.open()
    task = asyncio.get_running_loop().create_task(log.run())
    try:
        yield log
    finally:
        await log.close()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def publish_many(log: MessageLog, n: int, topic: str = "chat.a") -> list[StoredMessage]:
    """Queue n publishes at once and wait for all."""
    futures = [log.publish(topic=topic, msg_type="m", data={"i": i}) for i in range(n)]
    results = await asyncio.gather(*futures)
    return [r for r in results if r is not None]


async def test_group_commit_numbers_in_order(tmp_path: Path) -> None:
    """Publishes queued together commit in one batch with seq and origin_seq 1..n."""
    async with opened(tmp_path / "log.db") as log:
        stored = await publish_many(log, 50)
    assert ([*range(1, 51)], [*range(1, 51)], 1) == (
        [s.seq for s in stored],
        [s.message.origin_seq for s in stored],
        log.batches,
    )


async def test_a_committed_batch_is_one_row_read_back_whole(tmp_path: Path) -> None:
    """A batch of 519 publishes is one commit and one row; all of it reads back, in
    order, with the exact bytes that fan-out delivered."""
    n = 519
    async with opened(tmp_path / "log.db") as log:
        stored = await publish_many(log, n)
        batches = log.batches
        back = await log.reader.read_matching(
            [TopicPattern.parse("chat.a")], after_seq=0, upto_seq=n, limit=n
        )
    with contextlib.closing(sqlite3.connect(tmp_path / "log.db")) as conn:
        rows = conn.execute("SELECT seq, n FROM batches").fetchall()
    assert ([*range(1, n + 1)], 1, [(1, n)], [s.message.raw for s in stored]) == (
        [s.seq for s in back],
        batches,
        rows,
        [s.message.raw for s in back],
    )


async def test_publish_resolves_only_after_commit(tmp_path: Path) -> None:
    """The future is pending until the flush loop committed it; on_commit saw it first."""
    seen: list[int] = []
    async with opened(tmp_path / "log.db") as log:
        log.listeners.append(lambda batch: seen.extend(s.seq for s in batch))
        fut = log.publish(topic="a", msg_type="m", data=1)
        pending_before = not fut.done()
        stored = await fut
    assert (True, [1], 1) == (pending_before, seen, stored.seq if stored else None)


async def test_lone_small_batches_commit_on_the_loop_only_with_sync_normal(
    tmp_path: Path,
) -> None:
    """With sync normal a lone publish commits on the event loop, a large batch in the
    writer thread; with full every batch goes to the thread; all of it is read back."""
    counts: list[tuple[object, int]] = []
    for sync in ("normal", "full"):
        async with opened(tmp_path / f"{sync}.db", sync) as log:
            for i in range(3):
                await log.publish(topic="a", msg_type="m", data=i)
            await publish_many(log, INLINE_MAX + 1)
            counts.append((log.batches, log.inline_batches))
        async with opened(tmp_path / f"{sync}.db", sync) as log:
            back = await log.reader.read_matching(
                [TopicPattern.parse("a")], after_seq=0, upto_seq=3, limit=10
            )
            counts.append(([s.message.data for s in back], log.head_seq))
    head = 3 + INLINE_MAX + 1
    assert [(4, 3), ([0, 1, 2], head), (4, 0), ([0, 1, 2], head)] == counts


async def test_end_turn_commits_a_lone_group_in_the_calling_turn(tmp_path: Path) -> None:
    """With sync normal, ``end_turn`` after ``publish_many`` commits and answers the group
    before it returns (no loop turn of its own); a second call, or one with nothing
    queued, does nothing."""
    answers: list[list[int]] = []
    async with opened(tmp_path / "log.db") as log:
        log.end_turn()
        log.publish_many(
            [("a", "m", i, None, None) for i in range(3)],
            answer=lambda outs: answers.append([o.seq for o in outs]),  # type: ignore[union-attr]
        )
        log.end_turn()
        log.end_turn()
        seen = (list(answers), log.batches, log.inline_batches)
        await asyncio.sleep(0)
    assert ([[1, 2, 3]], 1, 1, [[1, 2, 3]]) == (*seen, answers)


async def test_restart_keeps_epoch_head_and_origin_seq(tmp_path: Path) -> None:
    """Reopening continues numbering; the epoch is fixed when the store is created."""
    async with opened(tmp_path / "log.db") as log:
        await publish_many(log, 3)
        epoch = log.epoch
    async with opened(tmp_path / "log.db") as log:
        again = await publish_many(log, 1)
        assert (epoch, 4, 4) == (log.epoch, again[0].seq, again[0].message.origin_seq)
    async with opened(tmp_path / "other.db") as fresh:
        assert epoch != fresh.epoch


async def test_origin_seq_survives_retention_of_our_newest_messages(tmp_path: Path) -> None:
    """Peers dedupe by (origin, origin_seq): reusing a number after a purge would be fatal."""
    async with opened(tmp_path / "log.db") as log:
        stored = await publish_many(log, 3)
        assert 3 == await log.delete([s.seq for s in stored])
    async with opened(tmp_path / "log.db") as log:
        again = await publish_many(log, 1)
        assert 4 == again[0].message.origin_seq


async def test_publishes_commit_between_retention_chunks(tmp_path: Path) -> None:
    """A large retention pass does not hold publishes until it is done."""
    async with opened(tmp_path / "log.db") as log:
        stored = await publish_many(log, 5000)
        deleting = asyncio.get_running_loop().create_task(log.delete([s.seq for s in stored]))
        await asyncio.sleep(0)  # the first chunk holds the write lock now
        fresh = await log.publish(topic="chat.a", msg_type="m", data="during")
        during = not deleting.done()
        assert (True, 5000, 5001) == (during, await deleting, fresh.seq if fresh else None)
        assert 1 == log.topics["chat.a"].messages


async def test_ingest_deduplicates_by_id_also_after_restart(tmp_path: Path) -> None:
    """A peer's message stored once; the same id again (even after restart) is a duplicate."""
    msg = Message.create(PEER, topic="chat.a", msg_type="m", data=1, origin_seq=7, ts=5)
    async with opened(tmp_path / "log.db") as log:
        first = await log.ingest(msg)
        second = await log.ingest(msg)
    async with opened(tmp_path / "log.db") as log:
        third = await log.ingest(msg)
    assert (1, None, None) == (first.seq if first else None, second, third)


async def test_history_paging(tmp_path: Path) -> None:
    """Forward from since_seq and backward from before_seq, oldest first, with has_more."""
    async with opened(tmp_path / "log.db") as log:
        for i in range(10):
            await log.publish(topic="t.a" if i % 2 == 0 else "t.b", msg_type="m", data=i)
        latest, more_latest = await log.reader.history("t.a", limit=3)
        forward, more_forward = await log.reader.history("t.a", since_seq=1, limit=2)
        back, more_back = await log.reader.history("t.a", before_seq=5, limit=5)
    assert ([5, 7, 9], True, [3, 5], True, [1, 3], False) == (
        [m.seq for m in latest],
        more_latest,
        [m.seq for m in forward],
        more_forward,
        [m.seq for m in back],
        more_back,
    )


async def test_expired_messages_are_never_read(tmp_path: Path) -> None:
    """A message past its own ttl_s is gone for every reader (history both ways, backlog,
    last N) before retention deletes it (spec §6.3)."""
    async with opened(tmp_path / "log.db") as log:
        await log.publish(topic="t.x", msg_type="m", data="short", ttl_s=1)
        await log.publish(topic="t.x", msg_type="m", data="kept")
        await log.publish(topic="t.y", msg_type="m", data="short", ttl_s=1)
        fresh, _ = await log.reader.history("t.x")
        await asyncio.sleep(1.1)
        pattern = [TopicPattern.parse("t.*")]
        latest, _ = await log.reader.history("t.x")
        forward, _ = await log.reader.history("t.x", since_seq=0)
        backlog = await log.reader.read_matching(pattern, after_seq=0, upto_seq=3)
        last = await log.reader.read_last(pattern, 3, upto_seq=3)
    assert [m.seq for m in fresh] == [1, 2]
    assert [[m.seq for m in rows] for rows in (latest, forward, backlog, last)] == [[2]] * 4


async def test_read_matching_wildcards(tmp_path: Path) -> None:
    """Backlog reads match literal and wildcard patterns, in seq order, within bounds."""
    async with opened(tmp_path / "log.db") as log:
        for topic in ("chat.a", "chat.b.c", "agent.x.events", "chat.a", "other"):
            await log.publish(topic=topic, msg_type="m", data=0)
        rows = await log.reader.read_matching(
            [TopicPattern.parse("chat.*"), TopicPattern.parse("agent.**")], after_seq=1, upto_seq=5
        )
        last = await log.reader.read_last([TopicPattern.parse("chat.**")], 2, upto_seq=5)
    assert ([3, 4], [2, 4]) == ([r.seq for r in rows], [r.seq for r in last])


async def test_read_last_of_literal_topics_behind_a_busy_log(tmp_path: Path) -> None:
    """``since: {last: N}`` on quiet topics: their newest N, merged in seq order, however
    many newer messages of other topics follow (read from the topic index)."""
    async with opened(tmp_path / "log.db") as log:
        for topic in ("chat.quiet", "chat.other", "chat.quiet", "chat.other", "chat.quiet"):
            await log.publish(topic=topic, msg_type="m", data=0)
        await publish_many(log, 1200, topic="chat.busy")
        head = log.head_seq
        one = await log.reader.read_last([TopicPattern.parse("chat.quiet")], 2, upto_seq=head)
        both = await log.reader.read_last(
            [TopicPattern.parse("chat.quiet"), TopicPattern.parse("chat.other")], 4, upto_seq=head
        )
        capped = await log.reader.read_last([TopicPattern.parse("chat.quiet")], 5, upto_seq=3)
    assert ([3, 5], [2, 3, 4, 5], [1, 3]) == (
        [r.seq for r in one],
        [r.seq for r in both],
        [r.seq for r in capped],
    )


async def test_read_last_of_wildcards_over_few_and_many_topics(tmp_path: Path) -> None:
    """A wildcard over quiet topics behind a busy log reads the topics newest first and
    stops once no topic left can hold one of the newest N; when that would take more than
    READ_LAST_QUERIES reads it walks the log back. Both give the newest N, in seq order."""
    async with opened(tmp_path / "log.db") as log:
        for topic in ("chat.a", "chat.b", "chat.a", "news.x", "chat.b"):
            await log.publish(topic=topic, msg_type="m", data=0)
        await publish_many(log, 600, topic="news.busy")
        await asyncio.gather(
            *[
                log.publish(topic=f"many.t{i}", msg_type="m", data=i)
                for i in range(READ_LAST_QUERIES + 44)
            ]
        )
        await publish_many(log, 600, topic="news.busy")
        head = log.head_seq
        many_first = head - 600 - (READ_LAST_QUERIES + 44) + 1
        everything = [*range(many_first, head - 599)]
        pattern = [TopicPattern.parse("many.*")]
        few = await log.reader.read_last([TopicPattern.parse("chat.*")], 3, upto_seq=head)
        newest = await log.reader.read_last(pattern, 3, upto_seq=head)
        by_topic = await log.reader._read_last_by_topic(
            log.reader._topics_matching(pattern) or [], 3, head
        )
        walked = await log.reader.read_last(pattern, READ_LAST_QUERIES + 10, upto_seq=head)
        too_many = await log.reader._read_last_by_topic(
            log.reader._topics_matching(pattern) or [], READ_LAST_QUERIES + 10, head
        )
    assert (
        [2, 3, 5],
        everything[-3:],
        everything[-3:],
        everything[-(READ_LAST_QUERIES + 10) :],
        None,
    ) == (
        [r.seq for r in few],
        [r.seq for r in newest],
        [r.seq for r in by_topic or []],
        [r.seq for r in walked],
        too_many,
    )


async def test_read_last_gives_what_a_scan_of_the_whole_log_gives(tmp_path: Path) -> None:
    """Random topics, patterns, counts and cut-off seqs: the newest N matching messages up
    to the cut-off, oldest first, exactly as filtering every message would give them."""
    rng = random.Random(20261122)
    topics = [f"{group}.{name}" for group in ("chat", "agent", "news") for name in "abcdefg"]
    weights = [50 if t == "news.a" else rng.choice((1, 2, 5)) for t in topics]
    async with opened(tmp_path / "log.db") as log:
        published: list[tuple[int, str]] = []
        for _ in range(12):
            batch = rng.choices(topics, weights, k=40)
            futures = [log.publish(topic=t, msg_type="m", data=0) for t in batch]
            published += [(s.seq, s.message.topic) for s in await asyncio.gather(*futures) if s]
        choices = ["**", "chat.*", "agent.**", "chat.a", "news.g", "agent.c", "*.b", "nothing"]
        for _ in range(150):
            texts = rng.sample(choices, rng.randint(1, 3))
            patterns = [TopicPattern.parse(t) for t in texts]
            count = rng.choice((1, 2, 5, 20, 100, 1000))
            upto = rng.randint(1, log.head_seq)
            expected = [
                seq
                for seq, topic in published
                if seq <= upto and any(p.matches(topic) for p in patterns)
            ][-count:]
            got = await log.reader.read_last(patterns, count, upto_seq=upto)
            assert (texts, count, upto, expected) == (
                texts,
                count,
                upto,
                [r.seq for r in got],
            )


def make_service(
    log: MessageLog, config: PubSubSection | None = None, **retention: object
) -> PubSub:
    """A service over ``log`` with the given retention."""
    rules = retention.pop("rules", ())
    policy = RetentionPolicy(rules, **retention)  # type: ignore[arg-type]
    return PubSub(
        node_id=KEYS.node_id,
        config=config or PubSubSection(),
        log_store=log,
        policy=AccessPolicy(),
        retention=policy,
        metrics=MetricsRegistry(),
    )


async def test_a_cancelled_read_does_not_pin_an_old_snapshot(tmp_path: Path) -> None:
    """A catch-up cancelled mid-read (its session ended) must not leave a half-read
    statement open: SQLite would keep serving every later read from that old snapshot, and
    resuming clients would never see newer messages."""
    everything = [TopicPattern.parse("**")]
    async with opened(tmp_path / "log.db") as log:
        await publish_many(log, 300)
        for _ in range(3):
            task = asyncio.get_running_loop().create_task(
                log.reader.read_matching(everything, after_seq=0, upto_seq=log.head_seq)
            )
            await asyncio.sleep(0)  # the query is with the reader thread now
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await publish_many(log, 1)  # the reader thread runs queries in order: no wait needed
        newest = await log.reader.read_matching(everything, after_seq=300, upto_seq=log.head_seq)
    assert [301] == [m.seq for m in newest]


async def test_retention_per_topic_count_and_rules(tmp_path: Path) -> None:
    """Default keeps max_messages per topic; a pattern rule keeps fewer for its topics."""
    async with opened(tmp_path / "log.db") as log:
        service = make_service(log, max_messages=3, rules=[RetentionRule("agent.*.tokens", 1, 600)])
        for i in range(5):
            await log.publish(topic="chat.a", msg_type="m", data=i)
            await log.publish(topic="agent.b.tokens", msg_type="m", data=i)
        deleted = await service.apply_retention()
        chat, _ = await log.reader.history("chat.a", limit=50)
        agent, _ = await log.reader.history("agent.b.tokens", limit=50)
    assert (6, [3, 4, 5], [5], (3, 1)) == (
        deleted,
        [m.message.data + 1 for m in chat],
        [m.message.data + 1 for m in agent],
        (log.topics["chat.a"].messages, log.topics["agent.b.tokens"].messages),
    )


async def test_retention_by_age_ttl_and_bytes(tmp_path: Path) -> None:
    """Messages older than max_age, past their own ttl_s, or over the byte cap go."""
    async with opened(tmp_path / "log.db") as log:
        service = make_service(log, max_age_s=60, max_bytes=10**9)
        await log.publish(topic="a", msg_type="m", data="ttl", ttl_s=5)
        await log.publish(topic="a", msg_type="m", data="keep")
        now = log.topics["a"].last_ts
        assert 0 == await service.apply_retention(now + 1000)
        assert 1 == await service.apply_retention(now + 6000)  # ttl passed
        assert 1 == await service.apply_retention(now + 61_000)  # max_age passed
        for _ in range(20):
            await log.publish(topic="b", msg_type="m", data="x" * 1000)
        service.retention.max_bytes = log.total_bytes // 2
        await service.apply_retention(now + 61_000)
    assert log.total_bytes <= service.retention.max_bytes


async def test_default_age_applies_behind_many_old_messages_of_a_longer_rule(
    tmp_path: Path,
) -> None:
    """More old messages than one candidate page on a topic kept 7 days must not hide a
    default-age (1 day) topic's messages from retention."""
    async with opened(tmp_path / "log.db") as log:
        service = make_service(
            log,
            max_messages=100_000,
            max_age_s=86_400,
            rules=[RetentionRule("keep.**", 100_000, 7 * 86_400)],
        )
        await asyncio.gather(
            *(log.publish(topic="keep.a", msg_type="m", data=i) for i in range(AGED_PAGE + 1))
        )
        await log.publish(topic="other", msg_type="m", data="old")
        deleted = await service.apply_retention(log.topics["other"].last_ts + 2 * 86_400_000)
    assert (1, AGED_PAGE + 1, None) == (
        deleted,
        log.topics["keep.a"].messages,
        log.topics.get("other"),
    )


async def test_durable_consumer_holds_unacked_past_retention(tmp_path: Path) -> None:
    """Unacked messages survive retention up to the consumer's limit; beyond, a gap is noted."""
    async with opened(tmp_path / "log.db") as log:
        service = make_service(log, PubSubSection(consumer_max_held=3), max_messages=2)
        log.save_consumer(ConsumerRecord("me", "work", ("jobs",), 0))
        for i in range(6):
            await log.publish(topic="jobs", msg_type="m", data=i)
        await service.apply_retention()
        held, _ = await log.reader.history("jobs", limit=50)
        record = log.consumers.get(("me", "work"))
    assert ([1, 2, 3, 5, 6], (4, 4)) == ([m.seq for m in held], record.lost if record else None)


async def test_consumer_stays_dirty_until_its_commit_succeeds(tmp_path: Path) -> None:
    """A commit that fails at COMMIT keeps the consumer change queued; the next commit
    stores it."""
    path = tmp_path / "log.db"
    async with opened(path) as log:
        # A deferred foreign key fails only at COMMIT, after the consumer row was written.
        with contextlib.closing(sqlite3.connect(path)) as other:
            other.executescript(
                "CREATE TABLE parent (id INTEGER PRIMARY KEY);"
                "CREATE TABLE child (parent INTEGER"
                " REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);"
                "CREATE TRIGGER orphan AFTER INSERT ON consumers"
                " BEGIN INSERT INTO child VALUES (1); END;"
            )
        assert log._writer is not None
        await log._writer.run(lambda conn: conn.execute("PRAGMA foreign_keys=ON"))
        record = ConsumerRecord("me", "work", ("jobs",), 0)
        log.save_consumer(record)
        with pytest.raises(Unavailable):
            await log.publish(topic="jobs", msg_type="m", data=1)
        dirty_after_failure = record.dirty
        with contextlib.closing(sqlite3.connect(path)) as other:
            other.execute("DROP TRIGGER orphan")
        await log.publish(topic="jobs", msg_type="m", data=2)
        dirty_after_commit = record.dirty
        with contextlib.closing(sqlite3.connect(path)) as other:
            rows = other.execute("SELECT identity, name, cursor FROM consumers").fetchall()
    assert (True, False, [("me", "work", 0)]) == (dirty_after_failure, dirty_after_commit, rows)


async def test_lone_publishes_read_back_signed_after_reopening(tmp_path: Path) -> None:
    """Publishes committed one at a time (each its INSERT alone) read back verified, in order."""
    path = tmp_path / "log.db"
    async with opened(path) as log:
        sent = [await log.publish(topic="chat.a", msg_type="m", data={"i": i}) for i in range(3)]
    async with opened(path) as log:
        held, _ = await log.reader.history("chat.a", limit=10)
        heads = (log.head_seq, log.origin_seq, log.topics["chat.a"].messages)
    parsed = [Message.parse(orjson.loads(m.message.raw)) for m in held]
    assert ([1, 2, 3], [s.message.id for s in sent if s], (3, 3, 3)) == (
        [m.seq for m in held],
        [m.id for m in parsed],
        heads,
    )


@pytest.mark.parametrize("sync", ["full", "normal"])
async def test_both_sync_modes_open(tmp_path: Path, sync: str) -> None:
    """full and normal synchronous modes both work."""
    async with opened(tmp_path / "log.db", sync) as log:
        assert 1 == len(await publish_many(log, 1))


async def test_a_publish_that_cannot_be_signed_or_stored_fails_alone(tmp_path: Path) -> None:
    """In one batch, data JCS cannot sign (2^53 + 1) and a message SQLite cannot store
    (origin_seq 2^64, which fails the whole insert) fail alone; the others commit in order
    and the flush loop goes on."""
    body = Message.unsigned(
        PEER.node_id, topic="chat.a", msg_type="m", data={}, origin_seq=2**64, ts=1
    )
    unstorable = Message.trusted({**body, "sig": "ed25519:x"}, b"{}")
    async with opened(tmp_path / "log.db") as log:
        futures = [
            log.publish(topic="chat.a", msg_type="m", data={"i": 0}),
            log.publish(topic="chat.a", msg_type="m", data=2**53 + 1),
            log.publish(topic="chat.a", msg_type="m", data={"i": 2}),
            log.ingest(unstorable, source=PEER.node_id),
            log.publish(topic="chat.a", msg_type="m", data={"i": 4}),
        ]
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        after = await log.publish(topic="chat.a", msg_type="m", data={"i": 5})
    assert (
        [1, "bad_request", 2, "internal_error", 3],
        [{"i": 0}, {"i": 2}, {"i": 4}],
        4,
    ) == (
        [o.seq if isinstance(o, StoredMessage) else getattr(o, "code", o) for o in outcomes],
        [o.message.data for o in outcomes if isinstance(o, StoredMessage)],
        after.seq if after is not None else None,
    )


async def test_publishes_past_max_pending_are_refused_with_unavailable(tmp_path: Path) -> None:
    """The pending queue is bounded: past max_pending a publish raises unavailable with
    retry_after_ms, and those already queued still commit."""
    log = MessageLog(tmp_path / "log.db", KEYS, synchronous="normal", max_pending=3)
    await log.open()
    try:
        queued = [log.publish(topic="chat.a", msg_type="m", data={"i": i}) for i in range(3)]
        with pytest.raises(Unavailable) as refused:
            log.publish(topic="chat.a", msg_type="m", data={"i": 3})
    finally:
        await log.close()  # flushes what is queued
    stored = [f.result() for f in queued]
    assert ("unavailable", True, [1, 2, 3]) == (
        refused.value.code,
        (refused.value.retry_after_ms or 0) > 0,
        [s.seq for s in stored if s is not None],
    )


async def test_publish_many_answers_a_group_with_one_future(tmp_path: Path) -> None:
    """publish_many numbers and commits like publish; its one future gives each outcome in
    order, an unsignable publish failing alone; a group past max_pending is refused whole."""
    async with opened(tmp_path / "log.db") as log:
        log.max_pending = 4
        outcomes = await log.publish_many(
            [
                ("chat.a", "m", {"i": 0}, None, None),
                ("chat.a", "m", 2**53 + 1, None, None),
                ("chat.b", "m", {"i": 2}, 60, None),
            ]
        )
        with pytest.raises(Unavailable):
            log.publish_many([("chat.a", "m", i, None, None) for i in range(5)])
        read, _ = await log.reader.history("chat.b", limit=10)
    assert ([(1, 1), "bad_request", (2, 3)], [60], 3) == (
        [
            (o.seq, o.message.origin_seq) if isinstance(o, StoredMessage) else o.code
            for o in outcomes
            if isinstance(o, StoredMessage | WireError)
        ],
        [r.message.ttl_s for r in read],
        log.origin_seq,
    )
