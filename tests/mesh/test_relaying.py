"""Relayed paths on real nodes over loopback (spec §8): a relay that alters, replays or
drops a ``route`` frame cannot make the receiving member accept it (or a later frame
ahead of it); a direct link replaces a relayed one.

In the tampering test the relay is the test itself: it dials the node with the real
signed handshake (claiming the relay URL the node was configured with), answers
``attach``, and plays a second member behind it with its own end-to-end endpoint, so it
can seal frames and then tamper with them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import pytest

from hearthnet.client import Client
from hearthnet.clock import now_ms
from hearthnet.community import CommunityStore, Level
from hearthnet.config import Config
from hearthnet.identity import KeyPair, load_or_create_keys
from hearthnet.membership import Membership
from hearthnet.mesh.addresses import normalize_url
from hearthnet.mesh.admission import RELAY_JOIN_PATH, Invite, join_request
from hearthnet.mesh.frame_fields import MAX_INNER_BYTES
from hearthnet.mesh.links import run_handshake
from hearthnet.mesh.path_frames import PFrame
from hearthnet.mesh.pathseq import Outbound
from hearthnet.mesh.protocol import (
    MAX_FRAME_BYTES,
    SUBPROTOCOL,
    Handshake,
    decode_frame,
    encode_frame,
)
from hearthnet.mesh.relay_frames import Attached, Route, Sealed, decode, parse_frame
from hearthnet.mesh.relay_member import RelayEndpoint
from hearthnet.mesh.relayed_link import path_fields
from hearthnet.mesh.route_batch import encode_batch
from hearthnet.mesh.route_header import encode_route
from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import free_port, wait_until
from tests.mesh.rawpeer import RawPeer

if TYPE_CHECKING:
    from tests.mesh.conftest import RelayedTrio

UNDIALLABLE = "http://127.0.0.1:9"  # the discard port: nothing listens there
RELAY_URL = UNDIALLABLE  # the test's relay dials the node instead


def one_community(configs: list[Config]) -> None:
    """Keys in each data dir and one membership log, founded by the first."""
    keys = [load_or_create_keys(Path(c.node.data_dir)) for c in configs]
    view = Membership(keys[0].node_id)
    view.add(view.sign(keys[0], "community.created", keys[0].node_id, now_ms=1, name="t"))
    for i, k in enumerate(keys[1:]):
        view.add(view.sign(keys[0], "member.added", k.node_id, now_ms=2 + i, level=Level.MEMBER))
    for c in configs:
        CommunityStore(Path(c.node.data_dir)).replace(list(view.records.values()))


def relayed_to(config: Config, relay_url: str) -> Config:
    """``config`` attached to the relay at ``relay_url``, advertising no dialable address
    and not punching (on loopback nothing filters, so a punch is a race of plain dials)."""
    mesh = dataclasses.replace(
        config.mesh,
        relay_urls=(relay_url,),
        advertise_url=UNDIALLABLE,
        heartbeat_s=1.0,
        direct_upgrade=False,
    )
    return dataclasses.replace(config, mesh=mesh)


def path_to(node: Node, peer: Node) -> str | None:
    """``direct`` or ``relayed`` for the link from ``node`` to ``peer``; None when unlinked."""
    link = node.mesh.links.get(peer.keys.node_id)
    return None if link is None else str(path_fields(link)["path"])


@pytest.mark.asyncio(loop_scope="session")
async def test_a_direct_link_replaces_a_relayed_one(relayed_trio: RelayedTrio) -> None:
    """Two members linked through a relay that then link directly keep only the direct link,
    and ``/status`` counts no peer relayed any more (``relaying.paths.relayed``), even
    with a relayed path to the peer still kept beside the direct link."""
    a, b = relayed_trio.a, relayed_trio.b

    def relayed() -> list[int]:
        return [n.mesh.relaying.statistics()["paths"]["relayed"] for n in (a, b)]

    before = relayed()
    a.mesh.spawn(a.mesh.dial(b.url), "dial-b")

    def paths() -> list[list[str]]:
        return [sorted(path_fields(link)["path"] for link in n.mesh.links.values()) for n in (a, b)]

    await wait_until(lambda: relayed_trio.paths() == ("direct", "direct"), 10, "a, b direct")
    # Each keeps its link to the relay beside the direct one; on a loaded machine a member
    # may be re-attaching to the relay (silent for mesh.relay_silence_s) now, so wait for it.
    both = [["direct", "direct"], ["direct", "direct"]]
    await wait_until(lambda: paths() == both, 20, "a and b linked to the relay and each other")
    # a relayed path opened for a peer a direct link then served (a probe sent before it)
    member = a.mesh.relaying.member
    assert member is not None
    member.paths.forget(b.keys.node_id)
    member.path_actions(member.paths.connect(b.keys.node_id, time.monotonic()))
    expected = (both, ("direct", "direct"), [1, 1], [0, 0])
    assert expected == (paths(), relayed_trio.paths(), before, relayed())


@pytest.mark.asyncio(loop_scope="session")
async def test_frames_sent_in_one_turn_cross_the_relay_in_batches(
    relayed_trio: RelayedTrio,
) -> None:
    """Route frames a member queues in one loop turn reach the relay in route batches
    (spec §11, v4 links) and arrive at the other member, every one; the relay learnt each
    member's relays from its hello (v4, spec §8)."""
    a, b, relay = relayed_trio.a, relayed_trio.b, relayed_trio.relay
    learnt = [relay.mesh.links[n.keys.node_id].peer.relays for n in (a, b)]
    role = relay.mesh.relaying.relay
    assert role is not None
    link = a.mesh.links[b.keys.node_id]
    before = role.route_messages["in"], role.core.statistics().forwarded
    opened = b.mesh.relaying.counts["frames_in"]
    for _ in range(50):  # one turn: no await between them
        link.send_raw(encode_frame("peers", peers=[]))
    await wait_until(lambda: b.mesh.relaying.counts["frames_in"] - opened >= 50, 10, "b has all")
    messages = role.route_messages["in"] - before[0]
    frames = role.core.statistics().forwarded - before[1]
    relays = [(normalize_url(relay.url),)] * 2
    assert (True, True, relays) == (frames >= 50, messages <= frames // 4, learnt)


def flipped(route: Route) -> Route:
    """``route`` with the last byte of its inner frame (the MAC) changed."""
    inner = route.inner[:-1] + bytes([route.inner[-1] ^ 0x01])
    return dataclasses.replace(route, inner=inner)


async def test_a_tampering_relay_cannot_make_a_member_accept_a_frame(
    make_config: MakeConfig,
) -> None:
    """A flipped byte, a rewritten from or to, and a replay are refused and counted, alone
    or in a route batch; the true frame arrives once. A frame the relay drops holds the
    next one back until the sender resends it: both arrive once, in order, and the gap is
    counted."""
    relay_keys, sender_keys = KeyPair.from_seed(b"\x31" * 32), KeyPair.from_seed(b"\x32" * 32)
    async with Node(make_config(mesh={"relay_urls": [RELAY_URL]})) as node:
        node.add_member(relay_keys.node_id)
        node.add_member(sender_keys.node_id)
        sender = RelayEndpoint(sender_keys, lambda n: True)
        sequence = Outbound(epoch=1)
        ping = sequence.send(encode_frame("ping", seq=7, ts=now_ms()), 0.0)
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(
                node.url + "/mesh/v1/peer", protocols=(SUBPROTOCOL,), max_msg_size=MAX_FRAME_BYTES
            )
            hello = Handshake(
                relay_keys, node.membership, True, now_ms(), name="relay", url=RELAY_URL
            )
            await run_handshake(ws, hello, now_ms)
            relay = RawPeer(relay_keys, ws)
            reader = asyncio.get_running_loop().create_task(relay.read())
            attach = await relay.first("attach")
            granted = Attached(
                relay_keys.node_id, "127.0.0.1:5000", 1 << 20, 64, MAX_INNER_BYTES, attach["ts"]
            )
            await ws.send_bytes(granted.encode())

            captured: list[Route] = []  # the sender's sealed frame, held back by the relay
            pongs: list[int] = []
            pumped = 0

            async def pump() -> None:
                """The sender opens what the node sent it and answers its hellos."""
                nonlocal pumped
                routes = relay.received("route")
                for raw in routes[pumped:]:
                    route = parse_frame(raw)
                    assert isinstance(route, Route)
                    opened = sender.unwrap(route, now_ms())
                    for frame in opened.frames:
                        if isinstance(frame, PFrame):
                            inner = decode_frame(frame.f)
                            if inner["t"] == "pong":
                                pongs.append(inner["seq"])
                    for out in opened.routes:
                        if isinstance(decode(out.inner), Sealed):
                            captured.append(out)
                        else:
                            await ws.send_bytes(out.encode())
                pumped = len(routes)

            for out in sender.wrap(node.keys.node_id, ping, now_ms()):
                if isinstance(decode(out.inner), Sealed):
                    captured.append(out)
                else:
                    await ws.send_bytes(out.encode())

            async def until(done: Callable[[], bool]) -> None:
                async with asyncio.timeout(10):
                    while not done():
                        await pump()
                        await asyncio.sleep(0.02)

            await until(lambda: bool(captured))
            genuine = captured[0]
            forged = [
                flipped(genuine),
                # spec §8: the header's from and to are bound to the sealed frame (only
                # the two ends hold its keys): rewritten, it opens nowhere
                dataclasses.replace(genuine, from_=relay_keys.node_id),
                dataclasses.replace(genuine, to=relay_keys.node_id),
            ]
            for route in forged[:2]:
                await ws.send_bytes(encode_route(route))
            replayed = dataclasses.replace(genuine, id=genuine.id + 1000, control=True)
            # the rest in one route batch (a v4 link): each frame is judged alone
            batch = [encode_route(r) for r in (forged[2], genuine, replayed)]
            await ws.send_bytes(encode_batch(batch))
            assert node.mesh.relaying.endpoint is not None
            refused = node.mesh.relaying.endpoint.refused
            await until(lambda: sum(refused.values()) >= 3 and bool(pongs))
            tampered = (dict(refused), node.mesh.relaying.counts["misdelivered"], list(pongs))
            # the relay drops the frame of ping 8 and carries ping 9's: the node must hold
            # 9 back (an unordered receiver would answer 9 before the resent 8 below)
            dropped, kept = (
                sequence.send(encode_frame("ping", seq=n, ts=now_ms()), 0.0) for n in (8, 9)
            )
            sender.wrap(node.keys.node_id, dropped, now_ms())  # never carried
            for frame in (kept, dropped):  # 8 again, as the sender's resend seals it anew
                for out in sender.wrap(node.keys.node_id, frame, now_ms()):
                    await ws.send_bytes(encode_route(out))
            await until(lambda: len(pongs) >= 3)
            metrics = node.metrics.render()
            gaps = node.mesh.relaying.endpoint.gaps
            reader.cancel()
    assert (({"invalid_signature": 2, "replayed": 1}, 1, [7]), True, True) == (
        tampered,
        'hearthnet_relayed_refused_frames{code="invalid_signature"} 2' in metrics,
        'hearthnet_relayed_refused_frames{code="replayed"} 1' in metrics,
    )
    assert ([7, 8, 9], 1, True) == (pongs, gaps, "\nhearthnet_relayed_gaps 1\n" in metrics)


async def test_a_member_without_room_for_links_calls_through_the_relays_links(
    make_config: MakeConfig,
) -> None:
    """A member whose only link slot holds its relay opens no relayed link; calls still go."""
    configs = [make_config(mesh={"relay": True}), make_config(), make_config()]
    one_community(configs)
    async with Node(configs[0]) as relay:
        full = relayed_to(configs[1], relay.url)
        full = dataclasses.replace(full, mesh=dataclasses.replace(full.mesh, max_links=1))
        async with Node(full) as a, Node(relayed_to(configs[2], relay.url)) as b:
            target = b.keys.node_id
            await wait_until(lambda: target in a.router.remote, 10, "a route to b")
            async with Client(a.url, keys=a.keys) as client:
                answer = await client.call_with_meta("echo@1.0", {"x": 5}, target=target)
            links = sorted(a.mesh.links)
    assert ((target, {"echo": {"x": 5}}), [relay.keys.node_id]) == (
        (answer["meta"]["node"], answer["output"]),
        links,
    )


async def test_members_of_two_federated_relays_reach_each_other(
    make_config: MakeConfig,
) -> None:
    """Relays federate when each names the other; a and b, one on each, call relayed."""
    ports = (free_port(), free_port())
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    configs = [
        make_config(node={"port": ports[i]}, mesh={"relay": True, "relay_peers": [urls[1 - i]]})
        for i in range(2)
    ]
    configs += [make_config(), make_config()]
    one_community(configs)
    async with (
        Node(configs[1]) as relay2,
        Node(configs[0]) as relay1,
        Node(relayed_to(configs[2], relay1.url)) as a,
        Node(relayed_to(configs[3], relay2.url)) as b,
    ):
        ids = (relay1.keys.node_id, relay2.keys.node_id, a.keys.node_id, b.keys.node_id)
        cores = [r.mesh.relaying.relay.core for r in (relay1, relay2) if r.mesh.relaying.relay]
        await wait_until(
            lambda: [c.routes() for c in cores] == [{ids[3]: ids[1]}, {ids[2]: ids[0]}],
            10,
            "each relay routes to the other's member",
        )
        await wait_until(
            lambda: (path_to(a, b), path_to(b, a)) == ("relayed", "relayed"),
            15,
            "a and b relayed to each other",
        )
        via = (
            path_fields(a.mesh.links[ids[3]])["via"],
            path_fields(b.mesh.links[ids[2]])["via"],
        )
        async with Client(a.url, keys=a.keys) as client:
            answer = await client.call_with_meta("echo@1.0", {"x": 3}, target=ids[3])
        shown = [r.mesh.relaying.statistics()["relay"] for r in (relay1, relay2)]
    assert ((ids[0], ids[1]), (ids[3], {"echo": {"x": 3}}), [(1, 1), (1, 1)]) == (
        via,
        (answer["meta"]["node"], answer["output"]),
        [(s["federated"], s["routes"]) for s in shown],
    )


async def test_a_relay_carries_a_join_only_for_an_inviter_linked_to_it(
    make_config: MakeConfig,
) -> None:
    """Relayed joins: a non-relay says not_found, a wrong 'to' is bad_request, an unlinked
    inviter unavailable, a forged request invalid_signature; none reaches the membership."""
    configs = [make_config(), make_config(mesh={"relay": True}), make_config(), make_config()]
    one_community(configs[:3])
    founder = load_or_create_keys(Path(configs[0].node.data_dir))
    joiner = load_or_create_keys(Path(configs[3].node.data_dir))
    async with Node(configs[1]) as relay, Node(configs[2]) as plain:
        community = relay.authenticator.community_id
        invite = Invite.issue(
            founder, community=community, level=Level.MEMBER, ttl_ms=60_000,
            now_ms=now_ms(), bootstrap=[UNDIALLABLE], nonce="nonce-0001", relays=[relay.url],
        )  # fmt: skip
        request = join_request(joiner, invite, name="j", now_ms=now_ms())
        forged = {**request, "name": "someone else"}
        tries = [
            (plain.url, founder.node_id, request),
            (relay.url, relay.keys.node_id, request),
            (relay.url, founder.node_id, request),
            (relay.url, founder.node_id, forged),
        ]
        codes = []
        async with aiohttp.ClientSession() as http:
            for url, to, body in tries:
                async with http.post(
                    url + RELAY_JOIN_PATH, json={"to": to, "request": body}
                ) as resp:
                    codes.append((resp.status, (await resp.json())["error"]))
        members = joiner.node_id in relay.authenticator.membership.members
    assert (
        [
            (404, "not_found"),
            (400, "bad_request"),
            (503, "unavailable"),
            (401, "invalid_signature"),
        ],
        False,
    ) == (codes, members)


async def test_a_relay_admits_a_relayed_join_to_its_own_invite(make_config: MakeConfig) -> None:
    """An invite the relay made itself, redeemed through the relayed-join route (what a
    joiner tries when the invite's bootstrap did not answer): the relay admits it as
    ``POST /mesh/v1/join`` would, instead of answering that it is not linked to itself."""
    configs = [make_config(mesh={"relay": True}), make_config()]
    one_community(configs[:1])
    joiner = load_or_create_keys(Path(configs[1].node.data_dir))
    async with Node(configs[0]) as relay:
        invite = Invite.issue(
            relay.keys, community=relay.authenticator.community_id, level=Level.MEMBER,
            ttl_ms=60_000, now_ms=now_ms(), bootstrap=[UNDIALLABLE], nonce="nonce-0002",
            relays=[relay.url],
        )  # fmt: skip
        request = join_request(joiner, invite, name="j", now_ms=now_ms())
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                relay.url + RELAY_JOIN_PATH, json={"to": relay.keys.node_id, "request": request}
            ) as resp,
        ):
            status, answer = resp.status, await resp.json()
        members = joiner.node_id in relay.authenticator.membership.members
    assert (200, relay.keys.node_id, True) == (status, answer.get("admitter"), members)
