"""Attacks on a real relay and on relayed sessions over loopback (spec §8): a member that
poses as a federated relay, a relay that replays an end-to-end hello after a restart.

The attackers are the test itself, speaking the peer-link protocol by hand with the real
signed handshake (tests/mesh/rawpeer.py), so they can send what no node would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from hearthnet.clock import now_ms
from hearthnet.identity import KeyPair
from hearthnet.mesh.links import run_handshake
from hearthnet.mesh.protocol import MAX_FRAME_BYTES, SUBPROTOCOL, Handshake
from hearthnet.mesh.relay_frames import Attach, Route, RouteTable
from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import wait_until
from tests.mesh.rawpeer import RawPeer

PEER_RELAY_URL = "http://127.0.0.1:9"  # the relay's configured peer: nothing listens there


@contextlib.asynccontextmanager
async def linked(node: Node, keys: KeyPair, **hello: Any) -> AsyncIterator[RawPeer]:
    """A member with ``keys`` linked to ``node`` by hand (``hello``: Handshake fields)."""
    node.add_member(keys.node_id)
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(
            node.url + "/mesh/v1/peer", protocols=(SUBPROTOCOL,), max_msg_size=MAX_FRAME_BYTES
        )
        handshake = Handshake(keys, node.membership, True, now_ms(), name="raw", **hello)
        await run_handshake(ws, handshake, now_ms)
        peer = RawPeer(keys, ws)
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
