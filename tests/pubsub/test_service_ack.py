"""Acks (spec §6.5): a subscriber is flushed after an ack only when something waits."""

from __future__ import annotations

from pathlib import Path

from hearthnet.pubsub.channel import SubscriberChannel
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.subscriber import Subscriber
from tests.pubsub.test_log import KEYS, make_service
from tests.pubsub.test_sinks import ME, gap


async def test_an_ack_wakes_fan_out_only_when_it_lets_frames_out(tmp_path: Path) -> None:
    """An ack that frees window room with nothing queued schedules no flush; an ack that
    lets a queued frame out does."""
    service = make_service(MessageLog(tmp_path / "log.db", KEYS))
    channel = SubscriberChannel(window=4, queue_max=16, encode_gap=gap)
    sub = Subscriber(caller=ME, client_id="t", form="ws_text", channel=channel, sink=None)
    service.register(sub)
    channel.offer_many([1, 2], [b"1", b"2"])
    sub.write_out()
    idle = (service.ack(sub, 2), sub.flush_scheduled)
    channel.offer_many([3, 4, 5, 6, 7], [b"3", b"4", b"5", b"6", b"7"])
    sub.write_out()
    waiting = (service.ack(sub, 3), sub.flush_scheduled, channel.out)
    assert ((2, False), (1, True, [b"7"])) == (idle, waiting)
