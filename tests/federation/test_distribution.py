"""Agreements and pulled messages reach every member of a community, not just the bridge
(spec §8): in-process nodes, a1 and a2 of community A, b1 of community B."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from hearthnet.caller import Caller
from hearthnet.client import Client
from hearthnet.clock import now_ms
from hearthnet.community import CommunityStore, Level
from hearthnet.errors import Forbidden, Unauthorized, Unavailable
from hearthnet.federation.agreement import Agreement, Grant, Revocation
from hearthnet.identity import KeyPair, load_or_create_keys
from hearthnet.ids import new_ulid
from hearthnet.node import Node
from hearthnet.pubsub.envelope import Message
from tests.conftest import MakeConfig
from tests.federation.test_agreement import B_MEMBER, STRANGER, B, community
from tests.helpers import eventually, wait_until


async def topics_from(node: Node, origin: str) -> list[str]:
    """The topics of the messages of ``origin`` that ``node``'s log holds."""
    rows = await node.message_log.reader.read_origin(origin, 1, 1000, 1000)
    return [json.loads(raw)["topic"] for raw in rows]


def with_b(node: Node, ours: Grant, theirs: Grant, lasts_ms: int = 3_600_000) -> Agreement:
    """An agreement between ``node``'s community and B, signed by both anchors."""
    now = now_ms()
    return Agreement.propose(
        node.keys,
        agreement_id=new_ulid(now),
        community_a=node.membership.community_id,
        community_b=B.node_id,
        a_grants_b=ours,
        b_grants_a=theirs,
        now_ms=now,
        expires_ms=now + lasts_ms,
    ).countersign(B)


async def test_agreement_and_pulled_messages_reach_a_member_that_is_not_the_bridge(
    make_config: MakeConfig,
) -> None:
    """a2 (linked to a1 only) gets the agreement by gossip and B's message a1 pulled; the
    revocation b1 signs reaches a2 the same way."""
    fast = {"dial_interval_s": 0.05}
    config_a1, config_a2, config_b1 = (make_config(mesh=fast) for _ in range(3))
    a2_keys = load_or_create_keys(config_a2.data_path)
    async with Node(config_a1) as a1, Node(config_b1) as b1:
        a1.add_member(a2_keys.node_id)
        CommunityStore(config_a2.data_path).replace(list(a1.membership.records.values()))
        async with Node(config_a2) as a2:
            a2.mesh.book.add(a1.url, node=a1.keys.node_id)
            await wait_until(lambda: a1.keys.node_id in a2.mesh.links, 10, "a2 linked to a1")
            now = now_ms()
            signed = Agreement.propose(
                a1.keys,
                agreement_id=new_ulid(now),
                community_a=a1.membership.community_id,
                community_b=b1.membership.community_id,
                a_grants_b=Grant(("chat.**",), ()),
                b_grants_a=Grant(("news.**",), ()),
                now_ms=now,
                expires_ms=now + 3_600_000,
            ).countersign(b1.keys)
            b_records = [r.to_json() for r in b1.membership.records.values()]
            a_records = [r.to_json() for r in a1.membership.records.values()]
            await a1.federation.apply([signed.to_json()], [], {b1.keys.node_id: b_records})
            await b1.federation.apply([signed.to_json()], [], {a1.keys.node_id: a_records})
            a1.federation_bridge.peers[b1.url] = None  # a1 bridges to b1
            view2 = a2.federation.view
            await wait_until(lambda: signed.id in view2.agreements, 10, "agreement on a2")
            assert "in_force" == view2.status(signed, now_ms())

            me = Caller(b1.keys.node_id, "node", Level.ANCHOR, None, True)
            await b1.pubsub.publish(me, "news.today", "m", {"n": 1})
            await b1.pubsub.publish(me, "chat.b", "m", {"n": 2})  # not granted to A
            await eventually(
                lambda: topics_from(a2, b1.keys.node_id),
                lambda topics: "news.today" in topics,
                15,
                "B's news on a2",
            )
            assert ["news.today"] == await topics_from(a1, b1.keys.node_id)

            await b1.federation.apply(
                [], [Revocation.create(b1.keys, signed.id, now_ms()).to_json()], {}
            )
            await wait_until(lambda: signed.id in view2.revocations, 15, "revocation on a2")


async def test_sync_hands_members_only_to_a_member_under_an_agreement(node: Node) -> None:
    """Sync without an agreement is forbidden, from a stranger unauthorized; a member of
    the other community gets our records while the agreement is in force, and after its
    revocation only the agreement and the revocation (so that it reaches that side); the
    revocation ends that member's parked poll at once."""
    body = {"community": B.node_id, "agreements": [], "revocations": [], "records": []}

    async def sync(keys: KeyPair, sent: dict[str, Any]) -> Any:
        async with Client(node.url, keys=keys, community=B.node_id) as client:
            return await client.request_json("POST", "/mesh/v1/federation/sync", sent)

    with pytest.raises(Forbidden):
        await sync(B, body)
    signed = with_b(node, Grant(("chat.**",), ()), Grant())
    b_records = [r.to_json() for r in community(B, (B_MEMBER, Level.MEMBER)).records.values()]
    full = {**body, "agreements": [signed.to_json()], "records": b_records}
    with pytest.raises(Unauthorized):
        await sync(STRANGER, full)
    in_force = await sync(B_MEMBER, body)

    async def parked_poll() -> str:
        async with Client(node.url, keys=B_MEMBER, community=B.node_id) as client:
            try:
                query = {"topics": "chat.**", "timeout_s": 30}
                await client.request_json("GET", "/pubsub/v1/subscribe", query=query)
            except Forbidden as exc:
                return exc.code
        return "returned"

    poll = asyncio.create_task(parked_poll())
    await wait_until(lambda: len(node.sessions) > 0, 10, "the poll parked")
    revocation = Revocation.create(node.keys, signed.id, now_ms())
    await node.federation.apply([], [revocation.to_json()], {})
    async with asyncio.timeout(10):  # spec §8: within 10 s (the poll would park 30 s)
        ended = await poll
    revoked = await sync(B_MEMBER, body)
    assert "forbidden" == ended
    assert ([signed.id], True, [signed.id], [revocation.to_json()], []) == (
        [a["id"] for a in in_force["agreements"]],
        len(in_force["records"]) > 0,
        [a["id"] for a in revoked["agreements"]],
        revoked["revocations"],
        revoked["records"],
    )


async def test_calls_of_the_other_community_end_when_the_agreement_expires(node: Node) -> None:
    """B's member calls the granted echo; other capabilities are forbidden; at expiry the
    granted one is forbidden too."""
    # it lasts 4 s: the two calls before it take well under that
    signed = with_b(node, Grant((), ("echo@1",)), Grant(), 4_000)
    b_records = [r.to_json() for r in community(B, (B_MEMBER, Level.MEMBER)).records.values()]
    await node.federation.apply([signed.to_json()], [], {B.node_id: b_records})

    async def outcome(capability: str) -> str:
        async with Client(node.url, keys=B_MEMBER, community=B.node_id) as client:
            try:
                await client.call(capability, {"x": 1})
            except Forbidden as exc:
                return exc.code
        return "ok"

    before = [await outcome("echo"), await outcome("echo.stream")]
    after = await eventually(lambda: outcome("echo"), lambda code: code != "ok", 10, "expiry")
    assert (["ok", "forbidden"], "forbidden") == (before, after)


async def test_push_takes_granted_topics_of_that_communitys_origins_only(node: Node) -> None:
    """A push from B's bridge: B's message on a topic B grants us is taken; one on another
    topic, and one whose origin is not of B, are refused; a stranger's push is
    unauthorized."""
    now = now_ms()
    signed = with_b(node, Grant(), Grant(("news.*",), ()))
    b_records = [r.to_json() for r in community(B, (B_MEMBER, Level.MEMBER)).records.values()]
    await node.federation.apply([signed.to_json()], [], {B.node_id: b_records})
    messages = [
        Message.create(origin, topic=topic, msg_type="m", data=i, origin_seq=1, ts=now)
        for i, (origin, topic) in enumerate(
            [(B, "news.today"), (B_MEMBER, "chat.room"), (STRANGER, "news.today")]
        )
    ]
    body = {"messages": [m.body() for m in messages]}

    async def push(keys: KeyPair) -> Any:
        async with Client(node.url, keys=keys, community=B.node_id) as client:
            return await client.request_json("POST", "/mesh/v1/federation/push", body)

    answer = await push(B_MEMBER)
    with pytest.raises(Unauthorized):
        await push(STRANGER)
    await eventually(
        lambda: topics_from(node, B.node_id), lambda t: t == ["news.today"], 10, "ingested"
    )
    assert ({"taken": 1, "of": 3}, 2) == (answer, node.federation_bridge.refused)


async def test_a_restarted_node_still_holds_its_agreements(make_config: MakeConfig) -> None:
    """Agreements, the other community's members and revocations survive a restart."""
    config = make_config()
    async with Node(config) as node:
        signed = with_b(node, Grant(("chat.**",), ()), Grant())
        members = community(B, (B_MEMBER, Level.MEMBER)).records.values()
        await node.federation.apply(
            [signed.to_json()], [], {B.node_id: [r.to_json() for r in members]}
        )
        before = node.federation.view.listing(now_ms())
    async with Node(config) as node:
        after = node.federation.view.listing(now_ms())
        member = node.federation.view.community_of(B_MEMBER.node_id)
    assert (before, B.node_id) == (after, member)


async def test_a_push_the_log_cannot_queue_is_answered_unavailable_and_taken_again(
    node: Node,
) -> None:
    """While the log's queue is full a push is refused with unavailable (so B's bridge
    keeps its cursor and pushes again) and nothing of it is counted as taken; the same
    push once there is room is taken."""
    signed = with_b(node, Grant(), Grant(("news.*",), ()))
    b_records = [r.to_json() for r in community(B, (B_MEMBER, Level.MEMBER)).records.values()]
    await node.federation.apply([signed.to_json()], [], {B.node_id: b_records})
    message = Message.create(B, topic="news.full", msg_type="m", data=1, origin_seq=1, ts=now_ms())
    body = {"messages": [message.body()]}
    log = node.message_log
    room = log.max_pending
    async with Client(node.url, keys=B_MEMBER, community=B.node_id) as client:
        log.max_pending = 0
        try:
            with pytest.raises(Unavailable):
                await client.request_json("POST", "/mesh/v1/federation/push", body)
            pulled_while_full = node.federation_bridge.pulled
        finally:
            log.max_pending = room
        answer = await client.request_json("POST", "/mesh/v1/federation/push", body)
    await eventually(
        lambda: topics_from(node, B.node_id), lambda t: t == ["news.full"], 10, "ingested"
    )
    assert (0, {"taken": 1, "of": 1}, 1) == (
        pulled_while_full,
        answer,
        node.federation_bridge.pulled,
    )


async def test_a_push_is_answered_only_once_what_it_took_is_durable(node: Node) -> None:
    """B's bridge moves its cursor past what our answer says was taken: the answer waits
    for the commit (here held back by a transaction holding the log's write lock, as a
    retention pass does), so a crash can never lose what was answered as taken."""
    signed = with_b(node, Grant(), Grant(("news.*",), ()))
    b_records = [r.to_json() for r in community(B, (B_MEMBER, Level.MEMBER)).records.values()]
    await node.federation.apply([signed.to_json()], [], {B.node_id: b_records})
    message = Message.create(B, topic="news.held", msg_type="m", data=1, origin_seq=1, ts=now_ms())
    body = {"messages": [message.body()]}
    lock = node.message_log._write_lock
    async with Client(node.url, keys=B_MEMBER, community=B.node_id) as client:
        await lock.acquire()
        try:
            push = asyncio.ensure_future(
                client.request_json("POST", "/mesh/v1/federation/push", body)
            )
            await wait_until(lambda: node.federation_bridge.pulled == 1, 10, "the push queued")
            done, _ = await asyncio.wait({push}, timeout=0.5)
            answered_while_held = bool(done)
        finally:
            lock.release()
        answer = await push
    assert (False, {"taken": 1, "of": 1}, ["news.held"]) == (
        answered_while_held,
        answer,
        await topics_from(node, B.node_id),
    )
