"""Message frames carry ``sig`` only for subscribers that ask to verify (spec §6.2), over
WebSocket, SSE and long-poll; each variant is encoded once per message."""

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
from hearthnet.pubsub.batchsig import BatchVerifier
from hearthnet.pubsub.envelope import Message, StoredMessage, canonical_body
from hearthnet.pubsub.wire import NOSIG, EncodedMessage, TopicBatch, unsigned_envelope
from tests.helpers import publish, publish_at_once, token_for, wait_until
from tests.pubsub.test_http import RawSse
from tests.pubsub.test_ws import session


def _batch(n: int) -> list[Message]:
    keys = KeyPair.generate()
    bodies = [
        Message.unsigned(
            keys.node_id, topic="v.t", msg_type="m", data={"i": i}, origin_seq=1 + i, ts=5
        )
        for i in range(n)
    ]
    return Message.signed_batch(keys, bodies, [canonical_body(b) for b in bodies])


def _without_sig(message: Message) -> dict[str, Any]:
    return {k: v for k, v in message.body().items() if k != "sig"}


def _payload(frame: bytes) -> bytes:
    """The payload of one unmasked WebSocket frame."""
    size = frame[1] & 0x7F
    return frame[{126: 4, 127: 10}.get(size, 2) :]


def test_unsigned_forms_are_the_signed_frames_without_sig() -> None:
    """Every unsigned form decodes to the signed frame minus the envelope's sig."""
    message = _batch(3)[1]
    item = EncodedMessage(StoredMessage(7, message))
    want = {"event": "message", "data": _without_sig(message), "seq": 7}
    sse = item.form("sse" + NOSIG).decode().split("\n")
    assert (want, want, want, ["event: message", "id: 7"], want["data"]) == (
        orjson.loads(item.form("json" + NOSIG)),
        orjson.loads(_payload(item.form("ws_text" + NOSIG))),
        cbor2.loads(_payload(item.form("ws_cbor" + NOSIG))),
        [sse[0], sse[2]],
        orjson.loads(sse[1].removeprefix("data: ")),
    )


def test_envelopes_read_back_or_from_peers_lose_exactly_their_sig() -> None:
    """Read back from the log (sig last), or from a peer with sig first and a "sig" key
    last inside data, an envelope loses exactly its top-level sig."""
    keys = KeyPair.generate()
    message = Message.create(
        keys, topic="v.t", msg_type="m", data={"a": 1, "sig": "x"}, origin_seq=1, ts=5
    )
    read_back = Message.trusted(orjson.loads(message.raw), message.raw)
    body = message.body()
    reordered = {"sig": body.pop("sig"), **body}
    parsed = Message.parse(reordered, raw=orjson.dumps(reordered))
    want = _without_sig(message)
    assert [want] * 3 == [orjson.loads(unsigned_envelope(m)) for m in (message, read_back, parsed)]


def test_a_websocket_frame_without_sig_is_the_same_however_its_envelope_was_stored() -> None:
    """The WebSocket text frame without sig is one frame of the envelope minus sig, for an
    envelope signed here and for one from a peer with sig first (encoded again)."""
    keys = KeyPair.generate()
    message = Message.create(keys, topic="v.t", msg_type="m", data={"a": 1}, origin_seq=1, ts=5)
    body = message.body()
    reordered = {"sig": body.pop("sig"), **body}
    parsed = Message.parse(reordered, raw=orjson.dumps(reordered))
    want = {"event": "message", "data": _without_sig(message), "seq": 3}
    frames = [
        EncodedMessage(StoredMessage(3, m)).form("ws_text" + NOSIG) for m in (message, parsed)
    ]
    assert ([0x81, 0x81], [want, want]) == (
        [f[0] for f in frames],
        [orjson.loads(_payload(f)) for f in frames],
    )


def test_a_batch_encodes_each_variant_once_for_all_subscribers() -> None:
    """Asking a form again gives the very same bytes objects (no per-subscriber work)."""
    group = TopicBatch(
        "v.t", [EncodedMessage(StoredMessage(i, m)) for i, m in enumerate(_batch(4))]
    )
    first = [group.form("ws_text")[1], group.form("ws_text" + NOSIG)[1]]
    again = [group.form("ws_text")[1], group.form("ws_text" + NOSIG)[1]]
    assert ([True, True], True) == (
        [a is b for a, b in zip(first, again, strict=True)],
        all(b"sig" not in f for f in first[1]) and all(b'"sig"' in f for f in first[0]),
    )


async def test_ws_frames_have_sig_only_after_a_subscribe_asks_to_verify(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """Default subscribers get no sig; verify: true turns it on for the session."""
    await publish_at_once(node, "vw.a", 3)
    raw = await session(http, node)
    await raw.send({"type": "subscribe", "topics": ["vw.a"], "since": {"seq": 0}})
    plain = await raw.messages(3)
    await raw.send({"type": "subscribe", "topics": ["vw.b"], "verify": True})
    await raw.next("subscribed")
    await publish(node, "vw.a", 1, start=3)
    signed = (await raw.messages(1))[0]
    await raw.send({"type": "subscribe", "topics": ["vw.c"], "verify": "yes"})
    error = await raw.next("error")
    await raw.ws.close()
    assert ([False] * 3, 3, "bad_request") == (
        ["sig" in f["data"] for f in plain],
        Message.parse(signed["data"]).data["i"],
        error["data"]["code"],
    )


async def test_sse_and_long_poll_take_verify(node: Node, client: Client) -> None:
    """?verify=true adds sig over SSE and long-poll; the default leaves it out."""
    await publish_at_once(node, "vs.a", 2)
    got: list[bool] = []
    token = token_for(node, "sub:vs.*")
    for query in ("", "&verify=true"):
        sse = await RawSse.open(
            node, f"/pubsub/v1/subscribe?topics=vs.a&since_seq=0&token={token}{query}"
        )
        got += ["sig" in e["data"] for e in await sse.messages(2)]
        sse.close()
        poll = await client.request_json(
            "GET",
            "/pubsub/v1/subscribe",
            query={"topics": "vs.a", "since_seq": 0, "timeout_s": 0, "verify": query[8:] or None},
        )
        got += ["sig" in m["data"] for m in poll["messages"]]
    with pytest.raises(BadRequest, match="verify is true or false"):
        await client.request_json(
            "GET", "/pubsub/v1/subscribe", query={"topics": "vs.a", "verify": "maybe"}
        )
    assert [False] * 4 + [True] * 4 == got


async def test_the_client_asks_for_sig_only_with_verify(node: Node) -> None:
    """Client.subscribe(verify=True) gets signed envelopes; the default does not."""
    await publish(node, "vc.a", 2)
    seen: dict[bool, list[bool]] = {}
    async with Client(node.url, keys=node.keys) as client:
        for verify in (False, True):
            async with client.subscribe("vc.a", since={"seq": 0}, verify=verify) as sub:
                marks: list[bool] = []

                async def read(into: list[bool] = marks, s: Any = sub) -> None:
                    async for item in s:
                        into.append("sig" in item.envelope)

                task = asyncio.get_running_loop().create_task(read())
                await wait_until(lambda m=marks: len(m) == 2, what="two messages")  # type: ignore[misc]
                task.cancel()
                seen[verify] = marks
    assert {False: [False, False], True: [True, True]} == seen


def test_the_verifier_counts_batch_signatures_paths_and_singles() -> None:
    """Two batches read twice cost two ed25519 checks; each path and single is counted."""
    verifier = BatchVerifier()
    keys = KeyPair.generate()
    envelopes = [orjson.loads(m.raw) for m in _batch(3) + _batch(2)]
    single = orjson.loads(
        Message.create(keys, topic="a", msg_type="m", data=1, origin_seq=1, ts=1).raw
    )
    for _ in range(2):
        for envelope in envelopes:
            Message.parse(envelope, verifier=verifier)
    Message.parse(single, verifier=verifier)
    assert {"batch_signatures": 2, "batch_messages": 10, "single_signatures": 1} == (
        verifier.counts()
    )


async def test_signature_checks_show_in_statistics_and_metrics(
    node: Node, client: Client, http: aiohttp.ClientSession
) -> None:
    """A verified history read moves the process's counts, seen in /status and /metrics."""
    kinds = ("batch_messages", "single_signatures")
    before = node.statistics().signatures
    await publish_at_once(node, "vm.a", 4)
    await client.history("vm.a", since_seq=0, verify=True)
    after = node.statistics().to_json()["signatures"]
    async with http.get(node.url + "/metrics") as response:
        text = await response.text()
    assert (4, [True, True]) == (
        sum(after[k] - before[k] for k in kinds),
        [f'hearthnet_pubsub_signature_checks{{kind="{k}"}} {after[k]}' in text for k in kinds],
    )
