"""Fan-out writes a commit's frames to every subscriber before ``on_commit`` returns; a
large batch for many sockets goes from one memory file."""

from __future__ import annotations

import asyncio
import os
import socket

from hearthnet.caller import Caller
from hearthnet.identity import KeyPair
from hearthnet.membership_fold import Level
from hearthnet.metrics import MetricsRegistry
from hearthnet.pubsub.access import AccessPolicy
from hearthnet.pubsub.channel import SubscriberChannel
from hearthnet.pubsub.envelope import Message, StoredMessage, canonical_body
from hearthnet.pubsub.fanout import SHARE_MIN_SUBSCRIBERS, FanOut, PubSubMetrics
from hearthnet.pubsub.index import SubscriptionIndex
from hearthnet.pubsub.sinks import SocketSink
from hearthnet.pubsub.subscriber import Resumable, Subscriber
from hearthnet.pubsub.topics import TopicPattern
from hearthnet.pubsub.wire import EncodedMessage
from hearthnet.transport.direct import SharedBytes

ME = Caller("n_test", "node", Level.ANCHOR, None, True)


class Taken:
    """A sink that keeps what it is given, one list per write."""

    stream = True
    paused = False
    subscriber: Resumable | None = None

    def __init__(self) -> None:
        self.writes: list[list[bytes]] = []

    def write(self, frames: list[bytes], shared: SharedBytes | None = None) -> bool:
        """Kept."""
        self.writes.append(frames)
        return True


def _stored(topics: list[str], first_seq: int) -> list[StoredMessage]:
    keys = KeyPair.generate()
    bodies = [
        Message.unsigned(keys.node_id, topic=t, msg_type="m", data=i, origin_seq=1 + i, ts=5)
        for i, t in enumerate(topics)
    ]
    signed = Message.signed_batch(keys, bodies, [canonical_body(b) for b in bodies])
    return [StoredMessage(first_seq + i, m) for i, m in enumerate(signed)]


async def test_a_commit_is_written_in_its_own_loop_turn() -> None:
    """One write per subscriber per commit, done when on_commit returns (one or two topics)."""
    index: SubscriptionIndex[Subscriber] = SubscriptionIndex()
    fanout = FanOut(
        node_id="n_test",
        index=index,
        policy=AccessPolicy(),
        metrics=PubSubMetrics.register(MetricsRegistry(), lambda: 0.0),
        refill=lambda sub: None,
    )
    sinks = [Taken() for _ in range(3)]
    for i, sink in enumerate(sinks):
        channel = SubscriberChannel(window=64, queue_max=64, encode_gap=lambda a, b: b"gap")
        sub = Subscriber(caller=ME, client_id=f"c{i}", form="ws_text", channel=channel, sink=sink)
        sub.fanout = fanout
        index.add(TopicPattern.parse("f.*"), sub)
    fanout.on_commit(_stored(["f.a", "f.a"], 1))
    fanout.on_commit(_stored(["f.a", "f.b", "f.a"], 3))
    assert [[2, 3]] * 3 == [
        [sum(part.count(b'"event":"message"') for part in w) for w in sink.writes] for sink in sinks
    ]


async def test_a_batch_for_many_subscribers_is_sent_from_one_file_and_arrives_whole() -> None:
    """A large commit to many socket subscribers: each socket gets exactly the commit's
    frames (sent from a shared memory file), and no file stays open after on_commit."""
    loop = asyncio.get_running_loop()
    index: SubscriptionIndex[Subscriber] = SubscriptionIndex()
    fanout = FanOut(
        node_id="n_test",
        index=index,
        policy=AccessPolicy(),
        metrics=PubSubMetrics.register(MetricsRegistry(), lambda: 0.0),
        refill=lambda sub: None,
    )
    pairs = [socket.socketpair() for _ in range(SHARE_MIN_SUBSCRIBERS)]
    transports = []
    try:
        for i, (ours, theirs) in enumerate(pairs):
            theirs.setblocking(False)
            transport, _ = await loop.create_connection(asyncio.Protocol, sock=ours)
            transports.append(transport)
            channel = SubscriberChannel(window=1024, queue_max=1024, encode_gap=lambda a, b: b"")
            sink = SocketSink(transport)
            sub = Subscriber(
                caller=ME, client_id=f"c{i}", form="ws_text", channel=channel, sink=sink
            )
            index.add(TopicPattern.parse("f.*"), sub)
        batch = _stored(["f.a"] * 400, 1)  # ~80 KB of frames: more than SharedBytes' minimum
        expected = b"".join(EncodedMessage(stored).ws_text_unsigned() for stored in batch)
        opened = len(os.listdir("/proc/self/fd"))
        fanout.on_commit(batch)
        left_open = len(os.listdir("/proc/self/fd")) - opened
        received = []
        for _, theirs in pairs:
            got = bytearray()
            while len(got) < len(expected):
                chunk = await asyncio.wait_for(loop.sock_recv(theirs, 1 << 20), timeout=10)
                assert chunk, "closed early"
                got += chunk
            received.append(bytes(got))
    finally:
        for transport in transports:
            transport.abort()
        for _, theirs in pairs:
            theirs.close()
    assert (True, [expected] * len(pairs), 0, False) == (
        len(expected) >= SharedBytes().min_bytes,
        received,
        left_open,
        bool(fanout._shared),
    )
