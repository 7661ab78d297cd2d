"""Relayed frames on a real node over loopback (spec §8): a relay that alters or replays a
``route`` frame cannot make the receiving member accept it; the member refuses and counts.

The relay here is the test: it dials the node with the real signed handshake (claiming
the relay URL the node was configured with), answers ``attach``, and plays a second member
behind it with its own end-to-end endpoint, so it can seal frames and then tamper with them.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable

import aiohttp

from hearthnet.clock import now_ms
from hearthnet.identity import KeyPair
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
from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.mesh.rawpeer import RawPeer

RELAY_URL = "http://127.0.0.1:9"  # never dialled successfully: the relay dials the node


def flipped(route: Route) -> Route:
    """``route`` with the last byte of its inner frame (the MAC) changed."""
    inner = route.inner[:-1] + bytes([route.inner[-1] ^ 0x01])
    return dataclasses.replace(route, inner=inner)


async def test_a_tampering_relay_cannot_make_a_member_accept_a_frame(
    make_config: MakeConfig,
) -> None:
    """A flipped byte and a replay are refused and counted; the true frame arrives once."""
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
            await ws.send_bytes(flipped(genuine).encode())
            await ws.send_bytes(genuine.encode())
            await ws.send_bytes(dataclasses.replace(genuine, id=genuine.id + 1000).encode())
            assert node.mesh.relaying.endpoint is not None
            refused = node.mesh.relaying.endpoint.refused
            await until(lambda: sum(refused.values()) >= 2 and bool(pongs))
            metrics = node.metrics.render()
            reader.cancel()
    assert ({"invalid_signature": 1, "replayed": 1}, [7], True, True) == (
        dict(refused),
        pongs,
        'hearthnet_relayed_refused_frames{code="invalid_signature"} 1' in metrics,
        'hearthnet_relayed_refused_frames{code="replayed"} 1' in metrics,
    )
