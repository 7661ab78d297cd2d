"""A subscriber's subscribes run one at a time, and an idle one keeps no lock (spec §11)."""

from __future__ import annotations

import asyncio

from hearthnet.pubsub.channel import SubscriberChannel
from hearthnet.pubsub.subscriber import Subscriber
from tests.pubsub.test_sinks import ME, gap


async def test_subscribes_take_turns_and_leave_no_lock_behind() -> None:
    """A second subscribe waits for the first; a cancelled waiter and the end of both
    leave the session without a lock."""
    channel = SubscriberChannel(window=None, queue_max=4, encode_gap=gap)
    sub = Subscriber(caller=ME, client_id="t", form="ws_text", channel=channel, sink=None)
    order: list[str] = []
    release = asyncio.Event()

    async def first() -> None:
        async with sub.subscribing:
            order.append("first in")
            await release.wait()
            order.append("first out")

    async def second() -> None:
        async with sub.subscribing:
            order.append("second")

    one = asyncio.create_task(first())
    await asyncio.sleep(0)
    waiter = asyncio.create_task(second())
    cancelled = asyncio.create_task(second())
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    release.set()
    await asyncio.gather(one, waiter)
    assert (["first in", "first out", "second"], None) == (order, sub._subscribing)
