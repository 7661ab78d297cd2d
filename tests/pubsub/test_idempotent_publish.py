"""Idempotent publish over real sockets (hearthnet.pubsub.idempotency): a publish whose
answer was lost, sent again with its idempotency_key over HTTP or WebSocket (JSON and
CBOR), is one message in history with one seq; concurrent publishes with one key make
one message; a bad key is refused naming the rule."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from hearthnet.caller import Caller
from hearthnet.client import Client
from hearthnet.community import Level
from hearthnet.errors import BadRequest
from hearthnet.identity import load_or_create_keys
from hearthnet.node import Node
from hearthnet.pubsub.service import publish_once
from tests.conftest import MakeConfig
from tests.helpers import free_port, token_for, wait_until
from tests.pubsub.test_ws import auth_frame
from tests.pubsub.test_ws_lean import RawWs, addr


async def history(client: Client, topic: str) -> list[dict[str, Any]]:
    """Every message of ``topic`` (seq and data)."""
    page = await client.history(topic, since_seq=0, limit=100)
    return [{"seq": f["seq"], "data": f["data"]["data"]} for f in page["messages"]]


async def test_an_http_publish_whose_answer_was_lost_is_answered_again_not_published(
    make_config: MakeConfig,
) -> None:
    """The client's connection drops right after its request (the node commits the
    publish, its answer goes nowhere); the same publish sent again with the same key gets
    the first's id and seq with duplicate true, and history holds one message. A
    publish without a key sent twice is two messages (what the key prevents)."""
    async with Node(make_config(pubsub={"sync": "normal"})) as node:
        client = Client(node.url, keys=node.keys)
        path = "/pubsub/v1/topics/idem.h/messages"
        body = {"type": "m", "data": {"n": 1}, "idempotency_key": "order-1"}
        headers = await client.signed_headers("POST", path, body)
        raw = orjson.dumps(body)
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        request = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(raw)}\r\n{head}\r\n"
        ).encode() + raw
        _, writer = await asyncio.open_connection(*addr(node))
        writer.write(request)
        await writer.drain()
        writer.close()  # gone before the answer
        await wait_until(lambda: node.message_log.head_seq >= 1, what="the first commit")
        again = await client.publish("idem.h", "m", {"n": 1}, idempotency_key="order-1")
        third = await client.publish("idem.h", "m", {"n": 1}, idempotency_key="order-1")
        other = await client.publish("idem.h", "m", {"n": 2}, idempotency_key="order-2")
        plain = [await client.publish("idem.h", "m", {"n": 3}) for _ in range(2)]
        messages = await history(client, "idem.h")
        await client.close()
    assert again["duplicate"] is True
    assert again == third
    assert "duplicate" not in other
    assert "duplicate" not in plain[0]
    assert [
        {"seq": again["seq"], "data": {"n": 1}},
        {"seq": other["seq"], "data": {"n": 2}},
        {"seq": plain[0]["seq"], "data": {"n": 3}},
        {"seq": plain[1]["seq"], "data": {"n": 3}},
    ] == messages


async def test_concurrent_http_publishes_with_one_key_make_one_message(
    make_config: MakeConfig,
) -> None:
    """Eight publishes with one key sent at once, on their own connections: one message,
    every answer its id and seq, seven of them marked duplicate."""
    async with Node(make_config(pubsub={"sync": "normal"})) as node:
        clients = [Client(node.url, keys=node.keys) for _ in range(8)]
        answers = await asyncio.gather(
            *(c.publish("idem.c", "m", "once", idempotency_key="k") for c in clients)
        )
        messages = await history(clients[0], "idem.c")
        for c in clients:
            await c.close()
    assert 1 == len(messages)
    assert {(messages[0]["seq"],)} == {(a["seq"],) for a in answers}
    assert 1 == len({a["id"] for a in answers})
    assert 7 == sum(1 for a in answers if a.get("duplicate"))


async def test_token_clients_are_keyed_by_issuer_and_sub(make_config: MakeConfig) -> None:
    """A fresh token of the same client (same sub) sends the same key: a duplicate. Another
    client (another sub) with the same key publishes its own message."""
    async with Node(make_config(pubsub={"sync": "normal"})) as node:
        tokens = [token_for(node, "pub:idem.*", "sub:idem.*", sub=s) for s in ("a", "a", "b")]
        answers = []
        for token in tokens:
            async with Client(node.url, token=token) as c:
                answers.append(await c.publish("idem.t", "m", 1, idempotency_key="same"))
        async with Client(node.url, keys=node.keys) as c:
            messages = await history(c, "idem.t")
    assert [None, True, None] == [a.get("duplicate") for a in answers]
    assert answers[0]["seq"] == answers[1]["seq"] != answers[2]["seq"]
    assert 2 == len(messages)


async def test_client_retries_send_a_key_of_their_own(make_config: MakeConfig) -> None:
    """Client.publish with retries: its first attempts find no node listening yet (no
    answer), a later one is published, under a key the client made (the node remembers
    one key); a publish without retries sends none."""
    config = make_config(pubsub={"sync": "normal"}, node={"port": free_port()})
    client = Client(
        f"http://127.0.0.1:{config.node.port}", keys=load_or_create_keys(config.data_path)
    )
    publishing = asyncio.get_running_loop().create_task(
        client.publish("idem.r", "m", "x", retries=8)
    )
    await asyncio.sleep(0.3)
    assert not publishing.done()
    async with Node(config) as node:
        answer = await publishing
        plain = await client.publish("idem.r", "m", "y")
        messages = await history(client, "idem.r")
        remembered = len(node.pubsub.keys)
    await client.close()
    assert "duplicate" not in answer
    assert 1 == remembered
    assert [{"seq": answer["seq"], "data": "x"}, {"seq": plain["seq"], "data": "y"}] == messages


async def test_a_bad_key_is_refused_naming_the_rule(make_config: MakeConfig) -> None:
    async with Node(make_config()) as node, Client(node.url, keys=node.keys) as c:
        for key in ("", "k" * 65, "caf\u00e9"):
            with pytest.raises(BadRequest, match=r"1\.\.64 printable ASCII"):
                await c.publish("idem.b", "m", 1, idempotency_key=key)
        with pytest.raises(BadRequest, match=r"1\.\.64 printable ASCII"):
            await c.request_json(
                "POST",
                "/pubsub/v1/topics/idem.b/messages",
                {"type": "m", "data": 1, "idempotency_key": 5},
            )
        with pytest.raises(BadRequest, match="did you mean idempotency_key"):
            await c.request_json(
                "POST", "/pubsub/v1/topics/idem.b/messages", {"type": "m", "data": 1, "key": "k"}
            )
        assert 0 == node.message_log.head_seq


@pytest.mark.parametrize("cbor", [False, True], ids=["json", "cbor"])
async def test_a_websocket_publish_sent_again_on_a_new_session_is_answered_not_published(
    make_config: MakeConfig, cbor: bool
) -> None:
    """A session sends a keyed publish and closes before its answer; a new session (the
    client's reconnect) sends it again: published.ok with the first's id and seq and
    duplicate true, and one message in history; the same key over HTTP too."""
    async with Node(make_config(pubsub={"sync": "normal"})) as node:
        raw = await RawWs.open(*addr(node))
        raw.send_json(auth_frame(node.keys, node.keys.node_id))
        await raw.event("auth.ok")
        frame = {"type": "publish", "topic": "idem.w", "msg_type": "m", "data": b"\x00\x01"}
        raw.send_json(
            {**frame, "data": "AAE", "data_enc": "base64url", "idempotency_key": "w1", "ref": "a"}
        )
        await raw.end()
        await wait_until(lambda: node.message_log.head_seq >= 1, what="the first commit")
        async with Client(node.url, keys=node.keys) as c:
            async with c.publisher(cbor=cbor) as pub:
                again = await pub.publish("idem.w", "m", b"\x00\x01", idempotency_key="w1")
                new = await pub.publish("idem.w", "m", b"\x02", idempotency_key="w2")
                newer = await pub.publish("idem.w", "m", b"\x02", idempotency_key="w2")
            over_http = await c.publish("idem.w", "m", b"\x00\x01", idempotency_key="w1")
            page = await c.history("idem.w", since_seq=0, limit=100)
    seqs = [f["seq"] for f in page["messages"]]
    assert (True, True, True, None) == (
        again.get("duplicate"),
        newer.get("duplicate"),
        over_http.get("duplicate"),
        new.get("duplicate"),
    )
    assert [again["seq"], new["seq"]] == seqs
    assert (again["id"], again["seq"]) == (over_http["id"], over_http["seq"])
    assert (new["id"], new["seq"]) == (newer["id"], newer["seq"])
    assert newer["ref"] != new["ref"]  # each answer carries its own frame's ref


@pytest.mark.parametrize("cbor", [False, True], ids=["json", "cbor"])
async def test_concurrent_websocket_publishes_with_one_key_make_one_message(
    make_config: MakeConfig, cbor: bool
) -> None:
    """Publishes with one key in flight at once, from one session (one group) and from
    a second session: one message, each answered with its own ref and the same seq."""
    async with (
        Node(make_config(pubsub={"sync": "normal"})) as node,
        Client(node.url, keys=node.keys) as c,
    ):
        async with c.publisher(cbor=cbor) as one, c.publisher(cbor=cbor) as two:
            answers = await asyncio.gather(
                *(one.publish("idem.wc", "m", i, idempotency_key="k") for i in range(4)),
                *(two.publish("idem.wc", "m", i, idempotency_key="k") for i in range(4)),
            )
        messages = await history(c, "idem.wc")
    assert 1 == len(messages)
    assert {messages[0]["seq"]} == {a["seq"] for a in answers}
    assert 7 == sum(1 for a in answers if a.get("duplicate"))
    assert 4 == len({a["ref"] for a in answers[:4]})


async def test_a_bad_key_on_a_websocket_publish_is_an_error_with_its_ref(
    make_config: MakeConfig,
) -> None:
    async with Node(make_config()) as node:
        raw = await RawWs.open(*addr(node))
        raw.send_json(auth_frame(node.keys, node.keys.node_id))
        await raw.event("auth.ok")
        frame = {"type": "publish", "topic": "idem.x", "msg_type": "m", "data": 1, "ref": "r9"}
        raw.send_json({**frame, "idempotency_key": "x" * 65})
        error = await raw.event("error")
        await raw.end()
    assert ("bad_request", "r9") == (error["data"]["code"], error["data"]["ref"])
    assert "1..64 printable ASCII" in error["data"]["message"]


async def test_a_duplicate_in_flight_waits_and_a_cancelled_first_still_leaves_its_answer(
    make_config: MakeConfig,
) -> None:
    """The node's publish path with a key (real log): a second publish started in the
    same loop turn as the first, before any commit, waits for it and gets its seq,
    marked duplicate; a first whose caller is cancelled once it is queued (an HTTP
    handler whose client went away) is still committed, and the retry gets its answer."""
    async with Node(make_config(pubsub={"sync": "normal"})) as node:
        me = Caller(node.keys.node_id, "node", Level.ANCHOR, None, True)
        first, second = await asyncio.gather(
            publish_once(node.pubsub, me, "idem.f", "m", 1, ttl_s=None, key="a"),
            publish_once(node.pubsub, me, "idem.f", "m", 1, ttl_s=None, key="a"),
        )
        gone = asyncio.get_running_loop().create_task(
            publish_once(node.pubsub, me, "idem.f", "m", 2, ttl_s=None, key="b")
        )
        await asyncio.sleep(0)  # queued on the log, not committed yet
        assert 1 == node.pubsub.keys.in_flight
        gone.cancel()
        await wait_until(lambda: node.message_log.head_seq >= 2, what="the second commit")
        retry = await publish_once(node.pubsub, me, "idem.f", "m", 2, ttl_s=None, key="b")
        page, _ = await node.message_log.reader.history(
            "idem.f", since_seq=0, since_ts=None, before_seq=None, limit=10
        )
    assert (False, True, True) == (first.duplicate, second.duplicate, retry.duplicate)
    assert (first.id, first.seq) == (second.id, second.seq)
    assert [first.seq, retry.seq] == [row.seq for row in page]
