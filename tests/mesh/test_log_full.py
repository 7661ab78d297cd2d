"""A peer's messages go through pub/sub's facade into the log's bounded queue (spec §6.4,
§7.3): while the queue is full a gossiped message is not taken, leaves no trace, and
anti-entropy brings it once there is room. One in-process node over real loopback
sockets, a member linked by hand."""

from __future__ import annotations

from hearthnet.clock import now_ms
from hearthnet.identity import KeyPair
from hearthnet.node import Node
from hearthnet.pubsub.envelope import Message
from tests.helpers import wait_until
from tests.mesh.rawpeer import raw_peer


async def test_a_message_gossiped_while_the_log_is_full_is_repaired_later(node: Node) -> None:
    """With no room in the log's queue the message is counted as deferred and not stored;
    once there is room, the same message sent again for the node's iwant is stored (it
    was not left behind as one in flight, which would make it a duplicate)."""
    origin = KeyPair.from_seed(b"\x76" * 32)
    node.add_member(origin.node_id)
    message = Message.create(
        origin, topic="chat.full", msg_type="m", data={}, origin_seq=1, ts=now_ms()
    )
    log = node.message_log
    room = log.max_pending
    deferred = node.pubsub.metrics.deferred
    async with raw_peer(node) as relay:
        log.max_pending = 0
        try:
            await relay.send("msg", raw=message.raw, h=1)
            await wait_until(lambda: deferred.get() == 1, what="the message deferred")
            held_while_full = log.knows(message.id)
        finally:
            log.max_pending = room
        await relay.send("ihave", heads={origin.node_id: 1}, floors={origin.node_id: 1})
        iwant = await relay.first("iwant")
        await relay.send("msg", raw=message.raw, h=1)  # the relay answers as a node does
        await wait_until(lambda: log.knows(message.id), what="the repaired message stored")
        stored = await log.reader.read_origin(origin.node_id, 1, 1, 1)
    assert (False, {origin.node_id: [1, 1]}, [message.raw], 1.0) == (
        held_while_full,
        iwant["want"],
        stored,
        deferred.get(),
    )
