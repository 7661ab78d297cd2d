"""A member that speaks the peer-link protocol by hand, for tests of a real node's side of a
link: it dials an in-process node over loopback, does the real signed handshake, records
every frame it receives and sends whatever frames a test chooses, including ones a real
node would not send (a provider that ignores the flow window, for example)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import WSMsgType

from hearthnet.clock import now_ms
from hearthnet.identity import KeyPair
from hearthnet.mesh.heartbeat import pong_for
from hearthnet.mesh.links import run_handshake
from hearthnet.mesh.protocol import (
    MAX_FRAME_BYTES,
    SUBPROTOCOL,
    Handshake,
    PeerInfo,
    decode_frame,
    encode_frame,
    link_version,
)
from hearthnet.mesh.route_batch import is_batch, split_batch
from hearthnet.mesh.route_header import is_binary, parse_route
from hearthnet.node import Node
from tests.helpers import wait_until


class RawPeer:
    """The hand-driven end of one link to a node."""

    def __init__(self, keys: KeyPair, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.keys = keys
        self.ws = ws
        self.frames: list[dict[str, Any]] = []  # everything received after the handshake
        self.binary: list[bool] = []  # per frame: it came in the binary form (a route)
        self.batches: list[int] = []  # per route batch received (v4): the frames in it
        self.hello: PeerInfo | None = None  # the node's hello, where the test keeps it

    @property
    def node(self) -> str:
        """This peer's NodeID."""
        return self.keys.node_id

    async def send(self, kind: str, **fields: Any) -> None:
        """Send one frame."""
        await self.ws.send_bytes(encode_frame(kind, **fields))

    def received(self, kind: str) -> list[dict[str, Any]]:
        """The frames of one kind received so far."""
        return [f for f in self.frames if f["t"] == kind]

    async def first(self, kind: str, within_s: float = 5.0) -> dict[str, Any]:
        """The first frame of ``kind``, waiting for it if need be."""
        await wait_until(lambda: bool(self.received(kind)), within_s, f"a {kind} frame")
        return self.received(kind)[0]

    async def read(self) -> None:
        """Record frames until the link closes; answer pings so heartbeats keep it up."""
        while (msg := await self.ws.receive()).type == WSMsgType.BINARY:
            # a route batch (v4) is recorded as the route frames in it
            batch = split_batch(msg.data) if is_batch(msg.data) else [msg.data]
            if is_batch(msg.data):
                self.batches.append(len(batch))
            for data in batch:
                # a route frame's binary form is recorded as its map
                frame = parse_route(data).serialize() if is_binary(data) else decode_frame(data)
                self.binary.append(is_binary(data))
                self.frames.append(frame)
                if frame["t"] == "ping":
                    await self.send("pong", **pong_for(frame, now_ms()))


@contextlib.asynccontextmanager
async def raw_peer(
    node: Node,
    seed: bytes = b"\x72" * 32,
    url: str | None = None,
    protocol: str = SUBPROTOCOL,
) -> AsyncIterator[RawPeer]:
    """Add a new member to ``node``'s community and link it to ``node`` over the peer-link
    version ``protocol`` (its hello carrying ``url``, when given)."""
    keys = KeyPair.from_seed(seed)
    node.add_member(keys.node_id)
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(
            node.url + "/mesh/v1/peer", protocols=(protocol,), max_msg_size=MAX_FRAME_BYTES
        )
        try:
            link = link_version(protocol)
            handshake = Handshake(
                keys, node.membership, True, now_ms(), name="raw", url=url, link=link
            )
            await run_handshake(ws, handshake, now_ms)
            peer = RawPeer(keys, ws)
            reader = asyncio.get_running_loop().create_task(peer.read())
            try:
                await wait_until(lambda: keys.node_id in node.mesh.links, what="the link up")
                yield peer
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
        finally:
            await ws.close()
