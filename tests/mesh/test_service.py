"""The mesh glue of one in-process node over real loopback sockets (spec §7): its loops
survive a failing round, dials are bounded, refusals are understood, repairs and remote
streams stay within their bounds."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from hearthnet.bus.descriptor import CapabilityDescriptor
from hearthnet.client import Client
from hearthnet.clock import now_ms
from hearthnet.errors import Revoked
from hearthnet.frames import Frame
from hearthnet.identity import KeyPair
from hearthnet.membership import Membership
from hearthnet.mesh.batches import batch_frame
from hearthnet.mesh.heartlog import day_of
from hearthnet.mesh.links import run_handshake
from hearthnet.mesh.protocol import SUBPROTOCOL, SUBPROTOCOL_V2, Handshake, LinkState
from hearthnet.node import Node
from hearthnet.pubsub.envelope import Message, canonical_body
from tests.conftest import MakeConfig
from tests.helpers import wait_until
from tests.mesh.rawpeer import raw_peer


async def test_a_failing_housekeeping_round_does_not_stop_the_mesh(
    make_config: MakeConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """book.save() raising OSError is logged; the next rounds run and save once they can."""
    async with Node(make_config()) as node:
        book = node.mesh.book
        assert book.path is not None
        blocker = book.path.with_suffix(".tmp")  # save() writes here first: a directory fails
        blocker.mkdir(parents=True)
        book.add("http://127.0.0.1:9", source="bootstrap")
        await wait_until(
            lambda: any("mesh-housekeeping" in r.getMessage() for r in caplog.records),
            what="the failed round logged",
        )
        blocker.rmdir()
        await wait_until(book.path.exists, what="a later round saving the book")
        saved = orjson.loads(book.path.read_bytes())
    assert ["http://127.0.0.1:9"] == [a["url"] for a in saved["addresses"]]


async def test_a_dial_to_a_peer_that_never_answers_gives_up_and_frees_its_slot(
    make_config: MakeConfig,
) -> None:
    """A server that takes the TCP connection and never answers the upgrade: dial()
    returns after the dial bound and the address no longer counts as being dialled."""
    held: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        await reader.read()  # until the dialler gives up and closes
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server, Node(make_config()) as node:
        mesh = node.mesh
        mesh.dialer.dial_timeout_s = 0.3
        started = time.monotonic()
        dial = asyncio.get_running_loop().create_task(mesh.dial(url))
        await wait_until(lambda: url in mesh.dialer.dialing, what="the dial under way")
        async with asyncio.timeout(5):
            await dial
        elapsed = time.monotonic() - started
        in_flight = url in mesh.dialer.dialing
    assert (True, 1, False) == (0.25 <= elapsed < 3, len(held), in_flight)


async def test_dialling_our_own_address_forgets_it(node: Node) -> None:
    """The acceptor (this node) refuses a link to itself; the dialling side learns from the
    bye that the address is its own and drops it from the book."""
    port = node.url.rsplit(":", 1)[1]
    url = f"http://localhost:{port}"
    mesh = node.mesh
    mesh.book.add(url, source="bootstrap")
    await mesh.dial(url)
    # both ends of the refused link are this node: refused once accepting, once dialling
    assert (True, False, 2.0, {}) == (
        url in mesh.book.own_urls,
        url in mesh.book.addresses,
        mesh.refused.get("bad_request"),
        mesh.links,
    )


async def test_a_revoked_dialer_is_told_so(node: Node) -> None:
    """A revoked member dials: the acceptor's bye reaches the dialer as Revoked."""
    keys = KeyPair.from_seed(b"\x73" * 32)
    node.add_member(keys.node_id)
    revocation = node.membership.sign(node.keys, "member.revoked", keys.node_id, now_ms=now_ms())
    assert node.apply_membership(revocation)
    view = Membership(node.membership.community_id)
    for record in node.membership.records.values():
        if record.kind != "member.revoked":
            view.add(record)  # the dialer has not heard of its revocation
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(node.url + "/mesh/v1/peer", protocols=(SUBPROTOCOL,))
        try:
            with pytest.raises(Revoked) as refused:
                await run_handshake(ws, Handshake(keys, view, True, now_ms()), now_ms)
        finally:
            await ws.close()
    assert (True, 1.0) == (refused.value.remote, node.mesh.refused.get("revoked"))


async def test_one_repair_per_link_at_a_time(node: Node, client: Client) -> None:
    """Two iwant frames handled back to back on one link answer the range once."""
    origin = node.keys.node_id
    for i in range(5):
        await client.publish("repair.test", "note", {"i": i})
    await wait_until(lambda: node.mesh.tracker.heads.get(origin, 0) >= 5, what="5 stored")
    async with raw_peer(node) as peer:
        link = node.mesh.links[peer.node]
        before = node.mesh.repaired.total()
        iwant = {"t": "iwant", "want": {origin: [1, 5]}}
        # Handled synchronously, as when both frames arrive in one read: the second comes
        # while the first repair waits for the log.
        node.mesh.traffic.receive(link, iwant)
        node.mesh.traffic.receive(link, iwant)
        await wait_until(lambda: len(peer.received("msg")) >= 5, what="the repair")
        await wait_until(
            lambda: not any(t.get_name().startswith("repair-") for t in node.mesh._tasks),
            what="no repair in flight",
        )
        repaired = node.mesh.repaired.total() - before
    assert 5 == repaired


async def test_closing_a_link_leaves_no_bytes_queued(node: Node) -> None:
    """close() counts the bye it queues, so the queue's byte count ends at zero."""
    async with raw_peer(node) as peer:
        link = node.mesh.links[peer.node]
        link.send("ping", seq=1, ts=1)
        link.close("test over")
        await wait_until(lambda: link.state is LinkState.DOWN, what="the link down")
        bye = await peer.first("bye")
    assert (0, "test over", "closing") == (link._queued_bytes, link.down_reason, bye["code"])


async def test_a_provider_past_the_window_ends_the_call_promptly(
    node: Node, client: Client
) -> None:
    """A provider that floods frames without acks overflows the caller's bounded queue; the
    caller gets unavailable at once, not at its deadline."""
    flood = CapabilityDescriptor(name="test.flood", version="1.0", stream_schema={})
    async with raw_peer(node) as peer:
        await peer.send(
            "caps", providers=[{"node": peer.node, "hops": 0, "descriptors": [flood.to_json()]}]
        )
        await wait_until(lambda: peer.node in node.router.remote, what="the route learnt")
        async with client.stream(
            "test.flood@1.0", {}, target=peer.node, deadline_ms=60_000
        ) as stream:
            call = await peer.first("call")
            for seq in range(1, 101):
                token = Frame("token", {"i": seq}).with_seq(seq)
                await peer.send("frame", sid=call["sid"], f=token.to_json())
            await wait_until(lambda: not node.mesh.remote.outgoing, what="the overflow")
            frames = []
            async with asyncio.timeout(5):
                async for frame in stream:
                    frames.append(frame)
        cancel = await peer.first("cancel")
    assert ("error", "unavailable", call["sid"]) == (
        frames[-1].event,
        frames[-1].data.get("code"),
        cancel["sid"],
    )


async def test_old_heartbeat_files_are_pruned_after_start(make_config: MakeConfig) -> None:
    """The first housekeeping round prunes day files past retention (then every hour)."""
    config = make_config()
    heartbeats = Path(config.node.data_dir) / "heartbeats"
    heartbeats.mkdir(parents=True)
    old = heartbeats / "2000-01-01.jsonl"
    recent = heartbeats / f"{day_of(now_ms() - 86_400_000)}.jsonl"
    for path in (old, recent):
        path.write_text("{}\n", encoding="utf-8")
    async with Node(config):
        await wait_until(lambda: not old.exists(), what="the old day file pruned")
    assert (False, True) == (old.exists(), recent.exists())


async def test_gossip_from_a_stranger_origin_is_dropped_not_stored_nor_forwarded(
    node: Node,
) -> None:
    """A member relays messages originated by a non-member (one in mesh.**): each is
    counted and dropped; the member's own message after them is stored and forwarded."""
    stranger = KeyPair.from_seed(b"\x53" * 32)
    foreign = [
        Message.create(stranger, topic=topic, msg_type="m", data={}, origin_seq=1, ts=now_ms())
        for topic in ("chat.room", "mesh.beacon")
    ]
    async with raw_peer(node) as relay, raw_peer(node, seed=b"\x74" * 32) as other:
        own = Message.create(
            relay.keys, topic="chat.room", msg_type="m", data={}, origin_seq=1, ts=now_ms()
        )
        for message in [*foreign, own]:
            await relay.send("msg", raw=message.raw, h=1)
        await wait_until(lambda: node.mesh.log.knows(own.id), what="the member's message stored")
        await other.first("msg")
        forwarded = [orjson.loads(f["raw"]) for f in other.received("msg")]
        stored = await node.mesh.log.reader.read_origin(stranger.node_id, 1, 10, 10)
    assert (2.0, [], [own.id]) == (
        node.mesh.traffic.sig_failures.get("gossip_origin"),
        stored,
        [m["id"] for m in forwarded],
    )


async def test_a_message_that_arrives_before_its_origins_membership_is_repaired(
    node: Node,
) -> None:
    """A message from a key whose member.added arrives later is dropped at first, then
    fetched by anti-entropy (ihave/iwant) once the record is in, and stored."""
    late = KeyPair.from_seed(b"\x75" * 32)
    message = Message.create(
        late, topic="chat.room", msg_type="m", data={}, origin_seq=1, ts=now_ms()
    )
    async with raw_peer(node) as relay:
        # signed here but not applied: it reaches the node over the link, after the message
        record = node.membership.sign(node.keys, "member.added", late.node_id, now_ms=now_ms())
        await relay.send("msg", raw=message.raw, h=1)
        await wait_until(
            lambda: node.mesh.traffic.sig_failures.get("gossip_origin") == 1, what="the drop"
        )
        await relay.send("membership", records=[record.to_json()])
        await wait_until(lambda: node.membership.level_of(late.node_id) is not None, what="joined")
        await relay.send("ihave", heads={late.node_id: 1}, floors={late.node_id: 1})
        iwant = await relay.first("iwant")
        await relay.send("msg", raw=message.raw, h=1)  # the relay answers as a node does
        await wait_until(
            lambda: node.mesh.log.knows(message.id), what="the repaired message stored"
        )
        stored = await node.mesh.log.reader.read_origin(late.node_id, 1, 1, 1)
    assert ({late.node_id: [1, 1]}, [message.raw]) == (iwant["want"], stored)


async def test_a_batch_frame_is_stored_whole_and_forwarded_by_what_each_peer_takes(
    node: Node,
) -> None:
    """A peer's batch of 5 is stored whole and goes on as one batch frame to a v3 peer
    and as 5 msg frames to a v2 one; a batch with one altered message is counted and
    nothing of it is stored; a message with a bytes payload goes to the v3 peer only, and
    the v2 peer's iwant for it is answered with an ihave that moves its head past it."""
    async with (
        raw_peer(node) as sender,
        raw_peer(node, seed=b"\x76" * 32) as new,
        raw_peer(node, seed=b"\x77" * 32, protocol=SUBPROTOCOL_V2) as old,
    ):
        bodies = [
            Message.unsigned(
                sender.node, topic="chat.b", msg_type="m", data=i, origin_seq=i + 1, ts=now_ms()
            )
            for i in range(10)
        ]
        good = Message.signed_batch(
            sender.keys, bodies[:5], [canonical_body(b) for b in bodies[:5]]
        )
        bad = batch_frame(
            Message.signed_batch(sender.keys, bodies[5:], [canonical_body(b) for b in bodies[5:]]),
            1,
        )
        altered = orjson.loads(bad.leaves[1])
        altered["data"] = 99
        bad = dataclasses.replace(
            bad, leaves=(bad.leaves[0], canonical_body(altered), *bad.leaves[2:])
        )
        await sender.ws.send_bytes(bad.encode())
        await sender.ws.send_bytes(batch_frame(good, 1).encode())
        singles = [
            Message.signed(
                sender.keys,
                Message.unsigned(
                    sender.node,
                    topic="chat.b",
                    msg_type="m",
                    data=data,
                    origin_seq=seq,
                    ts=now_ms(),
                ),
            )
            for seq, data in ((6, b"\x00\x01"), (7, "after"))
        ]
        for message in singles:  # the plain one after the binary one, on every link
            await sender.send("msg", raw=message.raw, h=1)
        await wait_until(lambda: len(old.received("msg")) == 6, what="6 msg frames to the old peer")
        await wait_until(lambda: len(new.received("msg")) == 2, what="2 msg frames to the new peer")
        # the old peer asks for the binary message: 7 again, and an ihave moving it past 6
        await old.send("iwant", want={sender.node: [6, 7]})
        skip = {"t": "ihave", "heads": {sender.node: 7}, "floors": {sender.node: 7}}
        await wait_until(lambda: skip in old.received("ihave"), what="the ihave past 6")
        batches = new.received("batch")
        stored = await node.mesh.log.reader.read_origin(sender.node, 1, 5, 10)
        protocols = {p["node"]: p.get("protocol") for p in node.mesh.peers_status()}
    assert (
        1.0,
        [m.raw for m in good],
        [[m.leaf() for m in good]],
        [*(m.raw for m in good), singles[1].raw, singles[1].raw],
        [m.raw for m in singles],
        (SUBPROTOCOL, SUBPROTOCOL_V2),
    ) == (
        node.mesh.traffic.sig_failures.get("gossip_batch"),
        stored,
        [f["leaves"] for f in batches],
        [f["raw"] for f in old.received("msg")],
        [f["raw"] for f in new.received("msg")],
        (protocols[new.node], protocols[old.node]),
    )


async def test_a_relay_of_another_community_is_refused_with_what_to_type(
    make_config: MakeConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """A node started with --relay-url but never joined (it founded a community of its
    own) is refused by its own check of the relay's hello; the warning says to --join."""
    async with Node(make_config(mesh={"relay": True})) as relay:
        config = make_config(mesh={"relay_urls": [relay.url]})
        async with Node(config) as stray:

            def warned() -> list[str]:
                return [
                    r.getMessage()
                    for r in caplog.records
                    if r.levelname == "WARNING" and r.getMessage().startswith("relay ")
                ]

            await wait_until(lambda: bool(warned()), 10, "the relay's refusal")
            assert "another community" in warned()[0]
            assert "--join hn1:" in warned()[0]
            assert {} == stray.mesh.links


async def test_an_origins_messages_held_out_of_order_are_advertised_from_the_lowest(
    node: Node,
) -> None:
    """An origin's message 2 reaches the node before its message 1 (the node linked just
    after the origin's first publish: 2 came live, 1 by anti-entropy). The ``ihave`` a
    newly linked peer gets says floor 1, so a peer that missed 1 asks for it. (Before,
    the floor was the first held, 2: a peer behind took 1 for a hole retention removed
    and never asked for it.)"""
    async with raw_peer(node) as origin:
        first, second = (
            Message.create(
                origin.keys, topic="chat.room", msg_type="m", data=seq, origin_seq=seq, ts=now_ms()
            )
            for seq in (1, 2)
        )
        await origin.send("msg", raw=second.raw, h=1)
        await wait_until(lambda: node.mesh.log.knows(second.id), what="message 2 stored")
        await origin.send("msg", raw=first.raw, h=1)
        await wait_until(lambda: node.mesh.log.knows(first.id), what="message 1 stored")
        async with raw_peer(node, seed=b"\x78" * 32) as newcomer:
            ihave = await newcomer.first("ihave")
    assert (2, 1) == (ihave["heads"].get(origin.node), ihave["floors"].get(origin.node))


async def test_a_hole_skipped_on_a_peers_floor_is_logged_at_debug(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    """A peer whose run of an origin starts at 3: the node skips 1..2 for good (taken
    for a hole retention removed), and says so at debug level, naming the peer."""
    origin = KeyPair.from_seed(b"\x79" * 32)
    caplog.set_level("DEBUG", logger="hearthnet.mesh")
    async with raw_peer(node) as peer:
        await peer.send("ihave", heads={origin.node_id: 5}, floors={origin.node_id: 3})
        await peer.first("iwant")
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert [f"skipped {origin.node_id}'s origin_seqs 1..2 on {peer.node}'s floor 3"] == skipped
