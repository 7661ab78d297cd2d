"""Attacks on a real relay and on relayed sessions over loopback (spec §8): a member that
poses as a federated relay, a relay that replays an end-to-end hello after a restart.

The attackers are the test itself, speaking the peer-link protocol by hand with the real
signed handshake (tests/mesh/rawpeer.py), so they can send what no node would.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from hearthnet.clock import now_ms
from hearthnet.community import CommunityStore, Level, MembershipRecord
from hearthnet.errors import Unavailable
from hearthnet.identity import KeyPair, load_or_create_keys
from hearthnet.membership import Membership, Source
from hearthnet.mesh.admission import RELAY_JOIN_PATH, Invite, redeem_invite
from hearthnet.mesh.frame_fields import MAX_INNER_BYTES
from hearthnet.mesh.links import run_handshake
from hearthnet.mesh.path_frames import PFrame
from hearthnet.mesh.pathseq import Outbound
from hearthnet.mesh.protocol import (
    MAX_FRAME_BYTES,
    SUBPROTOCOL,
    SUBPROTOCOL_V1,
    SUBPROTOCOL_V3,
    Handshake,
    decode_frame,
    encode_frame,
)
from hearthnet.mesh.relay_frames import Attach, Attached, Route, RouteTable, parse_frame
from hearthnet.mesh.relay_member import RelayEndpoint
from hearthnet.mesh.route_batch import encode_batch
from hearthnet.mesh.route_header import encode_route
from hearthnet.mesh.wsbatch import encode_frames
from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import wait_until
from tests.mesh.rawpeer import RawPeer

PEER_RELAY_URL = "http://127.0.0.1:9"  # the relay's configured peer: nothing listens there


@contextlib.asynccontextmanager
async def linked(
    node: Node, keys: KeyPair, protocol: str = SUBPROTOCOL, **hello: Any
) -> AsyncIterator[RawPeer]:
    """A member with ``keys`` linked to ``node`` by hand (``hello``: Handshake fields),
    offering only ``protocol``; the node's hello is kept in ``peer.hello``."""
    if node.membership.level_of(keys.node_id) is None:
        node.add_member(keys.node_id)
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(
            node.url + "/mesh/v1/peer", protocols=(protocol,), max_msg_size=MAX_FRAME_BYTES
        )
        handshake = Handshake(keys, node.membership, True, now_ms(), name="raw", **hello)
        info = await run_handshake(ws, handshake, now_ms)
        peer = RawPeer(keys, ws)
        peer.hello = info
        reader = asyncio.get_running_loop().create_task(peer.read())
        try:
            await wait_until(lambda: keys.node_id in node.mesh.links, 5, "the link up")
            yield peer
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            await ws.close()


async def test_a_member_posing_as_a_peer_relay_is_not_federated(
    make_config: MakeConfig,
) -> None:
    """A member claiming the peer relay's URL, relay: true, then a route_table: it stays
    a member; a route it sends with another member's from is refused, not forwarded."""
    config = make_config(mesh={"relay": True, "relay_peers": [PEER_RELAY_URL]})
    victim_keys, posing_keys = KeyPair.from_seed(b"\x51" * 32), KeyPair.from_seed(b"\x52" * 32)
    spoofed = KeyPair.from_seed(b"\x53" * 32).node_id
    async with Node(config) as relay:
        relay.add_member(spoofed)
        assert relay.mesh.relaying.relay is not None
        core = relay.mesh.relaying.relay.core
        async with (
            linked(relay, victim_keys) as victim,
            linked(relay, posing_keys, url=PEER_RELAY_URL, relay=True) as posing,
        ):
            await victim.ws.send_bytes(Attach(now_ms()).encode())
            await victim.first("attached")
            table = RouteTable(posing_keys.node_id, 1, ((spoofed, 0),))
            await posing.ws.send_bytes(table.encode())
            forged = Route(victim_keys.node_id, spoofed, 4, 1, b"\x00" * 32)
            await posing.ws.send_bytes(forged.encode())
            await posing.first("detach")  # routing before attaching: unauthorized
            await posing.ws.send_bytes(Attach(now_ms()).encode())
            await posing.first("attached")
            await posing.ws.send_bytes(forged.encode())  # as a member: from is not itself
            await wait_until(lambda: core.statistics().spoofed == 1, 5, "the spoof counted")
            stats = core.statistics()
            got = (stats.federated, stats.foreign_tables, stats.forwarded, victim.received("route"))
    assert (0, 1, 0, []) == got


async def test_a_v1_member_gets_cbor_route_frames_and_a_hello_it_can_read(
    make_config: MakeConfig,
) -> None:
    """Mixed versions (spec §8): a member on hearthnet-peer.v1 gets route frames as CBOR
    maps without control, no budget frame, and a relay hello without relay: true; a member
    on v2 gets the binary form, a budget and the relay flag. Both forms are counted."""
    new_keys, old_keys = KeyPair.from_seed(b"\x54" * 32), KeyPair.from_seed(b"\x55" * 32)
    async with Node(make_config(mesh={"relay": True})) as relay:
        assert relay.mesh.relaying.relay is not None
        async with (
            linked(relay, new_keys) as new,
            linked(relay, old_keys, protocol=SUBPROTOCOL_V1) as old,
        ):
            for peer in (new, old):
                await peer.ws.send_bytes(Attach(now_ms()).encode())
                await peer.first("attached")
            to_old = Route(old.node, new.node, 4, 1, b"to old", control=True)
            await new.ws.send_bytes(encode_route(to_old))
            await old.ws.send_bytes(Route(new.node, old.node, 4, 2, b"to new").encode())
            at_old, at_new = await old.first("route"), await new.first("route")
            forms = [p.binary[p.frames.index(f)] for p, f in ((old, at_old), (new, at_new))]
            hellos = [p.hello is not None and p.hello.relay for p in (new, old)]
            counted = dict(relay.mesh.relaying.relay.v1_routes)
            budgets = [bool(p.received("budget")) for p in (new, old)]  # v1 does not know it
    assert (
        [True, False],
        {
            "t": "route",
            "to": old.node,
            "from": new.node,
            "ttl_hops": 3,
            "id": 1,
            "inner": b"to old",
        },
        Route(new.node, old.node, 3, 2, b"to new"),
        [False, True],
        [True, False],
        {"in": 1, "out": 1},
    ) == (budgets, at_old, parse_frame(at_new), forms, hellos, counted)


async def test_a_relay_passes_a_batch_on_as_one_batch_or_single_frames_by_version(
    make_config: MakeConfig,
) -> None:
    """A route batch's frames for a member on hearthnet-peer.v4 go on as one batch, those
    for a member on v3 as single binary frames (spec §11: no v3 peer is sent a batch)."""
    keys = [KeyPair.from_seed(bytes([0x56 + i]) * 32) for i in range(3)]
    async with Node(make_config(mesh={"relay": True})) as relay:
        assert relay.mesh.relaying.relay is not None
        async with (
            linked(relay, keys[0]) as sender,
            linked(relay, keys[1]) as v4,
            linked(relay, keys[2], protocol=SUBPROTOCOL_V3) as v3,
        ):
            for peer in (sender, v4, v3):
                await peer.ws.send_bytes(Attach(now_ms()).encode())
                await peer.first("attached")
            routes = [
                Route(p.node, sender.node, 4, i, b"x%d" % i) for i, p in enumerate((v4, v3, v4, v3))
            ]
            await sender.ws.send_bytes(encode_batch([encode_route(r) for r in routes]))
            await wait_until(
                lambda: len(v4.received("route")) == 2 and len(v3.received("route")) == 2,
                5,
                "both members' frames",
            )
            got = [(p.batches, [parse_frame(f) for f in p.received("route")]) for p in (v4, v3)]
    hop = [dataclasses.replace(r, ttl_hops=3) for r in routes]
    assert [([2], [hop[0], hop[2]]), ([], [hop[1], hop[3]])] == got


async def test_single_frames_of_one_read_are_decided_as_each_would_be_alone(
    make_config: MakeConfig,
) -> None:
    """Single route frames a v3 member writes at once (one socket read at the relay, which
    decides them as a batch, spec §11): a duplicate is dropped, a frame with no hops left
    answered with a ttl error, the rest go on in order with ttl_hops one less; in a write
    holding a frame whose length field lies, that frame alone is refused."""
    keys = [KeyPair.from_seed(bytes([0x59 + i]) * 32) for i in range(2)]
    async with Node(make_config(mesh={"relay": True})) as relay:
        role = relay.mesh.relaying.relay
        assert role is not None
        async with (
            linked(relay, keys[0], protocol=SUBPROTOCOL_V3) as sender,
            linked(relay, keys[1]) as receiver,
        ):
            for peer in (sender, receiver):
                await peer.ws.send_bytes(Attach(now_ms()).encode())
                await peer.first("attached")
            to, me = receiver.node, sender.node
            first = [
                Route(to, me, 4, 1, b"a"),
                Route(to, me, 4, 1, b"again"),
                Route(to, me, 0, 2, b"no hops"),
                Route(to, me, 4, 3, b"c"),
            ]
            lying = encode_route(Route(to, me, 4, 5, b"lies about its length"))
            lying = lying[:77] + (3).to_bytes(4, "big") + lying[81:]
            second = [
                encode_route(Route(to, me, 4, 4, b"d")),
                lying,
                encode_route(Route(to, me, 4, 6, b"f")),
            ]
            writer = sender.ws._writer.transport  # one write: one read at the relay
            writer.write(encode_frames([encode_route(r) for r in first], masked=True))
            await sender.first("route_error")
            writer.write(encode_frames(second, masked=True))
            await wait_until(lambda: len(receiver.received("route")) == 4, 5, "the frames")
            got = [parse_frame(f) for f in receiver.received("route")]
            errors = [(f["id"], f["code"]) for f in sender.received("route_error")]
            stats = role.core.statistics()
            counted = (
                stats.forwarded,
                stats.duplicates,
                stats.ttl_expired,
                role.route_messages["in"],
            )
    hop = [Route(to, me, 3, i, inner) for i, inner in ((1, b"a"), (3, b"c"), (4, b"d"), (6, b"f"))]
    assert (hop, [(2, "ttl")], (4, 1, 1, 6)) == (got, errors, counted)


async def test_a_relay_dialling_a_v1_node_sends_a_hello_it_can_read(
    make_config: MakeConfig,
) -> None:
    """A node that accepts only hearthnet-peer.v1 gets the relay's hello without relay:
    true (older nodes refuse a field they do not know)."""
    hellos: list[tuple[str | None, dict[str, Any]]] = []

    async def v1_only(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=(SUBPROTOCOL_V1,))
        await ws.prepare(request)
        msg = await ws.receive()
        hellos.append((ws.ws_protocol, decode_frame(msg.data)))
        await ws.close()
        return ws

    app = web.Application()
    app.router.add_get("/mesh/v1/peer", v1_only)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with Node(make_config(mesh={"relay": True, "peers": [url]})):
            await wait_until(lambda: bool(hellos), 10, "the relay's hello")
    finally:
        await runner.cleanup()
    assert [(SUBPROTOCOL_V1, "hello", False)] == [(p, h["t"], "relay" in h) for p, h in hellos]


async def test_a_v1_relay_next_to_a_v2_relay_is_refused_federation_and_counted(
    make_config: MakeConfig,
) -> None:
    """A configured peer relay answering on hearthnet-peer.v1 (hello with relay: true) is
    not federated: refused, logged and counted by reason; its route table is dropped and
    counted; it still attaches as a member."""
    config = make_config(mesh={"relay": True})
    own = load_or_create_keys(Path(config.node.data_dir))
    old_keys, behind = KeyPair.from_seed(b"\x56" * 32), KeyPair.from_seed(b"\x57" * 32)
    view = Membership(own.node_id)
    view.add(view.sign(own, "community.created", own.node_id, now_ms=1, name="t"))
    view.add(view.sign(own, "member.added", old_keys.node_id, now_ms=2, level=Level.MEMBER))
    CommunityStore(Path(config.node.data_dir)).replace(list(view.records.values()))
    peers: list[RawPeer] = []

    async def v1_relay(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=(SUBPROTOCOL_V1,), max_msg_size=MAX_FRAME_BYTES)
        await ws.prepare(request)
        hello = Handshake(old_keys, view, False, now_ms(), name="old relay", relay=True)
        await run_handshake(ws, hello, now_ms)
        peer = RawPeer(old_keys, ws)  # type: ignore[arg-type]
        peers.append(peer)
        await peer.read()
        return ws

    app = web.Application()
    app.router.add_get("/mesh/v1/peer", v1_relay)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    mesh = dataclasses.replace(config.mesh, relay_peers=(url,))
    try:
        async with Node(dataclasses.replace(config, mesh=mesh)) as relay:
            assert relay.mesh.relaying.relay is not None
            role = relay.mesh.relaying.relay
            await wait_until(
                lambda: bool(peers) and sum(role.federation_refused.values()) > 0, 10, "refused"
            )
            old = peers[0]
            await old.ws.send_bytes(RouteTable(old.node, 1, ((behind.node_id, 0),)).encode())
            await old.ws.send_bytes(Attach(now_ms()).encode())
            await old.first("attached")
            stats = role.core.statistics()
            metrics = relay.metrics.render()
            got = (dict(role.federation_refused), stats.federated, stats.foreign_tables)
            routes = role.core.routes()
    finally:
        await runner.cleanup()
    assert ({"v1": 1, "not_a_relay": 0}, 0, 1, {}, True) == (
        *got,
        routes,
        'hearthnet_relay_federation_refused{reason="v1"} 1' in metrics,
    )


Answer = dict[str, Any]


@contextlib.asynccontextmanager
async def carrying_relay(
    inviter_url: str, change: Callable[[Answer], Answer]
) -> AsyncIterator[str]:
    """A relay's ``/mesh/v1/relay/join`` that carries the join to the inviter and hands
    back ``change(answer)``; yields its URL."""

    async def relay_join(request: web.Request) -> web.Response:
        body = await request.json()
        async with (
            aiohttp.ClientSession() as http,
            http.post(inviter_url + "/mesh/v1/join", json=body["request"]) as resp,
        ):
            answer = await resp.json()
        return web.json_response(change(answer), status=resp.status)

    app = web.Application()
    app.router.add_post(RELAY_JOIN_PATH, relay_join)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def legacy(
    signer: KeyPair, community: str, kind: str, subject: str, ts: int, **kw: Any
) -> MembershipRecord:
    """A record as written before chains (no signer_seq, prev)."""
    return MembershipRecord.create(
        signer, kind, community, subject, now_ms=ts, signer_seq=None, prev=None, **kw
    )


async def test_a_relay_cannot_add_records_to_a_join_answer(
    make_config: MakeConfig, tmp_path: Path
) -> None:
    """A relayed answer with a backdated record of a revoked member slipped in is refused;
    the inviter's own answer, legacy records and all, makes the joiner a member."""
    config = make_config()
    founder = load_or_create_keys(Path(config.node.data_dir))
    c = founder.node_id
    alice, sybil = KeyPair.from_seed(b"\x61" * 32), KeyPair.from_seed(b"\x62" * 32)
    old = [
        legacy(founder, c, "community.created", c, 1, name="home"),
        legacy(founder, c, "member.added", alice.node_id, 2, level=Level.TRUSTED),
    ]
    view = Membership(c)
    view.add_all(old, Source.STORE)
    revoked = view.sign(founder, "member.revoked", alice.node_id, now_ms=10)
    CommunityStore(Path(config.node.data_dir)).replace([*old, revoked])
    # alice's key leaked after her revocation: a record dated before it, in the old format
    slipped = legacy(alice, c, "member.added", sybil.node_id, 3).to_json()

    def slip_in(answer: Answer) -> Answer:
        return {**answer, "records": [*answer["records"], slipped]}

    joiners = [tmp_path / "tampered", tmp_path / "honest"]
    async with Node(config) as inviter:
        outcomes: list[object] = []
        for data_dir, change in zip(joiners, (slip_in, lambda a: a), strict=True):
            async with carrying_relay(inviter.url, change) as relay_url:
                invite = Invite.issue(
                    founder, community=c, level=Level.MEMBER, ttl_ms=60_000, now_ms=now_ms(),
                    bootstrap=[], nonce=f"invite-{data_dir.name}", relays=[relay_url],
                )  # fmt: skip
                try:
                    outcomes.append(await redeem_invite(data_dir, invite.encode(), name="j"))
                except Unavailable as exc:
                    outcomes.append(exc.code)
    honest = Membership(c)
    honest.add_all(CommunityStore(joiners[1]).load(), Source.STORE)
    tampered_store = CommunityStore(joiners[0]).load()
    assert (["unavailable", True], [], Level.MEMBER, None, {alice.node_id}) == (
        outcomes,
        [r for r in tampered_store if r.community == c],
        honest.level_of(load_or_create_keys(joiners[1]).node_id),
        honest.level_of(sybil.node_id),
        honest.revoked,
    )


class PlayedRelay:
    """The test as a node's relay, carrying frames for a member it plays (``sender``)."""

    def __init__(self, link: RawPeer, sender: RelayEndpoint) -> None:
        self.link = link
        self.sender = sender
        self.pongs: list[int] = []
        self._read = 0

    async def attach(self) -> None:
        """Answer the node's attach."""
        attach = await self.link.first("attach")
        granted = Attached(
            self.link.node, "127.0.0.1:5000", 1 << 20, 64, MAX_INNER_BYTES, attach["ts"]
        )
        await self.link.ws.send_bytes(granted.encode())

    async def send(self, routes: list[Route]) -> None:
        """Carry routes of the sender to the node."""
        for route in routes:
            await self.link.ws.send_bytes(route.encode())

    async def pump(self) -> None:
        """The sender opens what the node sent it and answers."""
        routes = self.link.received("route")
        for raw in routes[self._read :]:
            route = parse_frame(raw)
            assert isinstance(route, Route)
            opened = self.sender.unwrap(route, now_ms())
            for frame in opened.frames:
                if isinstance(frame, PFrame) and decode_frame(frame.f)["t"] == "pong":
                    self.pongs.append(decode_frame(frame.f)["seq"])
            await self.send(opened.routes)
        self._read = len(routes)

    async def until(self, done: Callable[[], bool], within_s: float, what: str) -> None:
        """Pump until ``done()``."""
        async with asyncio.timeout(within_s):
            while not done():
                await self.pump()
                await asyncio.sleep(0.02)


async def test_a_relay_replaying_an_old_hello_after_a_restart_cannot_wedge_a_session(
    make_config: MakeConfig,
) -> None:
    """The node restarts and its relay replays the sender's old e2e_hello: the node then
    holds keys the sender does not, and after a few sealed frames it cannot open it makes
    new ones; the sender's ping is answered."""
    relay_keys, sender_keys = KeyPair.from_seed(b"\x71" * 32), KeyPair.from_seed(b"\x72" * 32)
    config = make_config(mesh={"relay_urls": [PEER_RELAY_URL]})
    sender = RelayEndpoint(sender_keys, lambda n: True)
    async with Node(config) as node:
        node.add_member(sender_keys.node_id)
        async with linked(node, relay_keys, url=PEER_RELAY_URL) as link:
            relay = PlayedRelay(link, sender)
            await relay.attach()
            sequence = Outbound(epoch=1)
            ping = sequence.send(encode_frame("ping", seq=1, ts=now_ms()), 0.0)
            old_hello = sender.wrap(node.keys.node_id, ping, now_ms())
            await relay.send(old_hello)
            await relay.until(lambda: relay.pongs == [1], 10, "the first life's pong")
    async with Node(config) as node, linked(node, relay_keys, url=PEER_RELAY_URL) as link:
        relay = PlayedRelay(link, sender)
        await relay.attach()
        await relay.send(old_hello)  # replayed: the node answers it, nobody can use that
        await wait_until(lambda: bool(link.received("route")), 5, "the answer to the replay")
        relay._read = len(link.received("route"))  # the relay drops it
        sequence = Outbound(epoch=2)  # the sender's sequence for the node's new life
        for n in (2, 3, 4):
            sequence.send(encode_frame("ping", seq=n, ts=now_ms()), 0.0)

        async def resend() -> None:
            """What the sender's path layer does: resend what was not acknowledged."""
            for frame in sequence.resend_all(0.0):
                await relay.send(sender.wrap(node.keys.node_id, frame, now_ms()))

        async with asyncio.timeout(15):
            while not relay.pongs:
                await resend()
                for _ in range(25):
                    await relay.pump()
                    await asyncio.sleep(0.02)
        assert node.mesh.relaying.endpoint is not None
        refused = dict(node.mesh.relaying.endpoint.refused)
    assert (2, True) == (relay.pongs[0], refused.get("invalid_signature", 0) >= 3)
