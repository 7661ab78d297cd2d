"""``mesh.peers@1.0``, ``mesh.topics@1.0`` and ``pubsub.publish@1.0`` over real HTTP against
a node (spec §2.1): described like any capability, checked against the caller's rights,
usable as a model's tools."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hearthnet.client import Client
from hearthnet.community import CommunityStore, Level
from hearthnet.config import default_node_name
from hearthnet.errors import Forbidden, SchemaMismatch, Unauthorized
from hearthnet.identity import KeyPair, load_or_create_keys
from hearthnet.node import Node
from hearthnet.subscription import Delivery
from tests.conftest import MakeConfig
from tests.helpers import token_for, wait_until

BUILT_IN = ("mesh.peers@1.0", "mesh.topics@1.0", "pubsub.publish@1.0")
# Members publish only where they are trusted; the node itself is an anchor.
TRUSTED_PUBLISH = ({"pattern": "**", "subscribe": "member", "publish": "trusted"},)


@pytest.fixture
async def member(node: Node) -> AsyncIterator[Client]:
    """A client with its own key, a plain member of the node's community."""
    keys = KeyPair.generate()
    node.add_member(keys.node_id, Level.MEMBER, role="device")
    async with Client(node.url, keys=keys) as c:
        yield c


async def test_described_in_the_capability_list_and_the_manifest(client: Client) -> None:
    """/bus/v1/capabilities carries their schemas; the manifest lists them as unary."""
    listed = {
        f"{d['name']}@{d['version']}": d
        for d in (await client.get_json("/bus/v1/capabilities"))["capabilities"]
    }
    manifest = await client.get_json("/manifest")
    summaries = {f"{c['name']}@{c['version']}": c["streaming"] for c in manifest["capabilities"]}
    assert (
        [("object", False, "member")] * 3,
        [False] * 3,
        ["topic", "data"],
    ) == (
        [
            (
                listed[key]["request_schema"]["type"],
                listed[key]["request_schema"]["additionalProperties"],
                listed[key]["min_level"],
            )
            for key in BUILT_IN
        ],
        [summaries[key] for key in BUILT_IN],
        listed["pubsub.publish@1.0"]["request_schema"]["required"],
    )


async def test_publish_through_the_bus_reaches_a_subscriber_as_the_caller(
    node: Node, member: Client
) -> None:
    """A published message arrives with the caller as sender, at the seq the call returned."""
    async with member.subscribe("bus.pub.*") as sub:
        out = await member.call(
            "pubsub.publish@1.0", {"topic": "bus.pub.a", "type": "note", "data": {"x": 1}}
        )
        got = await anext(aiter(sub))
    assert isinstance(got, Delivery)
    assert (
        (out["seq"], out["id"], "bus.pub.a", "note", {"x": 1}),
        {"kind": "device", "id": member.keys.node_id if member.keys else ""},
    ) == ((got.seq, got.id, got.topic, got.type, got.data), got.envelope["sender"])


async def test_publish_obeys_the_access_rules_like_http(make_config: MakeConfig) -> None:
    """With publish = "trusted" a member is refused through the bus as over HTTP, and the
    reserved mesh. prefix is refused even to a trusted member; the node itself may."""
    config = make_config(pubsub={"rules": TRUSTED_PUBLISH})
    member_keys, trusted_keys = KeyPair.generate(), KeyPair.generate()
    async with Node(config) as node:
        node.add_member(member_keys.node_id, Level.MEMBER, role="device")
        node.add_member(trusted_keys.node_id, Level.TRUSTED, role="device")
        async with (
            Client(node.url, keys=member_keys) as member,
            Client(node.url, keys=trusted_keys) as trusted,
            Client(node.url, keys=node.keys) as itself,
        ):
            refused = []
            for attempt in (
                member.call("pubsub.publish@1.0", {"topic": "open.t", "data": 1}),
                member.publish("open.t", "message", 1),
                trusted.call("pubsub.publish@1.0", {"topic": "mesh.fake", "data": 1}),
            ):
                with pytest.raises(Forbidden) as info:
                    await attempt
                refused.append(info.value.code)
            by_trusted = await trusted.call("pubsub.publish@1.0", {"topic": "open.t", "data": 2})
            by_node = await itself.call("pubsub.publish@1.0", {"topic": "mesh.real", "data": 3})
    assert (["forbidden"] * 3, "open.t", "mesh.real") == (
        refused,
        by_trusted["topic"],
        by_node["topic"],
    )


async def test_a_token_needs_the_call_scope_and_publishes_only_where_it_may(node: Node) -> None:
    """call:pubsub.publish lets the token call; its pub: scope still decides the topic."""
    both = token_for(node, "call:pubsub.publish", "pub:tok.*")
    publish_only = token_for(node, "pub:tok.*")
    async with Client(node.url, token=both) as scoped, Client(node.url, token=publish_only) as bare:
        ok = await scoped.call("pubsub.publish@1.0", {"topic": "tok.a", "data": {}})
        with pytest.raises(Forbidden):
            await scoped.call("pubsub.publish@1.0", {"topic": "other.a", "data": {}})
        with pytest.raises(Unauthorized):
            await bare.call("pubsub.publish@1.0", {"topic": "tok.a", "data": {}})
        with pytest.raises(SchemaMismatch):
            await scoped.call("pubsub.publish@1.0", {"topic": "tok.a"})
    assert ("tok.a", 1) == (ok["topic"], ok["origin_seq"])


async def test_each_refuses_a_body_its_schema_does_not_allow(client: Client) -> None:
    """spec §2.1: checked before the handler runs: an unknown field, a limit below 1, a
    publish without data are schema_mismatch (and nothing is published)."""
    bodies = (
        ("mesh.peers@1.0", {"verbose": True}),
        ("mesh.topics@1.0", {"limit": 0}),
        ("pubsub.publish@1.0", {"topic": "never.t"}),
    )
    refused = []
    for capability, body in bodies:
        with pytest.raises(SchemaMismatch) as caught:
            await client.call(capability, body)
        refused.append((capability, caught.value.code))
    topics = await client.call("mesh.topics@1.0", {"prefix": "never"})
    assert ([(c, "schema_mismatch") for c, _ in bodies], []) == (refused, topics["topics"])


async def test_mesh_topics_lists_only_what_the_caller_may_read(node: Node, client: Client) -> None:
    """A token with sub:seen.* sees seen.t and not hidden.t; the node sees both."""
    for topic in ("seen.t", "hidden.t", "seen.t"):
        await client.publish(topic, "m", {})
    token = token_for(node, "call:mesh.topics", "sub:seen.*")
    async with Client(node.url, token=token) as reader:
        theirs = await reader.call("mesh.topics@1.0", {})
    ours = await client.call("mesh.topics@1.0", {"prefix": "seen", "limit": 5})
    everything = await client.call("mesh.topics@1.0", {})
    assert (
        [("seen.t", 2)],
        [("seen.t", 2)],
        ["hidden.t", "seen.t"],
    ) == (
        [(t["topic"], t["messages"]) for t in theirs["topics"]],
        [(t["topic"], t["messages"]) for t in ours["topics"]],
        [t["topic"] for t in everything["topics"]],
    )


async def test_mesh_peers_shows_a_linked_peer_by_its_default_name(make_config: MakeConfig) -> None:
    """Two nodes with no configured name: each sees the other as <host>-<short id>, linked."""
    config_a = make_config(node={"name": ""}, mesh={"dial_interval_s": 0.05})
    config_b = make_config(node={"name": ""}, mesh={"dial_interval_s": 0.05})
    keys_b = load_or_create_keys(config_b.data_path)
    async with Node(config_a) as a:
        a.add_member(keys_b.node_id)
        CommunityStore(config_b.data_path).replace(list(a.membership.records.values()))
        async with Node(config_b) as b:
            b.mesh.book.add(a.url, node=a.keys.node_id)
            await wait_until(lambda: b.keys.node_id in a.mesh.links, what="a link")
            async with Client(b.url, keys=b.keys) as client:
                view = await client.call("mesh.peers@1.0", {})
    row = next(p for p in view["peers"] if p["node"] == a.keys.node_id)
    host = socket.gethostname()
    assert (b.keys.node_id, default_node_name(host, a.keys.node_id), True, 1) == (
        view["node"],
        row["name"],
        row["linked"],
        sum(p["node"] == a.keys.node_id for p in view["peers"]),
    )


async def test_a_stopped_peer_is_one_row_with_its_name_and_addresses(
    make_config: MakeConfig,
) -> None:
    """b knows a at http:// and https:// (there without its id); once a stops, mesh.peers
    on b lists a once, not linked, by name, with both addresses."""
    config_a = make_config(node={"name": ""}, mesh={"dial_interval_s": 0.05})
    config_b = make_config(mesh={"dial_interval_s": 0.05})
    keys_b = load_or_create_keys(config_b.data_path)
    a = Node(config_a)
    await a.__aenter__()
    running = True
    try:
        a.add_member(keys_b.node_id)
        CommunityStore(config_b.data_path).replace(list(a.membership.records.values()))
        a_id, urls = a.keys.node_id, [a.url, a.url.replace("http:", "https:")]
        async with Node(config_b) as b, Client(b.url, keys=b.keys) as client:
            b.mesh.book.add(urls[0], node=a_id)
            b.mesh.book.add(urls[1])
            await wait_until(lambda: a_id in b.mesh.links, what="a link")
            running = False
            await a.__aexit__(None, None, None)
            await wait_until(lambda: a_id not in b.mesh.links, what="the link gone")
            view = await client.call("mesh.peers@1.0", {})
    finally:
        if running:
            await a.__aexit__(None, None, None)
    rows = [p for p in view["peers"] if p["node"] == a_id or p["url"] in urls]
    assert [(a_id, default_node_name(socket.gethostname(), a_id), False, sorted(urls))] == [
        (p["node"], p["name"], p["linked"], p["urls"]) for p in rows
    ]


async def test_mesh_peers_as_a_models_tool(make_config: MakeConfig) -> None:
    """A tool bound to "mesh.peers@1.0" in an llm.chat tools list runs it for the caller."""
    async with (
        Node(make_config(llm={"demo": True})) as node,
        Client(node.url, keys=node.keys) as client,
    ):
        tool: dict[str, Any] = {
            "name": "mesh_peers",
            "description": "The mesh's peers.",
            "parameters": {"type": "object", "properties": {}},
            "capability": "mesh.peers@1.0",
        }
        result = await client.chat(
            [{"role": "user", "content": "which peers are there?"}], tools=[tool], backend="demo"
        )
    results = [e.data for e in result.events if e.kind == "tool_result"]
    assert ([("mesh_peers", node.keys.node_id)], 1) == (
        [(r["name"], r["content"]["node"]) for r in results],
        result.tool_rounds,
    )
