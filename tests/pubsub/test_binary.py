"""Binary payloads on real nodes: bytes published over CBOR reach CBOR subscribers as a
byte string and JSON readers as signed base64url text, on this node and across gossip."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import cbor2
import pytest

from hearthnet.caller import Caller
from hearthnet.client import Client
from hearthnet.community import CommunityStore, Level
from hearthnet.errors import BadRequest
from hearthnet.identity import KeyPair, load_or_create_keys
from hearthnet.node import Node
from hearthnet.pubsub.envelope import Message
from hearthnet.pubsub.payload import encode_bytes
from hearthnet.subscription import Delivery
from tests.conftest import MakeConfig
from tests.helpers import wait_until
from tests.pubsub.test_ws import auth_frame, session

Frame = dict[str, Any]
PAYLOAD = bytes(range(256))


class RawCbor:
    """A raw pub/sub WebSocket on the CBOR subprotocol."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws

    @classmethod
    async def open(cls, http: aiohttp.ClientSession, node: Node) -> RawCbor:
        """An authenticated CBOR session as the node itself."""
        ws = await http.ws_connect(
            node.url + "/pubsub/v1/subscribe", protocols=("hearthnet-bus.v2+cbor",)
        )
        raw = cls(ws)
        await raw.send(auth_frame(node.keys, node))
        assert "auth.ok" == (await raw.next())["event"]
        return raw

    async def send(self, frame: Frame) -> None:
        """Send one CBOR frame."""
        await self.ws.send_bytes(cbor2.dumps(frame))

    async def next(self, event: str | None = None, within_s: float = 10.0) -> Frame:
        """The next frame (of ``event``, skipping others)."""
        async with asyncio.timeout(within_s):
            while True:
                msg = await self.ws.receive()
                if msg.type != aiohttp.WSMsgType.BINARY:
                    raise AssertionError(f"socket ended: {msg.type} {self.ws.close_code}")
                frame: Frame = cbor2.loads(msg.data)
                if event is None or frame["event"] == event:
                    return frame


async def test_bytes_over_cbor_reach_each_reader_in_its_form(
    node: Node, http: aiohttp.ClientSession, client: Client
) -> None:
    """A CBOR publish of 256 bytes: a CBOR subscriber gets the byte string, a JSON one,
    history and long-poll the signed base64url text with data_enc; all verify."""
    reader = await RawCbor.open(http, node)
    text_reader = await session(http, node)
    for raw in (reader, text_reader):
        await raw.send({"type": "subscribe", "topics": ["bin.a"], "verify": True})
        await raw.next("subscribed")
    publisher = await RawCbor.open(http, node)
    await publisher.send(
        {"type": "publish", "topic": "bin.a", "msg_type": "blob", "data": PAYLOAD, "ref": "r"}
    )
    ok = (await publisher.next("published.ok"))["data"]
    binary = (await reader.next("message"))["data"]
    text = (await text_reader.next("message"))["data"]
    history = await client.history("bin.a", verify=True)
    poll = await client.request_json(
        "GET", "/pubsub/v1/subscribe", query={"topics": "bin.a", "since_seq": 0, "timeout_s": 0}
    )
    for raw in (reader, text_reader, publisher):
        await raw.ws.close()
    want_text = encode_bytes(PAYLOAD)
    assert (
        ("r", PAYLOAD, None),
        (want_text, "base64url"),
        [(want_text, "base64url")] * 2,
        [PAYLOAD, PAYLOAD],
    ) == (
        (ok["ref"], binary["data"], binary.get("data_enc")),
        (text["data"], text["data_enc"]),
        [
            (f["data"]["data"], f["data"]["data_enc"])
            for f in (*history["messages"], *poll["messages"])
        ],
        [Message.parse(binary).payload, Message.parse(text).payload],
    )


async def _first(sub: Any) -> Delivery:
    async for item in sub:
        assert isinstance(item, Delivery), item
        return item
    raise AssertionError("the subscription ended")


async def test_the_client_publishes_bytes_and_reads_them_back_verified(node: Node) -> None:
    """Bytes published over HTTP and over a CBOR publisher come back as bytes to verifying
    subscribers on CBOR and on JSON; bytes nested in data are refused with the ref."""
    keys = KeyPair.generate()
    node.add_member(keys.node_id, Level.MEMBER, role="device")
    async with Client(node.url, keys=keys) as client:
        await client.publish("chat.bin", "blob", b"\x00over-http")
        async with client.publisher(cbor=True) as pub:
            await pub.publish("chat.bin", "blob", b"\x01over-cbor")
            with pytest.raises(BadRequest, match="bytes has no JSON form"):
                await pub.publish("chat.bin", "blob", {"nested": b"\x02"})
        got: dict[bool, list[Any]] = {}
        for cbor in (True, False):
            async with client.subscribe(
                "chat.bin", since={"seq": 0}, verify=True, cbor=cbor
            ) as sub:
                items = [await _first(sub), await _first(sub)]
                got[cbor] = [(i.payload, type(i.data).__name__) for i in items] + [sub.rejected]
    assert {
        True: [(b"\x00over-http", "bytes"), (b"\x01over-cbor", "bytes"), 0],
        False: [(b"\x00over-http", "str"), (b"\x01over-cbor", "str"), 0],
    } == got


async def test_a_gossiped_bytes_message_is_bytes_again_for_cbor_subscribers(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """Published as bytes on a, gossiped to b as signed JSON: b serves it to a CBOR
    subscriber as the same byte string, and the signature verifies."""
    config_a = make_config(mesh={"dial_interval_s": 0.05})
    config_b = make_config(mesh={"dial_interval_s": 0.05})
    keys_b = load_or_create_keys(config_b.data_path)
    async with Node(config_a) as a:
        a.add_member(keys_b.node_id)
        CommunityStore(config_b.data_path).replace(list(a.membership.records.values()))
        async with Node(config_b) as b:
            b.mesh.book.add(a.url, node=a.keys.node_id)
            await wait_until(lambda: b.keys.node_id in a.mesh.links, what="a link")
            me = Caller(a.keys.node_id, "node", Level.ANCHOR, None, True)
            sent = await a.pubsub.publish(me, "bin.g", "blob", PAYLOAD)
            await wait_until(lambda: b.pubsub.log.head_seq >= 1, what="gossip to b")
            reader = await RawCbor.open(http, b)
            await reader.send(
                {"type": "subscribe", "topics": ["bin.g"], "since": {"seq": 0}, "verify": True}
            )
            got = (await reader.next("message"))["data"]
            await reader.ws.close()
    assert (PAYLOAD, sent.message, a.keys.node_id) == (
        got["data"],
        Message.parse(got),
        got["origin"],
    )
