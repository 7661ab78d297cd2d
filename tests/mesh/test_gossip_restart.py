"""An origin's gossip floor across a restart, two real nodes on loopback (spec §7.3): a
node that held an origin's 2..5 but never 1 and restarted must not make a peer that
missed 1 skip it, and 1 must reach that peer once anyone has it; nor may one that never
had 5 and whose retention removed 1..8 around it."""

from __future__ import annotations

import dataclasses

from hearthnet.clock import now_ms
from hearthnet.identity import KeyPair
from hearthnet.node import Node
from hearthnet.pubsub.envelope import Message
from tests.conftest import MakeConfig
from tests.helpers import wait_until
from tests.mesh.rawpeer import raw_peer
from tests.mesh.test_relaying import one_community


def _numbered(keys: KeyPair, last: int) -> dict[int, Message]:
    """Messages 1..``last`` of the origin with ``keys`` on chat.room, by origin_seq."""
    return {
        seq: Message.create(
            keys, topic="chat.room", msg_type="m", data=seq, origin_seq=seq, ts=now_ms()
        )
        for seq in range(1, last + 1)
    }


async def test_message_1_reaches_a_peer_after_the_node_holding_2_to_5_restarts(
    make_config: MakeConfig,
) -> None:
    """B and A both get an origin's 2..5 and not 1; A restarts. A's ``ihave`` must not
    say "nothing below 2" (B would skip 1 for good, and A, whose head would be 5, would
    never ask for 1 either). The origin then advertises 1..5 to A: A asks for 1, and 1
    reaches B."""
    fast = {"zeroconf": False, "anti_entropy_s": 0.3}
    b_config = make_config(mesh=fast)
    a_config = make_config(mesh=fast)
    one_community([a_config, b_config])
    async with Node(b_config) as b:
        a_config = dataclasses.replace(
            a_config, mesh=dataclasses.replace(a_config.mesh, peers=(b.url,))
        )
        origin_seed = b"\x7a" * 32
        async with Node(a_config) as a:
            await wait_until(lambda: b.keys.node_id in a.mesh.links, 20, "a linked to b")
            async with raw_peer(a, seed=origin_seed) as origin:
                await wait_until(
                    lambda: b.membership.level_of(origin.node) is not None, 20, "b knows origin"
                )
                msgs = _numbered(origin.keys, 5)
                for seq in range(2, 6):
                    await origin.send("msg", raw=msgs[seq].raw, h=1)
                await wait_until(
                    lambda: all(b.mesh.log.knows(msgs[s].id) for s in range(2, 6)), 20, "b 2..5"
                )
        async with Node(a_config) as a:
            await wait_until(lambda: b.keys.node_id in a.mesh.links, 20, "a linked to b again")
            # anti-entropy rounds between a and b, both ways
            await wait_until(lambda: a.keys.node_id in b.mesh.links, 20, "b linked to a")
            told = a.mesh.traffic.gossip.ihave()
            async with raw_peer(a, seed=origin_seed) as origin:
                await origin.send("ihave", heads={origin.node: 5}, floors={origin.node: 1})
                iwant = await origin.first("iwant", 20)
                await origin.send("msg", raw=msgs[1].raw, h=1)
                await wait_until(lambda: b.mesh.log.knows(msgs[1].id), 20, "message 1 at b")
    oid = origin.node
    assert ((0, 1), [1, 1]) == ((told.heads.get(oid), told.floors.get(oid)), iwant["want"][oid])


async def test_message_5_reaches_a_peer_after_retention_removed_around_it_elsewhere(
    make_config: MakeConfig,
) -> None:
    """B and C get an origin's 1..4 and 6..10, never 5; B's retention removes 1..8 and B
    restarts. B's ``ihave`` must say floor 5, head 4 (floor 9, head 10 made C skip 5..8
    for good, and B too). The origin (which holds 5) then advertises 1..10 to C: C asks
    for 5 alone, gets it, and B gets it from C and moves its head to 10 without asking
    for the 6..8 it removed."""
    fast = {"zeroconf": False, "anti_entropy_s": 0.3}
    c_config = make_config(mesh=fast)
    b_config = make_config(mesh=fast)
    one_community([b_config, c_config])  # b founds it: it adds the origin
    origin_seed = b"\x7b" * 32
    async with Node(c_config) as c:
        b_config = dataclasses.replace(
            b_config, mesh=dataclasses.replace(b_config.mesh, peers=(c.url,))
        )
        async with Node(b_config) as b:
            await wait_until(lambda: c.keys.node_id in b.mesh.links, 20, "b linked to c")
            async with raw_peer(b, seed=origin_seed) as origin:
                await wait_until(
                    lambda: c.membership.level_of(origin.node) is not None, 20, "c knows origin"
                )
                msgs = _numbered(origin.keys, 10)
                sent = [s for s in msgs if s != 5]
                for seq in sent:
                    await origin.send("msg", raw=msgs[seq].raw, h=1)
                await wait_until(
                    lambda: all(c.mesh.log.knows(msgs[s].id) for s in sent), 20, "c 1..4, 6..10"
                )
            oid = origin.node
            log = b.mesh.log
            assert 7 == await log.delete(log.reader.index.origin_range(oid, 1, 8))
        async with Node(b_config) as b:
            await wait_until(lambda: c.keys.node_id in b.mesh.links, 20, "b linked to c again")
            async with raw_peer(b, seed=origin_seed) as seen:
                # b's ihave goes to every link at once: by its third here, c has had it
                await wait_until(lambda: len(seen.received("ihave")) >= 3, 20, "b's ihaves")
                told = seen.received("ihave")[-1]
            c_head = c.mesh.traffic.gossip.tracker.heads.get(oid)
            async with raw_peer(c, seed=origin_seed) as origin:
                await origin.send("ihave", heads={oid: 10}, floors={oid: 1})
                iwant = await origin.first("iwant", 20)
                await origin.send("msg", raw=msgs[5].raw, h=1)
                await wait_until(lambda: c.mesh.log.knows(msgs[5].id), 20, "message 5 at c")
                b_tracker = b.mesh.traffic.gossip.tracker
                await wait_until(lambda: b_tracker.heads.get(oid) == 10, 20, "b's head at 10")
            refetched = [s for s in (6, 7, 8) if b.mesh.log.knows(msgs[s].id)]
    assert ((4, 5), 4, [5, 5], []) == (
        (told["heads"].get(oid), told["floors"].get(oid)),
        c_head,
        iwant["want"][oid],
        refetched,
    )
