"""Pub/sub WebSockets served without aiohttp (the connection's first request is the
upgrade), from a raw client on real sockets, in-process and in a `hearthnet node start`
process (uvloop); and the aiohttp fallback for an upgrade on a reused connection."""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from hearthnet.client import Client
from hearthnet.identity import KeyPair, load_or_create_keys
from hearthnet.node import Node
from hearthnet.pubsub.wsupgrade import compiled_unmask
from hearthnet.transport.websocket import OP_BINARY, OP_CLOSE, OP_PING, OP_PONG, OP_TEXT, unmask
from tests.conftest import MakeConfig
from tests.helpers import publish, start_node_process, wait_until
from tests.pubsub.test_ws import auth_frame
from tests.transport.test_websocket import client_frame

KEY = "dGhlIHNhbXBsZSBub25jZQ=="


def addr(node: Node) -> tuple[str, int]:
    """Where an in-process node listens."""
    return node.server.host, node.server.port


def upgrade_request(host: str, protocol: str | None = "hearthnet-bus.v2") -> bytes:
    """A browser-like opening handshake for the pub/sub endpoint."""
    lines = [
        "GET /pubsub/v1/subscribe HTTP/1.1",
        f"Host: {host}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {KEY}",
        "Sec-WebSocket-Version: 13",
    ]
    if protocol is not None:
        lines.append(f"Sec-WebSocket-Protocol: {protocol}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class RawWs:
    """A WebSocket client written from RFC 6455, on asyncio streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.head = b""

    @classmethod
    async def open(cls, host: str, port: int, *, before: bytes = b"", split: int = 0) -> RawWs:
        """Connect, optionally send ``before`` (an earlier request on the same connection,
        whose response is read), then upgrade (in ``split``-byte writes when given)."""
        reader, writer = await asyncio.open_connection(host, port)
        raw = cls(reader, writer)
        if before:
            writer.write(before)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
        request = upgrade_request(f"{host}:{port}")
        for i in range(0, len(request), split or len(request)):
            writer.write(request[i : i + (split or len(request))])
            await writer.drain()
        raw.head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        return raw

    def send(self, payload: bytes, opcode: int = OP_TEXT) -> None:
        """One masked frame."""
        self.writer.write(client_frame(payload, opcode))

    def send_json(self, obj: dict[str, Any]) -> None:
        """One JSON text frame."""
        self.send(json.dumps(obj).encode())

    async def frame(self) -> tuple[int, bytes]:
        """The next server frame (opcode, payload); server frames are never masked. The
        node's keepalive pings (every ``transport.ws_ping_s``: a test on a loaded machine
        can outlast it) are answered with a pong and skipped, as a client does."""
        while True:
            b0, b1 = await asyncio.wait_for(self.reader.readexactly(2), 5)
            assert not b1 & 0x80, "server frames must not be masked"
            length = b1 & 0x7F
            if length == 126:
                (length,) = struct.unpack("!H", await self.reader.readexactly(2))
            elif length == 127:
                (length,) = struct.unpack("!Q", await self.reader.readexactly(8))
            payload = await self.reader.readexactly(length)
            if b0 & 0x0F != OP_PING:
                return b0 & 0x0F, payload
            self.send(payload, OP_PONG)

    async def event(self, name: str) -> dict[str, Any]:
        """The next JSON frame with ``event`` == ``name`` (skipping others)."""
        while True:
            opcode, payload = await self.frame()
            assert opcode == OP_TEXT, (opcode, payload)
            obj: dict[str, Any] = json.loads(payload)
            if obj["event"] == name:
                return obj

    async def close_code(self) -> int:
        """Frames until the close frame; its code."""
        while True:
            opcode, payload = await self.frame()
            if opcode == OP_CLOSE:
                return int(struct.unpack("!H", payload[:2])[0])

    async def end(self) -> None:
        """Close the socket."""
        self.writer.close()
        await self.writer.wait_closed()


async def subscribed(keys: KeyPair, raw: RawWs, topic: str) -> None:
    """Authenticate as the node (``keys``) and subscribe to ``topic``."""
    raw.send_json(auth_frame(keys, keys.node_id))
    await raw.event("auth.ok")
    raw.send_json({"type": "subscribe", "topics": [topic]})
    await raw.event("subscribed")


async def test_a_fresh_connection_is_served_without_aiohttp(make_config: MakeConfig) -> None:
    """The 101 is ours (no aiohttp Server header); auth, subscribe, a live message, a ping
    answered with its payload, and a client close echoed; the session is released."""
    async with Node(make_config()) as node:
        raw = await RawWs.open(*addr(node), split=7)  # a head that arrives in pieces
        await subscribed(node.keys, raw, "lean.t")
        await publish(node, "lean.t", 1)
        message = await raw.event("message")
        raw.send(b"are you there", OP_PING)
        pong = await raw.frame()
        raw.send(struct.pack("!H", 1000), OP_CLOSE)
        code = await raw.close_code()
        await raw.end()
        await wait_until(lambda: not node.streams.sockets, what="the session released")
        left = (node.connections.total, len(node.pubsub.subscribers), len(node.streams.sockets))
    assert (True, b"server:" not in raw.head.lower()) == (
        raw.head.startswith(b"HTTP/1.1 101 "),
        True,
    )
    assert ({"i": 0}, (OP_PONG, b"are you there"), 1000, (0, 0, 0)) == (
        message["data"]["data"],
        pong,
        code,
        left,
    )


async def test_a_node_process_serves_lean_sockets(tmp_path: Path) -> None:
    """The same over a `hearthnet node start` process (uvloop's transports)."""
    proc = start_node_process(tmp_path / "d")
    try:
        url = urlsplit(proc.url)
        assert url.hostname is not None
        assert url.port is not None
        keys = load_or_create_keys(tmp_path / "d")
        raw = await RawWs.open(url.hostname, url.port, split=5)
        await subscribed(keys, raw, "proc.t")
        async with Client(proc.url, keys=keys) as client:
            await client.publish("proc.t", "m", {"i": 7})
        message = await raw.event("message")
        raw.send(struct.pack("!H", 1000), OP_CLOSE)
        code = await raw.close_code()
        await raw.end()
    finally:
        proc.stop()
    assert (b"server:" not in raw.head.lower(), {"i": 7}, 1000) == (
        True,
        message["data"]["data"],
        code,
    )


async def test_an_upgrade_on_a_reused_connection_goes_through_aiohttp(
    make_config: MakeConfig,
) -> None:
    """A keep-alive connection that first asked for /status, then upgrades: same protocol."""
    async with Node(make_config()) as node:
        status = b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n"
        raw = await RawWs.open(*addr(node), before=status)
        await subscribed(node.keys, raw, "reused.t")
        await publish(node, "reused.t", 2)
        got = [(await raw.event("message"))["data"]["data"]["i"] for _ in range(2)]
        await raw.end()
    assert (True, [0, 1]) == (b"server:" in raw.head.lower(), got)


@pytest.mark.parametrize(
    ("frame", "code", "refused"),
    [
        (struct.pack("!BB", 0x81, 1) + b"x", 1002, None),  # unmasked
        (client_frame(b"x" * 2000), 1009, "payload_too_large"),
        (client_frame(b"\x01", OP_BINARY), 1003, "bad_request"),  # binary on JSON
    ],
)
async def test_bad_frames_close_with_their_code(
    make_config: MakeConfig, frame: bytes, code: int, refused: str | None
) -> None:
    """Protocol errors 1002, oversized messages 1009 (counted), wrong frame type 1003."""
    async with Node(make_config(transport={"max_ws_message_bytes": 1024})) as node:
        raw = await RawWs.open(*addr(node))
        raw.send_json(auth_frame(node.keys, node.keys.node_id))
        await raw.event("auth.ok")
        raw.writer.write(frame)
        got = await raw.close_code()
        await raw.end()
        counted = (
            node.metrics.counter("hearthnet_requests_refused_total", "").get(refused, "ws")
            if refused
            else 1.0
        )
    assert (code, 1.0) == (got, counted)


async def test_refusals_before_the_upgrade_are_answered_by_http(make_config: MakeConfig) -> None:
    """An unknown subprotocol still gets 426 with the supported list (from aiohttp)."""
    async with Node(make_config()) as node:
        reader, writer = await asyncio.open_connection(*addr(node))
        writer.write(upgrade_request("{}:{}".format(*addr(node)), protocol="mqtt"))
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        writer.close()
    assert head.startswith(b"HTTP/1.1 426 ")
    assert b"hearthnet-bus.v2" in head


async def test_node_shutdown_says_going_away(make_config: MakeConfig) -> None:
    """A subscriber on a stopping node gets close 1001 at once (it can resume elsewhere)."""
    node = Node(make_config())
    await node.__aenter__()
    raw = await RawWs.open(*addr(node))
    await subscribed(node.keys, raw, "bye.t")
    stopping = asyncio.create_task(node.__aexit__(None, None, None))
    code = await raw.close_code()
    await stopping
    await raw.end()
    assert 1001 == code


def test_compiled_unmasking_matches_the_pure_one() -> None:
    """aiohttp's compiled XOR unmasks every length as RFC 6455's plain loop does."""
    mask = b"\x9a\x01\xff\x10"
    payloads = [bytes((i * 7 + n) & 0xFF for i in range(n)) for n in (0, 1, 3, 4, 5, 125, 333)]
    expected = [bytes(b ^ mask[i % 4] for i, b in enumerate(p)) for p in payloads]
    assert expected == [compiled_unmask(p, mask) for p in payloads]
    assert expected == [unmask(p, mask) for p in payloads]
