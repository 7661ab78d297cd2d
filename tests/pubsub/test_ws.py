"""Pub/sub over WebSocket on real sockets, with raw frames (spec §2.2, §6.4–6.9)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import aiohttp
import pytest

from hearthnet.clock import now_ms
from hearthnet.identity import KeyPair
from hearthnet.ids import short_id
from hearthnet.node import Node
from hearthnet.tokens import CapabilityToken
from tests.conftest import MakeConfig
from tests.helpers import (
    apply_signed_record,
    publish,
    publish_at_once,
    refused_upgrade,
    token_for,
    wait_until,
)

Frame = dict[str, Any]


def auth_frame(keys: KeyPair, node: Node | str, **extra: Any) -> Frame:
    """An identity-proof auth frame for ``node`` (a node or its NodeID)."""
    proof = {
        "identity": keys.node_id,
        "ts": now_ms(),
        "nonce": os.urandom(8).hex(),
        "node": node if isinstance(node, str) else node.keys.node_id,
    }
    return {
        "type": "auth",
        "identity": keys.node_id,
        "ts": proof["ts"],
        "nonce": proof["nonce"],
        "sig": keys.sign_object(proof),
        **extra,
    }


class Raw:
    """A raw pub/sub WebSocket with small helpers."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws

    async def send(self, frame: Frame) -> None:
        """Send one JSON frame."""
        await self.ws.send_json(frame)

    async def next(self, event: str | None = None, within_s: float = 5.0) -> Frame:
        """The next frame (of ``event``, skipping others)."""
        async with asyncio.timeout(within_s):
            while True:
                msg = await self.ws.receive()
                if msg.type != aiohttp.WSMsgType.TEXT:
                    raise AssertionError(f"socket ended: {msg.type} {self.ws.close_code}")
                frame: Frame = msg.json()
                if event is None or frame["event"] == event:
                    return frame

    async def messages(self, count: int) -> list[Frame]:
        """The next ``count`` message frames."""
        return [await self.next("message") for _ in range(count)]

    async def closed(self, within_s: float = 5.0) -> int | None:
        """Wait for the server to close; the code in its close frame."""
        async with asyncio.timeout(within_s):
            while True:
                msg = await self.ws.receive()
                if msg.type == aiohttp.WSMsgType.CLOSE:
                    return int(msg.data)
                if msg.type in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING):
                    return self.ws.close_code


async def session(
    http: aiohttp.ClientSession, node: Node, keys: KeyPair | None = None, **auth: Any
) -> Raw:
    """An authenticated session (as the node itself unless ``keys`` is given)."""
    ws = await http.ws_connect(node.url + "/pubsub/v1/subscribe", protocols=("hearthnet-bus.v2",))
    raw = Raw(ws)
    await raw.send(
        auth_frame(keys or node.keys, node, **auth)
        if "token" not in auth
        else {"type": "auth", **auth}
    )
    assert "auth.ok" == (await raw.next())["event"]
    return raw


def data_of(frames: list[Frame]) -> list[int]:
    """The ``i`` of each message frame."""
    return [f["data"]["data"]["i"] for f in frames]


async def test_pubsub_via_ws_backlog_plus_live(node: Node, http: aiohttp.ClientSession) -> None:
    """subscribed, then the backlog since the cursor, then live messages, in seq order."""
    await publish(node, "chat.a", 5)
    sub = await session(http, node)
    await sub.send(
        {
            "type": "subscribe",
            "topics": ["chat.*"],
            "since": {"epoch": node.message_log.epoch, "seq": 2},
        }
    )
    subscribed = await sub.next()
    backlog = await sub.messages(3)
    await publish(node, "chat.a", 2, start=5)
    live = await sub.messages(2)
    assert ("subscribed", 5, [2, 3, 4], [5, 6], [3, 4, 5, 6, 7]) == (
        subscribed["event"],
        subscribed["data"]["head_seq"],
        data_of(backlog),
        data_of(live),
        [f["seq"] for f in backlog + live],
    )


async def test_publishes_racing_the_subscribe_have_no_gap_or_duplicate(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """Messages published while the backlog is being read arrive once, in order."""
    await publish(node, "race", 300)
    sub = await session(http, node)
    racer = asyncio.get_running_loop().create_task(publish(node, "race", 200, start=300))
    await sub.send({"type": "subscribe", "topics": ["race"], "since": {"seq": 0}})
    got: list[int] = []
    while len(got) < 500:
        frame = await sub.next("message")
        got.append(frame["data"]["data"]["i"])
        if frame["seq"] % 512 == 0:
            await sub.send({"type": "ack", "upto": frame["seq"]})
    await racer
    assert [*range(500)] == got


async def test_filtered_wildcard_catch_up_skips_only_what_it_may_not_see(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """`**` over an inbox the member may not read: hidden messages are left out of the
    backlog, and neither a page of them nor one inside a page ends the backlog early."""
    member = KeyPair.generate()
    node.add_member(member.node_id)
    inbox = f"node.{short_id(node.keys.node_id)}.inbox"
    await publish_at_once(node, inbox, 500)  # a whole page the member may not see
    await publish_at_once(node, "chat.a", 300)
    await publish_at_once(node, inbox, 1)  # one hidden message inside a page
    await publish_at_once(node, "chat.a", 400, start=300)
    sub = await session(http, node, member)
    await sub.send({"type": "subscribe", "topics": ["**"], "since": {"seq": 0}})
    await sub.next("subscribed")
    backlog = await sub.messages(700)
    await publish(node, "chat.a", 1, start=700)
    live = await sub.messages(1)
    assert ([*range(701)], {"chat.a"}) == (
        data_of(backlog + live),
        {f["data"]["topic"] for f in backlog + live},
    )


async def test_back_to_back_subscribes_deliver_the_backlog_once(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """A subscribe sent while the session's first one still catches up waits for it: the
    backlog arrives once, in order, and both subscriptions then go live."""
    await publish_at_once(node, "pile", 1200)
    sub = await session(http, node, window=100)  # the catch-up must wait for acks
    await sub.send({"type": "subscribe", "topics": ["pile"], "since": {"seq": 0}})
    await sub.send({"type": "subscribe", "topics": ["other"]})
    events: list[str] = []
    got: list[int] = []
    while len(got) < 1200 or events.count("subscribed") < 2:
        frame = await sub.next()
        events.append(frame["event"])
        if frame["event"] == "message":
            got.append(frame["data"]["data"]["i"])
            await sub.send({"type": "ack", "upto": frame["seq"]})
    await publish(node, "other", 1, start=5000)
    await publish(node, "pile", 1, start=1200)
    live = await sub.messages(2)
    assert ([*range(1200)], [5000, 1200], [], 2) == (
        got,
        data_of(live),
        [e for e in events if e not in ("message", "subscribed")],
        events.count("subscribed"),
    )


async def test_unsubscribe_does_not_overtake_a_waiting_subscribe(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """subscribe, subscribe, unsubscribe sent together take effect in that order, even while
    the first subscribe's catch-up holds the second back."""
    await publish_at_once(node, "pile", 600)
    sub = await session(http, node, window=100)
    await sub.send({"type": "subscribe", "topics": ["pile"], "since": {"seq": 0}})
    await sub.send({"type": "subscribe", "topics": ["other"]})
    await sub.send({"type": "unsubscribe", "topics": ["other"]})
    events: list[str] = []
    got = 0
    while got < 600 or "unsubscribed" not in events:
        frame = await sub.next()
        events.append(frame["event"])
        if frame["event"] == "message":
            got += 1
            await sub.send({"type": "ack", "upto": frame["seq"]})
    await publish(node, "other", 1, start=5000)
    await publish(node, "pile", 1, start=600)
    live = await sub.messages(1)
    assert (["subscribed", "subscribed", "unsubscribed"], [600]) == (
        [e for e in events if e != "message"],
        data_of(live),
    )


async def test_resume_by_time_and_by_last(node: Node, http: aiohttp.ClientSession) -> None:
    """since {ts} replays from that time; since {last: N} the last N."""
    await publish(node, "t", 3)
    cut = now_ms() + 1
    await wait_until(lambda: now_ms() > cut)
    await publish(node, "t", 2, start=3)
    by_ts = await session(http, node)
    await by_ts.send({"type": "subscribe", "topics": ["t"], "since": {"ts": cut}})
    by_last = await session(http, node)
    await by_last.send({"type": "subscribe", "topics": ["t"], "since": {"last": 4}})
    assert ([3, 4], [1, 2, 3, 4]) == (
        data_of(await by_ts.messages(2)),
        data_of(await by_last.messages(4)),
    )


async def test_cursor_from_another_epoch_gets_reset(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """A cursor with a foreign epoch is answered reset{epoch_changed} with the node's epoch."""
    await publish(node, "t", 1)
    sub = await session(http, node)
    await sub.send({"type": "subscribe", "topics": ["t"], "since": {"epoch": "0000", "seq": 1}})
    assert {"reason": "epoch_changed", "epoch": node.message_log.epoch, "head_seq": 1} == (
        await sub.next()
    )["data"]


@pytest.mark.parametrize("with_epoch", [True, False])
async def test_cursor_beyond_the_head_gets_reset_cursor_ahead(
    node: Node, http: aiohttp.ClientSession, with_epoch: bool
) -> None:
    """A cursor of this epoch (or without one) beyond the head is reset{cursor_ahead}, naming
    the head to resume from; nothing is subscribed until the client subscribes again."""
    await publish(node, "t", 2)
    epoch = node.message_log.epoch
    sub = await session(http, node)
    since: Frame = {"epoch": epoch, "seq": 999} if with_epoch else {"seq": 999}
    await sub.send({"type": "subscribe", "topics": ["t"], "since": since})
    reset = await sub.next()
    await sub.send({"type": "subscribe", "topics": ["t"], "since": {"epoch": epoch, "seq": 2}})
    subscribed = await sub.next()
    await publish(node, "t", 1, start=2)
    assert (
        ("reset", {"reason": "cursor_ahead", "epoch": epoch, "head_seq": 2}),
        ("subscribed", 2),
        [2],
    ) == (
        (reset["event"], reset["data"]),
        (subscribed["event"], subscribed["data"]["head_seq"]),
        data_of(await sub.messages(1)),
    )


async def test_publish_over_ws_is_acknowledged_after_commit(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """publish → published.ok {ref, id, seq}; the message is in history."""
    sub = await session(http, node)
    await sub.send(
        {"type": "publish", "topic": "p.q", "msg_type": "note", "data": {"x": 1}, "ref": "r-7"}
    )
    ok = await sub.next("published.ok")
    page, _ = await node.message_log.reader.history("p.q")
    assert ("r-7", [ok["data"]["id"]]) == (ok["data"]["ref"], [m.message.id for m in page])


async def test_slow_subscriber_gets_gap_while_fast_one_gets_everything(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """A subscriber that never acks (window 4, queue 10) gets a gap; another gets all, on time."""
    async with Node(make_config(pubsub={"queue_max": 10, "sync": "normal"})) as node:
        slow = await session(http, node, window=4)
        fast = await session(http, node)
        for s in (slow, fast):
            await s.send({"type": "subscribe", "topics": ["fan"]})
            await s.next("subscribed")
        await publish(node, "fan", 100)
        fast_got = data_of(await fast.messages(100))
        slow_first = data_of(await slow.messages(4))
        await slow.send({"type": "ack", "upto": 4})
        gap = await slow.next()
        rest = data_of(await slow.messages(4))
        gaps = node.metrics.counter("hearthnet_pubsub_gaps_total", "").get()
    assert (
        [*range(100)],
        [0, 1, 2, 3],
        "gap",
        {"from_seq": 5, "to_seq": 90},
        [90, 91, 92, 93],
        1.0,
    ) == (fast_got, slow_first, gap["event"], gap["data"], rest, gaps)


async def test_durable_consumer_redelivers_unacked_and_takeover_closes_4409(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """Acked messages are not redelivered; unacked ones are; a second connection takes over."""
    first = await session(http, node)
    await first.send({"type": "subscribe", "topics": ["jobs"], "consumer": "worker"})
    await first.next("subscribed")
    await publish(node, "jobs", 5)
    frames = await first.messages(5)
    await first.send({"type": "ack", "upto": frames[2]["seq"]})  # consumed 0, 1, 2
    await wait_until(
        lambda: node.message_log.consumers[node.keys.node_id, "worker"].cursor == frames[2]["seq"]
    )
    second = await session(http, node)
    await second.send({"type": "subscribe", "topics": ["jobs"], "consumer": "worker"})
    redelivered = data_of(await second.messages(2))
    assert ([3, 4], 4409) == (redelivered, await first.closed())


@pytest.mark.parametrize("since", [{"seq": 0}, {"last": 3}, {"ts": 0}])
async def test_a_new_consumer_started_with_since_redelivers_what_it_did_not_ack(
    node: Node, http: aiohttp.ClientSession, since: Frame
) -> None:
    """A new durable consumer subscribed with ``since`` starts there: what its backlog
    delivered and it never acked comes again on its next subscribe (at-least-once),
    not only what was published after it was created."""
    await publish(node, "jobs.s", 3)
    first = await session(http, node)
    await first.send(
        {"type": "subscribe", "topics": ["jobs.s"], "since": since, "consumer": "w-since"}
    )
    assert [0, 1, 2] == data_of(await first.messages(3))
    await first.send({"type": "ack", "upto": 0})  # acks nothing it was sent
    await first.ws.close()
    second = await session(http, node)
    await second.send({"type": "subscribe", "topics": ["jobs.s"], "consumer": "w-since"})
    await second.next("subscribed")
    await publish(node, "jobs.s", 1, start=3)
    assert [0, 1, 2, 3] == data_of(await second.messages(4))


async def consume(raw: Raw, count: int, *, ack_every: int) -> list[Frame]:
    """``count`` message frames, acking every ``ack_every``; any other frame fails."""
    got: list[Frame] = []
    while len(got) < count:
        frame = await raw.next()
        assert "message" == frame["event"], frame
        got.append(frame)
        if len(got) % ack_every == 0:
            await raw.send({"type": "ack", "upto": frame["seq"]})
    return got


async def test_slow_durable_consumer_gets_everything_from_the_log_not_a_gap(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """spec §6.8: a consumer that falls behind (window 4, queue 10, 100 messages) loses
    nothing: what overflowed its queue is read back from the log, in order, without gap."""
    async with Node(make_config(pubsub={"queue_max": 10, "sync": "normal"})) as node:
        slow = await session(http, node, window=4)
        await slow.send({"type": "subscribe", "topics": ["jobs"], "consumer": "slow"})
        await slow.next("subscribed")
        await publish(node, "jobs", 100)
        got = await consume(slow, 100, ack_every=4)
        await publish(node, "jobs", 3, start=100)  # and it is live again afterwards
        live = data_of(await slow.messages(3))
        await wait_until(
            lambda: node.message_log.consumers[node.keys.node_id, "slow"].cursor == got[-1]["seq"]
        )
        gaps = node.metrics.counter("hearthnet_pubsub_gaps_total", "").get()
        refills = node.metrics.counter("hearthnet_pubsub_consumer_refills_total", "").get()
    assert ([*range(100)], [100, 101, 102], 0.0, True) == (
        data_of(got),
        live,
        gaps,
        refills >= 1,
    )


async def test_durable_consumer_overflowing_during_its_redelivery_loses_nothing(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """Redelivery of 60 unacked messages while 40 more arrive live (queue 10): all 100, in
    order, once."""
    async with Node(make_config(pubsub={"queue_max": 10, "sync": "normal"})) as node:
        first = await session(http, node)
        await first.send({"type": "subscribe", "topics": ["jobs"], "consumer": "late"})
        await first.next("subscribed")
        await first.ws.close()
        await publish(node, "jobs", 60)
        again = await session(http, node, window=4)
        await again.send({"type": "subscribe", "topics": ["jobs"], "consumer": "late"})
        await again.next("subscribed")
        live = asyncio.create_task(publish_at_once(node, "jobs", 40, start=60))
        got = await consume(again, 100, ack_every=4)
        await live
        refills = node.metrics.counter("hearthnet_pubsub_consumer_refills_total", "").get()
    assert ([*range(100)], True) == (data_of(got), refills >= 1)


async def test_presence_join_update_leave_and_snapshot(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """Joining shows in others' streams and in GET presence; leaving on close."""
    ann = await session(http, node)
    await ann.send({"type": "subscribe", "topics": ["room.1"], "presence": {"name": "Ann"}})
    snapshot = await ann.next("presence")  # includes herself; others get her join
    bob_keys = KeyPair.generate()
    node.add_member(bob_keys.node_id)
    bob = await session(http, node, bob_keys)
    await bob.send({"type": "subscribe", "topics": ["room.1"], "presence": {"name": "Bob"}})
    bob_snapshot = await bob.next("presence")
    joined = await ann.next("presence")
    await bob.send({"type": "presence.update", "status": "typing"})
    updated = await ann.next("presence")
    members = {m["name"] for m in node.pubsub.presence.members("room.1")}
    await bob.ws.close()
    left = await ann.next("presence")
    assert (
        ("snapshot", ["Ann"]),
        ["Ann", "Bob"],
        ("join", "Bob"),
        ("update", "typing"),
        {"Ann", "Bob"},
        "leave",
    ) == (
        (snapshot["data"]["kind"], [m["name"] for m in snapshot["data"]["members"]]),
        sorted(m["name"] for m in bob_snapshot["data"]["members"]),
        (joined["data"]["kind"], joined["data"]["member"]["name"]),
        (updated["data"]["kind"], updated["data"]["member"]["status"]),
        members,
        left["data"]["kind"],
    )


async def test_silent_client_leaves_presence(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """A client that sends nothing and answers no pings for presence_silence_s is a leave."""
    async with Node(make_config(pubsub={"presence_silence_s": 0.3})) as node:
        watcher = await session(http, node)
        await watcher.send({"type": "subscribe", "topics": ["room"]})
        await watcher.next("subscribed")
        ws = await http.ws_connect(
            node.url + "/pubsub/v1/subscribe", protocols=("hearthnet-bus.v2",), autoping=False
        )
        silent = Raw(ws)
        await silent.send(auth_frame(node.keys, node))
        await silent.next("auth.ok")
        await silent.send({"type": "subscribe", "topics": ["room"], "presence": {"name": "Zed"}})
        joined = await watcher.next("presence")
        left = await watcher.next("presence", within_s=5)
    assert ("join", "leave", "Zed") == (
        joined["data"]["kind"],
        left["data"]["kind"],
        left["data"]["member"]["name"],
    )


async def test_presence_members_are_pinged_often_enough_to_stay(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """Sessions are pinged every ws_ping_s; one that joins presence every half of
    presence_silence_s, so its pongs keep it a member (spec §3.6, §6.6)."""
    config = make_config(transport={"ws_ping_s": 3.0}, pubsub={"presence_silence_s": 0.4})
    async with Node(config) as node:
        pings = {"member": 0, "plain": 0}
        sockets = {}
        for name in pings:
            ws = await http.ws_connect(
                node.url + "/pubsub/v1/subscribe", protocols=("hearthnet-bus.v2",), autoping=False
            )
            await ws.send_json(auth_frame(node.keys, node))
            frame: Frame = {"type": "subscribe", "topics": ["room"]}
            if name == "member":
                frame["presence"] = {"name": "Ann"}
            await ws.send_json(frame)
            sockets[name] = ws

        async def count(name: str) -> None:
            ws = sockets[name]
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.PING:
                    pings[name] += 1
                    await ws.pong(msg.data)

        tasks = [asyncio.create_task(count(name)) for name in pings]
        await asyncio.sleep(1.0)  # the behaviour under test is a rate: count over a window
        members = [m["name"] for m in node.pubsub.presence.members("room")]
        for task in tasks:
            task.cancel()
        for ws in sockets.values():
            await ws.close()
    assert (["Ann"], True, 0) == (members, pings["member"] >= 3, pings["plain"])


async def test_token_session_expiry(make_config: MakeConfig, http: aiohttp.ClientSession) -> None:
    """A token session gets auth.expiring (within 60 s of expiry) and is closed 4401 at expiry."""
    async with Node(make_config()) as node:
        token = token_for(node, "sub:chat.**", ttl_ms=2000)
        sub = await session(http, node, token=token)
        warning = await sub.next("auth.expiring", within_s=5)
        code = await sub.closed(within_s=5)
    assert (CapabilityToken.decode(token).exp_ms, 4401) == (warning["data"]["expires_ms"], code)


async def test_a_refresh_to_a_token_that_ends_sooner_still_expires_on_time(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """The sweeper skips a session until its next deadline; a session swept while its
    token had an hour left, then refreshed to one that ends in 1.5 s, still gets
    auth.expiring and 4401."""
    # Sweeps every 50 ms (keepalive comments every 0.2 s), WebSocket pings stay slow.
    async with Node(make_config(transport={"sse_keepalive_s": 0.2})) as node:
        sub = await session(http, node, token=token_for(node, "sub:chat.**", sub="app"))
        # Sweep it now, as the sweeper would: it notes nothing is due for an hour.
        now, wall = asyncio.get_running_loop().time(), now_ms()
        for swept in list(node.sweeper.sessions):
            swept.sweep(now, wall)
        short = token_for(node, "sub:chat.**", ttl_ms=1500, sub="app")
        await sub.send({"type": "auth", "token": short})
        await sub.next("auth.ok")
        warning = await sub.next("auth.expiring", within_s=5)
        code = await sub.closed(within_s=5)
    assert (CapabilityToken.decode(short).exp_ms, 4401) == (
        warning["data"]["expires_ms"],
        code,
    )


async def test_a_refreshed_token_must_cover_the_current_subscriptions(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """A narrower token cannot be swapped in under a wider subscription (refused, the
    session keeps its old rights); a token that covers it is taken."""
    wide = token_for(node, "sub:chat.**", sub="app")
    sub = await session(http, node, token=wide)
    await sub.send({"type": "subscribe", "topics": ["chat.**"]})
    await sub.next("subscribed")
    await sub.send({"type": "auth", "token": token_for(node, "sub:chat.a", sub="app")})
    refused = await sub.next("error")
    await sub.send({"type": "auth", "token": token_for(node, "sub:chat.**", sub="app")})
    renewed = await sub.next("auth.ok")
    await publish(node, "chat.b.c", 1)
    got = await sub.messages(1)
    assert ("forbidden", "auth.ok", [0]) == (
        refused["data"]["code"],
        renewed["event"],
        data_of(got),
    )


async def test_revocation_follows_a_refreshed_token(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """After a refresh, revoking the old token leaves the session alone; revoking the new
    one ends it (spec §1.6)."""
    old = token_for(node, "sub:chat.**", sub="app")
    new = token_for(node, "sub:chat.**", sub="app")
    sub = await session(http, node, token=old)
    await sub.send({"type": "subscribe", "topics": ["chat.*"]})
    await sub.next("subscribed")
    await sub.send({"type": "auth", "token": new})
    await sub.next("auth.ok")

    def revoke(token: str) -> None:
        jti = CapabilityToken.decode(token).jti
        apply_signed_record(node, "token.revoked", jti, iss=node.keys.node_id)

    revoke(old)
    await publish(node, "chat.a", 1)
    still = await sub.messages(1)
    revoke(new)
    ended = await sub.next("error")
    assert data_of(still) == [0]
    assert ended["data"]["code"] == "revoked"
    assert await sub.closed() is not None


async def test_publish_rights_follow_a_refreshed_token(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """A session that published under one token is judged by its new token's scopes after a
    refresh: what the old token allowed is refused, what the new one allows goes through."""
    sub = await session(http, node, token=token_for(node, "pub:chat.a", sub="app"))
    publish_a = {"type": "publish", "topic": "chat.a", "msg_type": "m", "data": 1, "ref": "a"}
    publish_b = {"type": "publish", "topic": "chat.b", "msg_type": "m", "data": 2, "ref": "b"}
    await sub.send(publish_a)
    before = await sub.next("published.ok")
    await sub.send({"type": "auth", "token": token_for(node, "pub:chat.b", sub="app")})
    await sub.next("auth.ok")
    await sub.send(publish_a)
    refused = await sub.next("error")
    await sub.send(publish_b)
    after = await sub.next("published.ok")
    assert ("a", ("forbidden", "a"), "b") == (
        before["data"]["ref"],
        (refused["data"]["code"], refused["data"]["ref"]),
        after["data"]["ref"],
    )


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ({"type": "subscribe", "topics": ["a..b"]}, "bad_request"),
        (
            {"type": "publish", "topic": "big", "msg_type": "m", "data": "x" * (256 * 1024 + 10)},
            "payload_too_large",
        ),
        ({"type": "subscribe", "topics": ["t"], "since": {"seq": -1}}, "bad_request"),
        ({"type": "dance"}, "bad_request"),
    ],
)
async def test_bad_frames_get_error_and_the_session_goes_on(
    node: Node, http: aiohttp.ClientSession, frame: Frame, code: str
) -> None:
    """Bad topics, oversized payloads, bad cursors and unknown frames: error, not a close."""
    sub = await session(http, node)
    await sub.send(frame)
    error = await sub.next("error")
    await sub.send({"type": "ping"})
    assert (code, "pong") == (error["data"]["code"], (await sub.next("pong"))["event"])


async def test_access_rules_enforced_over_ws(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """A member may not read another node's inbox; a token is limited to its scopes."""
    async with Node(make_config()) as node:
        member = KeyPair.generate()
        node.add_member(member.node_id)
        sub = await session(http, node, member)
        await sub.send(
            {"type": "subscribe", "topics": [f"node.{short_id(node.keys.node_id)}.inbox"]}
        )
        denied_inbox = await sub.next("error")
        await sub.send({"type": "subscribe", "topics": [f"node.{short_id(member.node_id)}.inbox"]})
        own_inbox = await sub.next("subscribed")
        tsub = await session(http, node, token=token_for(node, "sub:chat.*"))
        await tsub.send({"type": "subscribe", "topics": ["chat.**"]})
        wide = await tsub.next("error")
        await tsub.send({"type": "publish", "topic": "chat.a", "msg_type": "m", "data": 1})
        no_pub = await tsub.next("error")
    assert ("forbidden", "subscribed", "forbidden", "forbidden") == (
        denied_inbox["data"]["code"],
        own_inbox["event"],
        wide["data"]["code"],
        no_pub["data"]["code"],
    )


@pytest.mark.parametrize(
    ("first", "expected_close"),
    [
        ({"type": "subscribe", "topics": ["a"]}, 1008),
        ({"type": "auth", "token": "hnt1:forged"}, 1008),
        (
            {
                "type": "auth",
                "identity": KeyPair.from_seed(b"\x77" * 32).node_id,
                "ts": 0,
                "nonce": "n" * 8,
                "sig": "ed25519:x",
            },
            1008,
        ),
    ],
)
async def test_unauthenticated_sessions_are_closed(
    node: Node, http: aiohttp.ClientSession, first: Frame, expected_close: int
) -> None:
    """Anything but a valid auth first: auth.error, then close 1008."""
    ws = await http.ws_connect(node.url + "/pubsub/v1/subscribe", protocols=("hearthnet-bus.v2",))
    raw = Raw(ws)
    await raw.send(first)
    answer = await raw.next()
    assert ("auth.error", expected_close) == (answer["event"], await raw.closed())


async def test_binary_frame_on_json_session_closes_1003(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """A binary frame on the JSON subprotocol ends the session with 1003."""
    sub = await session(http, node)
    await sub.ws.send_bytes(b"\x00\x01")
    assert 1003 == await sub.closed()


async def test_no_subprotocol_is_json_and_unknown_is_426(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """Browsers may omit the subprotocol (JSON); offering only foreign ones gets 426."""
    ws = await http.ws_connect(node.url + "/pubsub/v1/subscribe")
    raw = Raw(ws)
    await raw.send(auth_frame(node.keys, node))
    ok = await raw.next()
    status, body, _ = await refused_upgrade(http, node.url + "/pubsub/v1/subscribe", "mqtt")
    assert ("auth.ok", 426, "upgrade_required") == (ok["event"], status, body["error"])


async def test_publish_rate_limit_for_members(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """A member over publish_per_s_member gets rate_limited with retry_after_ms."""
    async with Node(make_config(pubsub={"publish_per_s_member": 3})) as node:
        member = KeyPair.generate()
        node.add_member(member.node_id)
        sub = await session(http, node, member)
        for i in range(4):
            await sub.send(
                {"type": "publish", "topic": "r", "msg_type": "m", "data": i, "ref": str(i)}
            )
        replies = {r["data"]["ref"]: r for r in [await sub.next() for _ in range(4)]}
    assert (["published.ok"] * 3 + ["error"], "rate_limited") == (
        [replies[str(i)]["event"] for i in range(4)],
        replies["3"]["data"]["code"],
    )


async def test_community_rules_change_applies_to_live_sessions(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """An anchor's pubsub.rules record (spec §6.9) takes effect at once: a subscription
    the new rules refuse ends with an error frame (the session goes on), deliveries and
    publish rights follow the new rules, and clearing them restores the node's own."""
    member = KeyPair.from_seed(b"\x21" * 32)
    node.add_member(member.node_id)
    sub = await session(http, node, member)
    await sub.send({"type": "subscribe", "topics": ["ops.alerts", "chat.x"]})
    await sub.next("subscribed")
    await sub.send({"type": "publish", "topic": "ops.alerts", "msg_type": "m", "data": 0})
    # allowed by the default rules (and remembered per topic); the ack and the message
    # itself come in either order
    assert {(await sub.next())["event"] for _ in range(2)} == {"published.ok", "message"}
    rules = (("ops.**", "anchor", "anchor"), ("**", "token", "token"))
    apply_signed_record(node, "pubsub.rules", node.keys.node_id, rules=rules)
    refused = await sub.next("error")
    await publish(node, "ops.alerts", 1, start=1)
    await publish(node, "chat.x", 1, start=2)
    delivered = await sub.messages(1)
    await sub.send({"type": "publish", "topic": "ops.alerts", "msg_type": "m", "data": 3})
    publish_refused = await sub.next("error")
    apply_signed_record(node, "pubsub.rules", node.keys.node_id, rules=())
    await sub.send({"type": "subscribe", "topics": ["ops.alerts"]})
    again = await sub.next("subscribed")
    assert refused["data"]["code"] == "forbidden"
    assert "ops.alerts" in refused["data"]["message"]
    assert data_of(delivered) == [2]  # ops.alerts (1) no longer reaches this session
    assert publish_refused["data"]["code"] == "forbidden"
    assert again["data"]["topics"] == ["ops.alerts"]


async def test_a_wildcard_subscriber_gets_a_presence_snapshot(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """spec §6.6: a new subscriber receives a snapshot, also through `room.*`."""
    ann = await session(http, node)
    await ann.send({"type": "subscribe", "topics": ["room.1"], "presence": {"name": "Ann"}})
    await ann.next("presence")
    carl = await session(http, node)
    await carl.send({"type": "subscribe", "topics": ["room.*", "other.*"]})
    frames = [await carl.next(), await carl.next()]
    assert [f["event"] for f in frames] == ["subscribed", "presence"]
    assert (frames[1]["data"]["topic"], frames[1]["data"]["kind"]) == ("room.1", "snapshot")
    assert [m["name"] for m in frames[1]["data"]["members"]] == ["Ann"]


async def test_patterns_count_once_against_the_session_limit(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """A pattern repeated in one frame, or subscribed again, takes one slot."""
    async with Node(make_config(pubsub={"max_patterns_per_session": 2})) as node:
        sub = await session(http, node)
        await sub.send({"type": "subscribe", "topics": ["d.x", "d.x"]})
        first = await sub.next()
        await sub.send({"type": "subscribe", "topics": ["d.x", "d.y"]})
        second = await sub.next()
        await sub.send({"type": "subscribe", "topics": ["d.z"]})
        third = await sub.next()
    assert (first["event"], first["data"]["topics"]) == ("subscribed", ["d.x"])
    assert second["event"] == "subscribed"
    assert (third["event"], third["data"]["code"]) == ("error", "bad_request")


async def test_a_consumers_lost_range_comes_after_subscribed(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """What retention took from a durable consumer past its bound is one gap, sent after
    `subscribed` (spec §6.5 order), then the held messages."""
    config = make_config(pubsub={"max_messages_per_topic": 2, "consumer_max_held": 3})
    async with Node(config) as node:
        sub = await session(http, node)
        await sub.send({"type": "subscribe", "topics": ["jobs"], "consumer": "w"})
        await sub.next("subscribed")
        await sub.ws.close()
        await wait_until(lambda: not node.pubsub.subscribers, what="the consumer detached")
        await publish(node, "jobs", 6)
        await node.pubsub.apply_retention()
        again = await session(http, node)
        await again.send({"type": "subscribe", "topics": ["jobs"], "consumer": "w"})
        frames = [await again.next() for _ in range(3)]
    assert [f["event"] for f in frames] == ["subscribed", "gap", "message"]
    assert frames[1]["data"] == {"from_seq": 4, "to_seq": 4}


async def test_last_n_counts_only_messages_the_caller_may_receive(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """`**` with `last: 3` when the newest message is on an inbox the member may not read:
    three messages it may read, not two."""
    member = KeyPair.generate()
    node.add_member(member.node_id)
    await publish(node, "chat.a", 4)
    await publish(node, f"node.{short_id(node.keys.node_id)}.inbox", 1, start=99)
    sub = await session(http, node, member)
    await sub.send({"type": "subscribe", "topics": ["**"], "since": {"last": 3}})
    await sub.next("subscribed")
    backlog = await sub.messages(3)
    assert data_of(backlog) == [1, 2, 3]


async def test_subscribe_with_last_beside_topics_is_refused_naming_last(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """`last: 3` instead of `since: {last: 3}` is bad_request naming `last` (with a hint),
    not a subscription without backlog; the session goes on."""
    await publish(node, "t", 5)
    sub = await session(http, node)
    await sub.send({"type": "subscribe", "topics": ["t"], "last": 3})
    await sub.send({"type": "ping"})
    answer = await sub.next()
    assert (
        "error",
        {
            "code": "bad_request",
            "message": "unknown field 'last' in subscribe frame"
            ' (did you mean since: {"last": N}?)',
        },
        "pong",
    ) == (answer["event"], answer["data"], (await sub.next())["event"])


@pytest.mark.parametrize(
    ("frame", "field"),
    [
        ({"type": "subscribe", "topics": ["t"], "colour": "red"}, "colour"),
        ({"type": "subscribe", "topics": ["t"], "since": {"last": 1, "limit": 1}}, "limit"),
        ({"type": "subscribe", "topics": ["t"], "presence": {"name": "a", "mood": 1}}, "mood"),
        ({"type": "unsubscribe", "topics": ["t"], "all": True}, "all"),
        ({"type": "publish", "topic": "t", "msg_type": "x", "data": 1, "ttl": 5}, "ttl"),
        ({"type": "presence.update", "name": "ann", "mood": "ok"}, "mood"),
        ({"type": "ack", "upto": 0, "seq": 0}, "seq"),
        ({"type": "ping", "ts": 1}, "ts"),
    ],
)
async def test_unknown_field_on_each_frame_type_is_bad_request(
    node: Node, http: aiohttp.ClientSession, frame: Frame, field: str
) -> None:
    """Every client frame type refuses a field it does not define, naming it; the session
    goes on (the ping after it is answered)."""
    sub = await session(http, node)
    await sub.send(frame)
    await sub.send({"type": "ping"})
    answer = await sub.next()
    assert ("error", "bad_request", True, "pong") == (
        answer["event"],
        answer["data"].get("code"),
        f"unknown field '{field}'" in answer["data"].get("message", ""),
        (await sub.next())["event"],
    )


async def test_unknown_field_in_a_refreshing_auth_is_bad_request(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """A fresh auth frame mid-session with an unknown field is refused by name; the session
    keeps its credentials and goes on."""
    sub = await session(http, node)
    await sub.send(auth_frame(node.keys, node, scope="all"))
    await sub.send({"type": "ping"})
    answer = await sub.next()
    assert ("error", "unknown field 'scope' in auth frame", "pong") == (
        answer["event"],
        answer["data"].get("message"),
        (await sub.next())["event"],
    )


async def test_unknown_field_in_the_first_auth_frame_is_refused(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """The first frame with an unknown field: auth.error naming it, then close 1008."""
    ws = await http.ws_connect(node.url + "/pubsub/v1/subscribe", protocols=("hearthnet-bus.v2",))
    raw = Raw(ws)
    await raw.send(auth_frame(node.keys, node, windw=64))
    answer = await raw.next()
    assert (
        "auth.error",
        {"code": "bad_request", "message": "unknown field 'windw' in auth frame"},
        1008,
    ) == (answer["event"], answer["data"], await raw.closed())


async def test_requests_in_progress_per_session_are_bounded(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """Past max_pending_per_session subscribes in progress, the next is capacity_exceeded."""
    async with Node(make_config(pubsub={"max_pending_per_session": 2})) as node:
        await publish_at_once(node, "pile", 200)
        sub = await session(http, node, window=100)  # the catch-up waits for acks
        await sub.send({"type": "subscribe", "topics": ["pile"], "since": {"seq": 0}})
        await sub.send({"type": "subscribe", "topics": ["other"]})
        await sub.send({"type": "subscribe", "topics": ["third"]})
        error = await sub.next("error")
    assert "capacity_exceeded" == error["data"]["code"]


async def test_a_client_still_sending_after_a_close_still_reads_its_code(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """A client that keeps sending after the node closed the session (1003) reads the
    close code, not a reset (the node drains input briefly before dropping TCP)."""
    sub = await session(http, node)
    await sub.ws.send_bytes(b"\x00\x01")
    filler = "x" * 60_000
    sent = 0
    while sent < 200:  # ~12 MB: far more than a socket buffer holds
        try:
            await sub.ws.send_str(filler)
        except (ConnectionError, aiohttp.ClientConnectionError):
            break
        sent += 1
    assert 1003 == await sub.closed()


async def test_a_frame_without_a_known_type_is_told_the_types(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """A frame with no `type`, or one the node does not know, is answered with the types
    a client may send (the session goes on)."""
    raw = await session(http, node)
    answers = []
    for frame in ({"topics": ["a.b"]}, {"type": "sub", "topics": ["a.b"]}):
        await raw.send(frame)
        answers.append((await raw.next("error"))["data"]["message"])
    types = "ack, auth, ping, presence.update, publish, subscribe, unsubscribe"
    assert [
        f"a client frame needs a type: one of {types}",
        f"unknown frame type 'sub': one of {types}",
    ] == answers
