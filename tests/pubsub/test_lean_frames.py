"""Lean message frames: a subscriber that names ``fields`` in its subscribe gets only
those envelope fields, in every form; the rest of the frame keeps its shape."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import cbor2
import orjson
import pytest

from hearthnet.client import Client
from hearthnet.errors import BadRequest
from hearthnet.identity import KeyPair
from hearthnet.node import Node
from hearthnet.pubsub.envelope import Message, StoredMessage, canonical_body
from hearthnet.pubsub.frames import parse_fields
from hearthnet.pubsub.payload import encode_bytes
from hearthnet.pubsub.wire import EncodedMessage, TopicBatch, lean_form
from tests.helpers import publish, publish_at_once, token_for, wait_until
from tests.pubsub.test_http import RawSse
from tests.pubsub.test_ws import session


def _message(data: Any, data_enc: str | None = None) -> Message:
    keys = KeyPair.generate()
    body = Message.unsigned(
        keys.node_id, topic="l.t", msg_type="m", data=data, origin_seq=1, ts=5, ttl_s=60
    )
    if data_enc is not None:
        body["data_enc"] = data_enc
    return Message.signed_batch(keys, [body], [canonical_body(body)])[0]


def _payload(frame: bytes) -> bytes:
    """The payload of one unmasked WebSocket frame."""
    size = frame[1] & 0x7F
    return frame[{126: 4, 127: 10}.get(size, 2) :]


def test_lean_forms_carry_only_the_named_fields_in_every_form() -> None:
    """json, ws_text, ws_cbor and sse hold the named fields (data_enc beside bytes data)."""
    text = EncodedMessage(StoredMessage(7, _message({"a": 1})))
    raw = bytes(range(5))
    binary = EncodedMessage(StoredMessage(8, _message(encode_bytes(raw), "base64url")))
    fields = ("type", "data", "topic")
    want = {"event": "message", "data": {"topic": "l.t", "type": "m", "data": {"a": 1}}, "seq": 7}
    sse = text.form(lean_form("sse", fields)).decode().split("\n")
    assert (
        want,
        want,
        want,
        ["event: message", "id: 7"],
        {"data": encode_bytes(raw), "data_enc": "base64url", "ts": 5},
        {"data": raw, "ts": 5},
    ) == (
        orjson.loads(text.form(lean_form("json", fields))),
        orjson.loads(_payload(text.form(lean_form("ws_text", fields)))),
        cbor2.loads(_payload(text.form(lean_form("ws_cbor", fields)))),
        [sse[0], sse[2]],
        orjson.loads(_payload(binary.form(lean_form("ws_text", ("ts", "data")))))["data"],
        cbor2.loads(_payload(binary.form(lean_form("ws_cbor", ("data", "ts")))))["data"],
    )


def test_a_lean_form_is_one_name_and_encoded_once_per_message() -> None:
    """The same fields in any order name one form; a batch gives the same bytes again."""
    message = _message(1)
    group = TopicBatch("l.t", [EncodedMessage(StoredMessage(1, message))])
    name = lean_form("ws_text", ("data", "id"))
    first = group.form(name)[1][0]
    want = b'{"event":"message","data":{"id":"%s","data":1},"seq":1}' % message.id.encode()
    assert (True, True, want) == (
        name is lean_form("ws_text", ("id", "data")),
        first is group.form(lean_form("ws_text", ("id", "data")))[1][0],
        _payload(first),
    )


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        (["data", "sig"], "sig comes with verify"),
        (["data", "data"], "twice"),
        ("data", "list of envelope fields"),
        ([], "list of envelope fields"),
        (["origin", "nope"], "unknown envelope field 'nope'"),
    ],
)
def test_fields_are_checked(fields: Any, error: str) -> None:
    """A bad fields list is refused, naming what is wrong."""
    with pytest.raises(BadRequest, match=error):
        parse_fields(fields)


async def test_ws_lean_frames_backlog_and_live_and_no_verify_with_them(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """Backlog and live frames carry only the fields; verify cannot join them."""
    await publish_at_once(node, "lw.a", 2)
    raw = await session(http, node)
    await raw.send(
        {"type": "subscribe", "topics": ["lw.*"], "since": {"seq": 0}, "fields": ["data", "topic"]}
    )
    backlog = await raw.messages(2)
    await publish(node, "lw.a", 1, start=2)
    live = await raw.messages(1)
    await raw.send({"type": "subscribe", "topics": ["lw.b"], "verify": True})
    refused = await raw.next("error")
    await raw.send({"type": "subscribe", "topics": ["lw.c"], "fields": ["id"]})
    again = await raw.next("error")
    await raw.ws.close()
    assert (
        [{"topic": "lw.a", "data": {"i": i}} for i in range(3)],
        ["bad_request", "bad_request"],
    ) == ([f["data"] for f in backlog + live], [refused["data"]["code"], again["data"]["code"]])


async def test_the_client_asks_for_lean_frames(node: Node) -> None:
    """Client.subscribe(fields=...) yields deliveries of those fields, none lost to dedupe."""
    await publish(node, "lc.a", 3)
    async with (
        Client(node.url, keys=node.keys) as client,
        client.subscribe("lc.a", since={"seq": 0}, fields=["data"]) as sub,
    ):
        got: list[dict[str, Any]] = []

        async def read() -> None:
            async for item in sub:
                got.append(item.envelope)  # type: ignore[union-attr]

        task = asyncio.get_running_loop().create_task(read())
        await wait_until(lambda: len(got) == 3, what="three messages")
        task.cancel()
    assert [{"data": {"i": i}} for i in range(3)] == got


async def test_sse_and_long_poll_take_fields(node: Node, client: Client) -> None:
    """?fields= gives lean envelopes over SSE and long-poll; with verify=true it is refused."""
    await publish_at_once(node, "ls.a", 2)
    token = token_for(node, "sub:ls.*")
    sse = await RawSse.open(
        node, f"/pubsub/v1/subscribe?topics=ls.a&since_seq=0&token={token}&fields=data,type"
    )
    streamed = [e["data"] for e in await sse.messages(2)]
    sse.close()
    poll = await client.request_json(
        "GET",
        "/pubsub/v1/subscribe",
        query={"topics": "ls.a", "since_seq": 0, "timeout_s": 0, "fields": "data"},
    )
    with pytest.raises(BadRequest, match="exclude each other"):
        await client.request_json(
            "GET",
            "/pubsub/v1/subscribe",
            query={"topics": "ls.a", "fields": "data", "verify": "true"},
        )
    assert (
        [{"type": "m", "data": {"i": i}} for i in range(2)],
        [{"data": {"i": i}} for i in range(2)],
    ) == (streamed, [m["data"] for m in poll["messages"]])
