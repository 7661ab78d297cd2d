"""WebSocket publishes answered per read (spec §6.4): many publishes in one write are
answered in order."""

from __future__ import annotations

import json

from hearthnet.clock import now_ms
from hearthnet.node import Node
from hearthnet.pubsub.envelope import Message, StoredMessage, canonical_body
from hearthnet.pubsub.wire import control_frame
from hearthnet.pubsub.ws_publish import _ok, published_ok_text
from tests.conftest import MakeConfig
from tests.pubsub.test_log import KEYS
from tests.pubsub.test_ws import auth_frame
from tests.pubsub.test_ws_lean import RawWs, addr, subscribed


def test_published_ok_is_written_as_control_frame_encodes_it() -> None:
    """The published.ok frame made from its parts is byte for byte the one made from its
    dict, for a message signed here (fields) and one held as a Message, with no ref, a
    plain one, one needing escapes, and one long enough for a two-byte frame length."""
    ts = now_ms()
    bodies = [
        Message.unsigned(KEYS.node_id, topic="w.a", msg_type="m", data=i, origin_seq=i, ts=ts)
        for i in (7, 8)
    ]
    leaves = [canonical_body(body) for body in bodies]
    batch = Message.signed_batch(KEYS, bodies, leaves)[0].batch
    assert batch is not None
    answered = [
        StoredMessage.of_batch(41, bodies[0], leaves[0], batch),
        StoredMessage(42, Message.signed(KEYS, bodies[1])),
    ]
    refs = [None, "p1", 'q"\\\u00e9\n\U0001f525', "r" * 128]
    cases = [(ref, stored) for ref in refs for stored in answered]
    assert [control_frame("ws_text", "published.ok", _ok(r, s)) for r, s in cases] == [
        published_ok_text(r, s) for r, s in cases
    ]


async def test_publishes_in_one_write_are_answered_in_order(make_config: MakeConfig) -> None:
    """40 publishes in one TCP write, one of them over the size limit: the refused one
    gets its error at once, the others a published.ok each, in order, seqs rising."""
    config = make_config(pubsub={"sync": "normal", "max_payload_bytes": 100})
    async with Node(config) as node:
        raw = await RawWs.open(*addr(node))
        raw.send_json(auth_frame(node.keys, node.keys.node_id))
        await raw.event("auth.ok")
        for i in range(40):
            data = "x" * (200 if i == 17 else 10)
            ref = f"p{i}"
            raw.send_json(
                {"type": "publish", "topic": "w.p", "msg_type": "m", "data": data, "ref": ref}
            )
        answers = []
        for _ in range(40):
            _, payload = await raw.frame()
            answers.append(json.loads(payload))
        await raw.end()
    errors = [(a["data"]["ref"], a["data"]["code"]) for a in answers if a["event"] == "error"]
    oks = [a["data"] for a in answers if a["event"] == "published.ok"]
    seqs = [ok["seq"] for ok in oks]
    assert (
        [("p17", "payload_too_large")],
        [f"p{i}" for i in range(40) if i != 17],
        sorted(set(seqs)),
    ) == (errors, [ok["ref"] for ok in oks], seqs)


async def test_a_publisher_subscribed_to_its_topic_gets_the_answer_first(
    make_config: MakeConfig,
) -> None:
    """A session publishing to a topic it subscribes to gets published.ok before the
    message: the log answers a commit's publishers before fan-out."""
    config = make_config(pubsub={"sync": "normal"})
    async with Node(config) as node:
        raw = await RawWs.open(*addr(node))
        await subscribed(node.keys, raw, "w.own")
        raw.send_json({"type": "publish", "topic": "w.own", "msg_type": "m", "data": 1, "ref": "r"})
        order: list[str] = []
        while len(order) < 2:
            _, payload = await raw.frame()
            event = json.loads(payload)["event"]
            if event in ("published.ok", "message"):
                order.append(event)
        await raw.end()
    assert ["published.ok", "message"] == order


async def test_a_group_the_log_cannot_queue_is_refused_per_publish(
    make_config: MakeConfig,
) -> None:
    """A session's publishes of one read form one group on the log's queue: past
    max_pending the group is refused whole, each publish with unavailable and its ref, in
    order, and the session's next publish is committed."""
    config = make_config(pubsub={"sync": "normal", "max_pending": 5})
    async with Node(config) as node:
        raw = await RawWs.open(*addr(node))
        raw.send_json(auth_frame(node.keys, node.keys.node_id))
        await raw.event("auth.ok")
        for i in range(8):
            raw.send_json(
                {"type": "publish", "topic": "w.q", "msg_type": "m", "data": i, "ref": f"p{i}"}
            )
        answers = [json.loads((await raw.frame())[1]) for _ in range(8)]
        raw.send_json({"type": "publish", "topic": "w.q", "msg_type": "m", "data": 8, "ref": "p8"})
        after = json.loads((await raw.frame())[1])
        await raw.end()
    assert (
        [(f"p{i}", "unavailable", True) for i in range(8)],
        ("published.ok", "p8", 1),
    ) == (
        [
            (a["data"]["ref"], a["data"]["code"], a["data"].get("retry_after_ms", 0) > 0)
            for a in answers
        ],
        (after["event"], after["data"]["ref"], after["data"]["seq"]),
    )
