"""The whole log's message cap (pubsub.max_messages) on real SQLite: oldest first, each
topic's newest kept without holes, durable consumers' allowance, a pass started by commits."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from hearthnet.config import PubSubSection
from hearthnet.pubsub.log import ConsumerRecord
from tests.helpers import wait_until
from tests.pubsub.test_log import make_service, opened


async def test_message_cap_deletes_the_oldest_across_topics(tmp_path: Path) -> None:
    """30 messages on two interleaved topics, cap 10: the 20 oldest go; each topic keeps its
    newest 5, contiguous, and history pages forward over them with nothing missing."""
    async with opened(tmp_path / "log.db") as log:
        service = make_service(log, max_log_messages=10)
        for i in range(15):
            await log.publish(topic="a", msg_type="m", data=i)
            await log.publish(topic="b", msg_type="m", data=i)
        deleted = await service.apply_retention()
        a, a_more = await log.history("a", since_seq=0, limit=50)
        b, _ = await log.history("b", since_seq=0, limit=50)
        after_a, _ = await log.history("a", since_seq=25, limit=50)
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
        held, _ = await log.history("jobs", limit=50)
        record = log.consumer("me", "work")
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
            kept, _ = await log.history("a", limit=50)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert (False, [*range(3, 23)]) == (set_at_21, [m.seq for m in kept])
