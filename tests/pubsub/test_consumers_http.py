"""Durable consumers listed, deleted and bounded (spec §6.8; ``/pubsub/v1/consumers``), on a
real node over real sockets."""

from __future__ import annotations

import contextlib
import sqlite3

import aiohttp
import pytest

from hearthnet.client import Client
from hearthnet.errors import Forbidden, NotFound
from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import publish, publish_at_once, token_for, wait_until
from tests.pubsub.test_ws import session


async def consume(
    http: aiohttp.ClientSession, node: Node, name: str, *, token: str | None = None
) -> list[int]:
    """Subscribe as consumer ``name`` from the start, read the backlog of 3, ack the first;
    the seqs read. The session stays open (it holds the consumer)."""
    raw = await (session(http, node) if token is None else session(http, node, token=token))
    await raw.send(
        {"type": "subscribe", "topics": ["jobs.a"], "since": {"seq": 0}, "consumer": name}
    )
    got = [f["seq"] for f in await raw.messages(3)]
    await raw.send({"type": "ack", "upto": got[0]})
    return got


async def test_a_consumer_is_listed_with_its_cursor_and_pending_then_deleted(
    node: Node, http: aiohttp.ClientSession, client: Client
) -> None:
    """The listing shows the consumer's cursor (its ack), what it has pending and that a
    session holds it; deleting it closes that session with 4409 and forgets it, so the
    row is gone from the log's database."""
    await publish(node, "jobs.a", 3)
    raw = await session(http, node)
    await raw.send(
        {"type": "subscribe", "topics": ["jobs.a"], "since": {"seq": 0}, "consumer": "w"}
    )
    first = await raw.messages(3)
    await raw.send({"type": "ack", "upto": first[0]["seq"]})
    await wait_until(
        lambda: node.pubsub.consumers.log.consumers[(node.keys.node_id, "w")].cursor == 1
    )
    listed = await client.consumers()
    deleted = await client.delete_consumer("w")
    closed = await raw.closed()
    after = await client.consumers()
    with pytest.raises(NotFound):
        await client.delete_consumer("w")
    assert (
        [(node.keys.node_id, "w", ["jobs.a"], 1, 2, True, None)],
        {"deleted": {"owner": node.keys.node_id, "name": "w"}},
        4409,
        [],
    ) == (
        [
            (c["owner"], c["name"], c["topics"], c["cursor"], c["pending"], c["held"], c["lost"])
            for c in listed
        ],
        deleted,
        closed,
        after,
    )
    with contextlib.closing(sqlite3.connect(node.message_log.path)) as db:
        assert [] == db.execute("SELECT name FROM consumers").fetchall()


async def test_token_clients_see_their_own_and_the_node_sees_all(
    node: Node, http: aiohttp.ClientSession, client: Client
) -> None:
    """A token client lists and deletes only its own consumers (``owner`` of another is
    forbidden); the node's own key lists every identity's and deletes any with ``owner``."""
    await publish(node, "jobs.a", 3)
    alice = token_for(node, "sub:jobs.**", "pub:jobs.**", sub="alice")
    bob = token_for(node, "sub:jobs.**", sub="bob")
    await consume(http, node, "w", token=alice)
    await consume(http, node, "w", token=bob)
    await consume(http, node, "mine")
    async with Client(node.url, token=alice) as as_alice:
        own = [(c["owner"], c["name"]) for c in await as_alice.consumers()]
        with pytest.raises(Forbidden):
            await as_alice.consumers(owner=node.keys.node_id)
        with pytest.raises(Forbidden):
            await as_alice.delete_consumer("mine", owner=node.keys.node_id)
    everyone = [(c["owner"], c["name"]) for c in await client.consumers()]
    bob_owner = next(o for o, _ in everyone if o.endswith("/bob"))
    await client.delete_consumer("w", owner=bob_owner)
    left = [(c["owner"], c["name"]) for c in await client.consumers()]
    alice_owner = f"token:{node.keys.node_id}/alice"
    assert (
        [(alice_owner, "w")],
        sorted([(alice_owner, "w"), (bob_owner, "w"), (node.keys.node_id, "mine")]),
        sorted([(alice_owner, "w"), (node.keys.node_id, "mine")]),
    ) == (own, everyone, left)


async def test_a_consumer_name_with_a_slash_is_reached_by_its_escaped_path(
    node: Node, http: aiohttp.ClientSession, client: Client
) -> None:
    """Names are any 1..64 characters: one with ``/`` and a space is deleted by its
    percent-escaped path (the client escapes it; the signature covers the escaped path)."""
    await publish(node, "jobs.a", 3)
    await consume(http, node, "team/a b")
    await client.delete_consumer("team/a b")
    assert [] == await client.consumers()


async def test_consumers_past_the_bounds_are_refused_until_one_is_deleted(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """``max_consumers_per_identity`` bounds one identity's consumers and
    ``max_consumers`` the node's: one more is ``capacity_exceeded`` naming the setting,
    an existing name is still taken, and a deletion makes room."""
    config = make_config(pubsub={"max_consumers_per_identity": 2, "max_consumers": 3})
    async with Node(config) as node, Client(node.url, keys=node.keys) as client:
        await publish(node, "jobs.a", 3)
        token = token_for(node, "sub:jobs.**", sub="t")
        await consume(http, node, "c1")
        await consume(http, node, "c2")
        refusals = []
        for name, as_token in (("c3", None), ("t1", token), ("t2", token)):
            raw = await (
                session(http, node) if as_token is None else session(http, node, token=as_token)
            )
            await raw.send({"type": "subscribe", "topics": ["jobs.a"], "consumer": name})
            frame = await raw.next()
            refusals.append((frame["event"], frame["data"].get("message", "")))
        again = await consume(http, node, "c1")  # an existing one: taken over, not new
        await client.delete_consumer("c2")
        room = await consume(http, node, "c3")
    assert (
        ["error", "subscribed", "error"],
        [True, True],
        [1, 2, 3],
        [1, 2, 3],
    ) == (
        [event for event, _ in refusals],
        [
            "(pubsub.max_consumers_per_identity)" in refusals[0][1],
            "(pubsub.max_consumers)" in refusals[2][1],
        ],
        again,
        room,
    )


async def test_pending_is_counted_exactly_however_far_behind(
    node: Node, http: aiohttp.ClientSession, client: Client
) -> None:
    """A consumer that acked the first of 1,103 messages lists ``pending`` 1,102
    (counted by position in its topic's index, not by walking it); a new one at the head
    lists 0."""
    await publish(node, "jobs.a", 3)
    await consume(http, node, "near")
    await publish_at_once(node, "jobs.a", 1100, start=3)
    await publish(node, "jobs.b", 1)
    raw = await session(http, node)
    await raw.send({"type": "subscribe", "topics": ["jobs.b"], "consumer": "far"})
    await raw.next("subscribed")
    listed = {c["name"]: c["pending"] for c in await client.consumers()}
    assert {"near": 1102, "far": 0} == listed
