"""Commits follow the queue's order (spec §6.3, §6.4): ``origin_seq`` is given when a
publish is queued, ``seq`` when it commits, and subscribers get messages in ``seq`` order,
so a group queued later must never commit before one queued earlier."""

from __future__ import annotations

import asyncio
from functools import partial
from pathlib import Path

import orjson

from hearthnet.node import Node
from hearthnet.pubsub.envelope import StoredMessage
from hearthnet.pubsub.log import INLINE_MAX
from hearthnet.pubsub.logcommit import Outcome
from tests.conftest import MakeConfig
from tests.helpers import wait_until
from tests.pubsub.test_log import opened
from tests.pubsub.test_ws import auth_frame
from tests.pubsub.test_ws_lean import RawWs, addr


def _note(into: dict[str, list[int]], name: str, outcomes: list[Outcome]) -> None:
    """An answer to a group of publishes: their seqs, under ``name``."""
    into[name] = [o.seq for o in outcomes if isinstance(o, StoredMessage)]


async def test_a_lone_group_does_not_overtake_a_batch_waiting_for_the_write_lock(
    tmp_path: Path,
) -> None:
    """With sync normal, a batch the flush loop took waits for the write lock (held as a
    retention transaction holds it); the lock is released, and in the same loop turn a
    lone group is queued and its turn ends (as a WebSocket session's publishes do): the
    group is not committed on the loop ahead of the waiting batch, both commit in queue
    order, and the commits reach fan-out in that order."""
    answers: dict[str, list[int]] = {}
    commits: list[list[int]] = []
    async with opened(tmp_path / "log.db") as log:
        log.listeners.append(lambda batch: commits.append([s.seq for s in batch]))
        lock = log._write_lock
        await lock.acquire()  # a retention transaction under way
        log.publish_many(
            [("o.a", "m", i, None, None) for i in range(INLINE_MAX + 1)],
            answer=partial(_note, answers, "first"),
        )
        log.end_turn()  # too many to commit on the loop: the flush loop takes them
        await wait_until(lambda: not log._pending, what="the flush loop taking the batch")
        lock.release()  # the flush loop's task gets the lock only in a later callback
        log.publish_many(
            [("o.a", "m", "late", None, None)],
            answer=partial(_note, answers, "late"),
        )
        log.end_turn()
        await wait_until(lambda: len(answers) == 2, what="both groups answered")
    first = [*range(1, INLINE_MAX + 2)]
    late = [INLINE_MAX + 2]
    assert ({"first": first, "late": late}, [first, late]) == (answers, commits)


class _Subscriber:
    """A raw WebSocket subscriber that records ``(seq, data)`` of each message, acking
    every half window."""

    WINDOW = 1024

    def __init__(self, raw: RawWs) -> None:
        self.raw = raw
        self.got: list[tuple[int, int]] = []

    async def read(self, count: int) -> None:
        while len(self.got) < count:
            _, payload = await self.raw.frame()
            frame = orjson.loads(payload)
            if frame["event"] == "gap":
                raise AssertionError(f"a gap: {frame}")
            if frame["event"] != "message":
                continue
            self.got.append((frame["seq"], frame["data"]["data"]))
            if len(self.got) % (self.WINDOW // 2) == 0:
                self.raw.send_json({"type": "ack", "upto": frame["seq"]})


async def _publish_at(raw: RawWs, topic: str, rate: int, count: int) -> None:
    """``count`` publishes (data 0, 1, ...) at about ``rate`` a second, each with its
    index as ``ref``."""
    loop = asyncio.get_running_loop()
    start, sent = loop.time(), 0
    while sent < count:
        due = min(count, int((loop.time() - start) * rate) + 1)
        for i in range(sent, due):
            raw.send_json(
                {"type": "publish", "topic": topic, "msg_type": "m", "data": i, "ref": str(i)}
            )
        sent = due
        await raw.writer.drain()
        await asyncio.sleep(0.001)


async def test_subscribers_get_a_steady_publisher_s_messages_in_publish_order(
    make_config: MakeConfig,
) -> None:
    """A node with sync normal and retention every 20 ms (its transactions of deletes hold
    the write lock now and then), one WebSocket publisher at ~2,000 msg/s for 3 s and 20
    subscribers: the publishes' seqs rise in publish order (their answers' ``ref``), and
    every subscriber gets every message once, seqs rising and in publish order."""
    count, subscribers, topic = 6_000, 20, "order.t"
    config = make_config(
        pubsub={
            "sync": "normal",
            "retention_interval_s": 0.02,
            "max_messages_per_topic": 100,
            "publish_per_s_member": 1e6,
            "queue_max": count,  # a subscriber slowed by a busy machine gets no gap
        },
    )
    async with Node(config) as node:
        subs = []
        for _ in range(subscribers):
            raw = await RawWs.open(*addr(node))
            raw.send_json(auth_frame(node.keys, node.keys.node_id, window=_Subscriber.WINDOW))
            await raw.event("auth.ok")
            raw.send_json({"type": "subscribe", "topics": [topic]})
            await raw.event("subscribed")
            subs.append(_Subscriber(raw))
        publisher = await RawWs.open(*addr(node))
        publisher.send_json(auth_frame(node.keys, node.keys.node_id))
        await publisher.event("auth.ok")
        loop = asyncio.get_running_loop()
        readers = [loop.create_task(sub.read(count)) for sub in subs]
        acks: dict[int, int] = {}  # publish -> its seq

        async def read_acks() -> None:
            while len(acks) < count:
                ok = (await publisher.event("published.ok"))["data"]
                acks[int(ok["ref"])] = ok["seq"]

        tasks = [loop.create_task(read_acks()), *readers]
        try:
            await _publish_at(publisher, topic, 2_000, count)
            await asyncio.wait_for(asyncio.gather(*tasks), 60)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for raw in [publisher, *(sub.raw for sub in subs)]:
                await raw.end()
    # per subscriber, the messages that did not follow the one before (seq rising, data
    # the next publish), the first one counted when it was not the first publish
    out_of_order = [
        sum(
            1
            for (s0, d0), (s1, d1) in zip([(0, -1), *sub.got], sub.got, strict=False)
            if not (s1 > s0 and d1 == d0 + 1)
        )
        for sub in subs
    ]
    assert (True, [0] * subscribers, [count] * subscribers) == (
        all(acks[i + 1] > acks[i] for i in range(count - 1)),
        out_of_order,
        [len(sub.got) for sub in subs],
    )
