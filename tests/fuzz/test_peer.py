"""Fuzzing the peer link of a live node from a member's key (spec §7.2–7.4, §1.5).

The fuzzer links to the node as its member, with the real signed handshake, then sends
batches of CBOR link frames of every kind: gossip of forged and foreign messages,
anti-entropy with absurd spans, remote calls with broken envelopes, stream frames for
unknown streams, membership records from strangers, presence, junk. After each batch it
pings and waits for the pong; whatever the node sends must be well formed, a ``bye``
must carry a known code, and the invariants of :mod:`tests.fuzz.live` must hold.
"""

from __future__ import annotations

import asyncio
import functools
from typing import Any

import aiohttp
import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hearthnet.clock import now_ms
from hearthnet.identity import KeyPair
from hearthnet.ids import new_ulid
from hearthnet.mesh.heartbeat import pong_for
from hearthnet.mesh.links import run_handshake
from hearthnet.mesh.protocol import MAX_FRAME_BYTES, SUBPROTOCOL, Handshake
from hearthnet.pubsub.envelope import Message
from tests.fuzz.budget import budget
from tests.fuzz.live import LiveNode
from tests.fuzz.oracle import HTTP_STATUS, check_close, error_code
from tests.fuzz.strategies import (
    cbor_bytes,
    cbor_values,
    edge_ints,
    good_topics,
    json_text,
    json_values,
    odd_text,
    representable,
)

# Failing batches carry message bytes; their repr is long but it is the reproducer.
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

PONG_DEADLINE_S = 5.0
# A refused handshake ends at once; a node may wait this long for a missing hello.
HANDSHAKE_S = 12.0
# Codes a bye may carry besides spec §2.4's: a full node refers the dialer elsewhere.
BYE_CODES = set(HTTP_STATUS) - {"internal_error"} | {"full"}


class Link:
    """The fuzzer's end of one peer link."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.ping_seq = 0

    async def send(self, data: bytes) -> None:
        """Send one binary frame, unless the node already closed the link."""
        if not self.ws.closed:
            try:
                await self.ws.send_bytes(data)
            except (ConnectionResetError, aiohttp.ClientConnectionError):
                return

    async def round_trip(self, where: str) -> list[dict[str, Any]]:
        """Ping, then read until the pong (answering the node's pings) or the close;
        every frame is checked. Returns the frames read."""
        self.ping_seq += 1
        seq = 1_000_000 + self.ping_seq
        await self.send(cbor2.dumps({"t": "ping", "seq": seq, "ts": now_ms()}))
        got: list[dict[str, Any]] = []
        async with asyncio.timeout(PONG_DEADLINE_S):
            while True:
                msg = await self.ws.receive()
                if msg.type == aiohttp.WSMsgType.BINARY:
                    frame = cbor2.loads(msg.data)
                    assert isinstance(frame, dict), frame
                    assert isinstance(frame.get("t"), str), frame
                    got.append(frame)
                    check_frame(frame, where)
                    if frame["t"] == "ping":
                        await self.send(cbor2.dumps({"t": "pong", **pong_for(frame, now_ms())}))
                    elif frame["t"] == "pong" and frame.get("seq") == seq:
                        return got
                elif msg.type == aiohttp.WSMsgType.CLOSE:
                    check_close(int(msg.data), where)
                    return got
                else:
                    check_close(self.ws.close_code, where)
                    return got


def check_frame(frame: dict[str, Any], where: str) -> None:
    """A frame from the node: a bye names a known code; a stream error frame is §2.4."""
    if frame["t"] == "bye":
        assert frame.get("code") in BYE_CODES, f"{where}: bye {frame}"
    if frame["t"] == "frame" and isinstance(frame.get("f"), dict):
        inner = frame["f"]
        if inner.get("event") == "error":
            error_code(inner.get("data"), where)


async def open_link(live: LiveNode) -> Link:
    """Dial the node's peer endpoint as the fuzzer's member and do the handshake."""
    membership = live.view()
    ws = await live.session.ws_connect(
        live.url + "/mesh/v1/peer", protocols=(SUBPROTOCOL,), max_msg_size=MAX_FRAME_BYTES
    )
    handshake = Handshake(live.member, membership, True, now_ms(), name="fuzz")
    await run_handshake(ws, handshake, now_ms)
    return Link(ws)


def message_raw(origin: KeyPair, topic: str, data: Any, **extra: Any) -> bytes:
    """A gossip message originated (and signed, where JCS can) by ``origin``."""
    body = Message.unsigned(
        origin.node_id, topic=topic, msg_type="m", data=data, origin_seq=1, ts=now_ms()
    )
    body.update(extra)
    body["sig"] = origin.sign_object(body) if representable(body) else "ed25519:" + "A" * 86
    try:
        return json_text(body)
    except TypeError:
        return cbor_bytes(body)


@functools.cache
def frame_strategy(
    live: LiveNode, generation: int
) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    """(who may have made it, frame): link frames of every kind, structured and not. Made
    once per node ``generation`` (a node restarted after a crash has other keys), not per
    input: building the strategy costs more than running an input."""
    # Foreign origins have their own test below; here the member gossips its own messages,
    # so a failure of that test does not hide what this one would find.
    origins = st.just("member")
    key_of = {"member": live.member, "stranger": live.stranger}
    node_ids = st.sampled_from([live.member.node_id, live.stranger.node_id, live.anchor.node_id])
    anything = st.one_of(cbor_values(), json_values())
    msg = st.builds(
        lambda who, topic, data, extra, h: (
            who,
            {"t": "msg", "raw": message_raw(key_of[who], topic, data, **extra), "h": h},
            topic,
        ),
        origins,
        good_topics,
        json_values(),
        st.dictionaries(
            st.sampled_from(["origin_seq", "ts", "ttl_s", "sender", "zzz"]),
            st.one_of(edge_ints, json_values()),
            max_size=1,
        ),
        st.one_of(st.integers(-1, 70), anything),
    ).map(lambda t: (t[0] + ":" + t[2], t[1]))
    raw_msg = st.builds(
        lambda raw, h: ("junk", {"t": "msg", "raw": raw, "h": h}),
        st.one_of(st.binary(max_size=64), json_values().map(json_text)),
        st.one_of(st.integers(-1, 70), anything),
    )
    counts = st.dictionaries(st.one_of(node_ids, odd_text), st.one_of(edge_ints, anything))
    spans = st.dictionaries(
        st.one_of(node_ids, odd_text),
        st.one_of(st.lists(st.one_of(edge_ints, st.integers(-5, 5)), max_size=3), anything),
    )
    call_envelope = st.builds(
        lambda body, cap: live.call_envelope(live.member, body, cap=cap),
        json_values(),
        st.sampled_from(["echo", "echo.stream", "mesh.peers", "nothing"]),
    )
    call = st.builds(
        lambda sid, envelope, sign, extra: (
            "member",
            {
                "t": "call",
                "sid": sid,
                "envelope": envelope,
                "signature": live.member.sign_object(envelope)
                if sign and representable(envelope)
                else "ed25519:AAAA",
                **extra,
            },
        ),
        st.one_of(odd_text, anything),
        call_envelope,
        st.booleans(),
        st.dictionaries(
            st.sampled_from(["to", "deadline_ms", "inline", "token"]),
            st.one_of(node_ids, edge_ints, anything),
            max_size=2,
        ),
    )
    stream = st.builds(
        lambda kind, fields: ("member", {"t": kind, **fields}),
        st.sampled_from(["frame", "ack", "tool_result", "cancel", "route", "presence"]),
        st.dictionaries(
            st.sampled_from(["sid", "f", "upto", "tool_call_id", "body", "id", "node", "events"]),
            st.one_of(odd_text, edge_ints, anything),
            max_size=4,
        ),
    )
    other = st.builds(
        lambda kind, fields: ("member", {"t": kind, **fields}),
        st.sampled_from(["ihave", "iwant", "caps", "peers", "pong", "hello", "bye", "nope"]),
        st.fixed_dictionaries(
            {},
            optional={
                "heads": counts,
                "floors": counts,
                "want": spans,
                "providers": anything,
                "peers": st.lists(st.one_of(odd_text, anything), max_size=3),
                "seq": edge_ints,
                "code": odd_text,
            },
        ),
    )
    return st.one_of(msg, msg, raw_msg, call, stream, other, anything.map(lambda v: ("junk", v)))


async def exchange(live: LiveNode, frames: list[Any], where: str) -> list[dict[str, Any]]:
    """Send ``frames`` on the module's link (dialled again if the node closed it)."""
    link: Link | None = getattr(live, "peer_link", None)
    if link is None or link.ws.closed:
        link = await open_link(live)
        live.peer_link = link  # type: ignore[attr-defined]
    for frame in frames:
        await link.send(frame if isinstance(frame, bytes) else cbor_bytes(frame))
    return await link.round_trip(where)


@budget(300)
@given(data=st.data())
def test_link_frames(live: LiveNode, data: st.DataObject) -> None:
    """Batches of link frames from a member: answered, or the link closed, cleanly."""
    live.ensure_running()
    batch = data.draw(
        st.lists(frame_strategy(live, live.generation), min_size=1, max_size=6), label="frames"
    )
    for who, _ in batch:
        if who.startswith("member:"):  # the member's own messages are its right to gossip
            live.allowed_topics.add(who.split(":", 1)[1])
    live.run(exchange(live, [frame for _, frame in batch], "peer link"))
    live.check("peer link", len(batch))


@budget(30)
@given(topic=st.one_of(good_topics, good_topics.map("mesh.{}".format)), data=json_values())
def test_gossip_from_a_stranger_origin(live: LiveNode, topic: str, data: Any) -> None:
    """A message originated by a non-member, relayed by a member, is not stored (nor in
    the nodes' own mesh.** topics)."""
    live.ensure_running()
    frame = {"t": "msg", "raw": message_raw(live.stranger, topic, data), "h": 1}
    live.run(exchange(live, [frame], "peer stranger gossip"))
    live.check("peer stranger gossip")


@budget(30)
@given(
    kind=st.sampled_from(
        ["member.added", "member.level_changed", "member.revoked", "token.revoked"]
    ),
    level=st.sampled_from(["member", "trusted", "anchor"]),
    subject=st.sampled_from(["stranger", "member", "anchor"]),
    signer_seq=st.sampled_from([None, 1, 2]),
)
def test_membership_frames_from_strangers(
    live: LiveNode, kind: str, level: str, subject: str, signer_seq: int | None
) -> None:
    """Validly signed records by a stranger (chained or not), flooded over a member's
    link, are not stored."""
    live.ensure_running()
    subjects = {"stranger": live.stranger, "member": live.member, "anchor": live.anchor}
    record = {
        "id": new_ulid(),
        "kind": kind,
        "community": live.community,
        "subject": subjects[subject].node_id,
        "by": live.stranger.node_id,
        "ts": now_ms(),
        "level": level,
    }
    if kind == "token.revoked":
        record.pop("level")
        record["iss"] = live.member.node_id
    if signer_seq is not None:  # spec §1.5 chains; a legacy record is refused over a link
        record["signer_seq"] = signer_seq
    record["sig"] = live.stranger.sign_object(record)
    live.run(exchange(live, [{"t": "membership", "records": [record]}], "peer membership"))
    live.check("peer membership")


def hello(live: LiveNode, who: str, changes: dict[str, Any]) -> bytes:
    """A first hello from ``who``, validly signed over its fields after ``changes``
    (where JCS can sign them)."""
    keys = {"member": live.member, "stranger": live.stranger, "anchor": live.anchor}[who]
    body: dict[str, Any] = {
        "node": keys.node_id,
        "community": live.community,
        "ts": now_ms(),
        "nonce": new_ulid(),
        "name": "fuzz",
        "version": "",
        **changes,
    }
    body.pop("sig", None)
    body["sig"] = keys.sign_object(body) if representable(body) else "ed25519:AAAA"
    return cbor_bytes({"t": "hello", **body})


@budget(60)
@given(
    who=st.sampled_from(["member", "stranger", "anchor"]),
    changes=st.dictionaries(
        st.sampled_from(
            ["node", "community", "ts", "nonce", "their_nonce", "url", "full", "name", "zzz"]
        ),
        st.one_of(odd_text, edge_ints, cbor_values()),
        max_size=3,
    ),
    second=st.one_of(cbor_values(), st.just({"t": "hello"}), st.just({"t": "msg", "raw": b""})),
)
def test_handshakes(live: LiveNode, who: str, changes: dict[str, Any], second: Any) -> None:
    """Hostile hellos (a stranger, the node's own key, wrong fields, a broken second
    frame) end in a bye with a known code or a close; no link is made."""
    live.ensure_running()

    async def dial() -> list[dict[str, Any]]:
        ws = await live.session.ws_connect(
            live.url + "/mesh/v1/peer", protocols=(SUBPROTOCOL,), max_msg_size=MAX_FRAME_BYTES
        )
        link = Link(ws)
        try:
            await link.send(hello(live, who, changes))
            await link.send(cbor_bytes(second))
            got: list[dict[str, Any]] = []
            async with asyncio.timeout(HANDSHAKE_S):
                while (msg := await ws.receive()).type == aiohttp.WSMsgType.BINARY:
                    frame = cbor2.loads(msg.data)
                    got.append(frame)
                    check_frame(frame, "peer handshake")
            if msg.type == aiohttp.WSMsgType.CLOSE:
                check_close(int(msg.data), "peer handshake")
            return got
        finally:
            await ws.close()

    got = live.run(dial())
    live.check("peer handshake")
    assert not got or "bye" == got[-1]["t"], got
    path = "/mesh/v1/peers"
    _, peers = live.run(
        live.request("GET", path, headers=live.signed_headers(live.anchor, "GET", path, None))
    )
    linked = {p["node"] for p in peers["peers"] if p["linked"]}
    assert live.stranger.node_id not in linked, peers
