"""Pub/sub over plain HTTP: publish, history, presence, topics, SSE and long-poll (spec §6.4–6.5).

The SSE tests use a hand-written HTTP/1.1 client on a raw socket (no HTTP library), as a
browser's EventSource would behave: ``?token=`` and ``Last-Event-ID``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any

import aiohttp
import pytest

from hearthnet.caller import Caller
from hearthnet.client import Client
from hearthnet.community import Level
from hearthnet.errors import (
    BadRequest,
    CapacityExceeded,
    Expired,
    Forbidden,
    PayloadTooLarge,
    Revoked,
    WireError,
)
from hearthnet.identity import KeyPair
from hearthnet.node import Node
from hearthnet.tokens import CapabilityToken
from tests.conftest import MakeConfig
from tests.helpers import (
    apply_signed_record,
    collect_numbers,
    publish,
    publish_at_once,
    token_for,
    wait_until,
)


class RawSse:
    """A minimal HTTP/1.1 + SSE client on a raw socket (chunked transfer decoding included)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.status = 0
        self.headers: dict[str, str] = {}
        self._chunked = False
        self._buffer = b""

    @classmethod
    async def open(
        cls,
        node: Node,
        path: str,
        headers: dict[str, str] | None = None,
        *,
        rcvbuf: int | None = None,
    ) -> RawSse:
        """Send the GET and read the response head (``rcvbuf``: a small receive buffer, so
        a reader that stops reading backs up into the node quickly)."""
        host, port = node.url.removeprefix("http://").rsplit(":", 1)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        reader, writer = await asyncio.open_connection(sock=sock)
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}", "Accept: text/event-stream"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        raw = cls(reader, writer)
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        status_line, *header_lines = head.strip().split("\r\n")
        raw.status = int(status_line.split()[1])
        raw.headers = {k.lower(): v.strip() for k, v in (h.split(":", 1) for h in header_lines)}
        raw._chunked = raw.headers.get("transfer-encoding") == "chunked"
        return raw

    async def _more(self) -> None:
        if not self._chunked:
            data = await self.reader.read(65536)
            if not data:
                raise EOFError
            self._buffer += data
            return
        size_line = await self.reader.readuntil(b"\r\n")
        size = int(size_line.strip(), 16)
        if size == 0:
            raise EOFError
        self._buffer += await self.reader.readexactly(size)
        await self.reader.readexactly(2)

    async def event(self, within_s: float = 5.0) -> dict[str, Any]:
        """The next event (comments skipped): {"event", "data", "id"}."""
        async with asyncio.timeout(within_s):
            while True:
                while b"\n\n" not in self._buffer:
                    await self._more()
                block, self._buffer = self._buffer.split(b"\n\n", 1)
                fields: dict[str, str] = {}
                for line in block.decode().split("\n"):
                    if line.startswith(":") or not line:
                        continue
                    name, _, value = line.partition(": ")
                    fields[name] = value
                if fields:
                    return {
                        "event": fields.get("event"),
                        "data": json.loads(fields["data"]),
                        "id": fields.get("id"),
                    }

    async def messages(self, count: int) -> list[dict[str, Any]]:
        """The next ``count`` message events."""
        out: list[dict[str, Any]] = []
        while len(out) < count:
            event = await self.event()
            if event["event"] == "message":
                out.append(event)
        return out

    def close(self) -> None:
        """Drop the connection."""
        self.writer.close()


@pytest.mark.parametrize("start", ["since_seq=0", "last=3", "since_ts=0"])
async def test_sse_resume_by_last_event_id_with_a_raw_client(node: Node, start: str) -> None:
    """EventSource-style: ?token=, id: = seq; reconnecting to the same URL with
    Last-Event-ID resumes exactly (the header wins over the URL's starting point)."""
    token = token_for(node, "sub:feed.*")
    await publish(node, "feed.a", 3)
    url = f"/pubsub/v1/subscribe?topics=feed.*&{start}&token={token}"
    first = await RawSse.open(node, url)
    got = await first.messages(3)
    first.close()
    await publish(node, "feed.a", 4, start=3)  # published while disconnected
    again = await RawSse.open(node, url, {"Last-Event-ID": got[-1]["id"]})
    hello = await again.event()
    resumed = await again.messages(4)
    await publish(node, "feed.a", 1, start=7)
    live = await again.messages(1)
    again.close()
    assert (
        200,
        "text/event-stream",
        ["1", "2", "3"],
        "subscribed",
        [3, 4, 5, 6],
        [7],
        ["4", "5", "6", "7"],
    ) == (
        first.status,
        first.headers["content-type"],
        [e["id"] for e in got],
        hello["event"],
        [e["data"]["data"]["i"] for e in resumed],
        [e["data"]["data"]["i"] for e in live],
        [e["id"] for e in resumed],
    )


async def test_slow_sse_reader_gets_a_gap_and_the_metrics_count_what_was_sent(
    make_config: MakeConfig,
) -> None:
    """An SSE reader that stops reading gets a gap event for what overflowed its queue,
    a fast WebSocket subscriber on the same topic gets everything while publishing goes
    on, and hearthnet_pubsub_{delivered,gaps}_total count exactly the frames written."""
    async with (
        Node(make_config(pubsub={"queue_max": 10, "sync": "normal"})) as node,
        Client(node.url, keys=node.keys) as client,
        client.subscribe("slow.t") as fast,
    ):
        token = token_for(node, "sub:slow.*")
        slow = await RawSse.open(
            node, f"/pubsub/v1/subscribe?topics=slow.t&token={token}", rcvbuf=4096
        )
        assert (await slow.event())["event"] == "subscribed"
        await wait_until(lambda: len([s for s in node.pubsub.subscribers if s.patterns]) == 2)
        me = Caller(node.keys.node_id, "node", Level.ANCHOR, None, True)
        pad = "x" * 16384
        fast_got: list[int] = []
        reader = asyncio.get_running_loop().create_task(collect_numbers(fast, fast_got, 600))
        for i in range(600):
            await node.pubsub.publish(me, "slow.t", "m", {"i": i, "pad": pad})
        await asyncio.wait_for(reader, timeout=10)  # the fast one is not held back
        seen: list[int] = []
        gaps: list[tuple[int, int]] = []
        while len(seen) + sum(b - a + 1 for a, b in gaps) < 600:
            event = await slow.event()
            if event["event"] == "message":
                seen.append(int(event["id"]))
            elif event["event"] == "gap":
                gaps.append((event["data"]["from_seq"], event["data"]["to_seq"]))
        slow.close()
        delivered = node.metrics.counter("hearthnet_pubsub_delivered_total", "").get()
        counted_gaps = node.metrics.counter("hearthnet_pubsub_gaps_total", "").get()
    covered = sorted(seen + [s for a, b in gaps for s in range(a, b + 1)])
    assert fast_got == [*range(600)]
    assert gaps, "the slow reader should have overflowed"
    assert covered == [*range(1, 601)]  # every seq once: delivered or named by a gap
    assert (delivered, counted_gaps) == (600 + len(seen), len(gaps))


@pytest.mark.parametrize(
    ("cursor", "reason"),
    [("since_epoch=0000&since_seq=1", "epoch_changed"), ("since_seq=999999", "cursor_ahead")],
)
async def test_sse_reset_goes_on_live_from_the_head(node: Node, cursor: str, reason: str) -> None:
    """A cursor from another epoch (or beyond the head) gets reset with that reason, then the
    stream is subscribed from the head and delivers what is published next."""
    token = token_for(node, "sub:feed.*")
    await publish(node, "feed.r", 1)
    raw = await RawSse.open(node, f"/pubsub/v1/subscribe?topics=feed.*&{cursor}&token={token}")
    reset = await raw.event()
    subscribed = await raw.event()
    await publish(node, "feed.r", 1, start=1)
    live = await raw.messages(1)
    raw.close()
    assert (
        ("reset", reason),
        ("subscribed", ["feed.*"]),
        [1],
    ) == (
        (reset["event"], reset["data"]["reason"]),
        (subscribed["event"], subscribed["data"]["topics"]),
        [e["data"]["data"]["i"] for e in live],
    )


async def test_sse_refusals(node: Node) -> None:
    """No credentials, a forged token, or a pattern outside the token's scope are refused;
    so are a bad topic and cursors that are not plain integers."""
    token = token_for(node, "sub:feed.*")
    results = []
    for path, headers in (
        ("/pubsub/v1/subscribe?topics=a", None),
        (f"/pubsub/v1/subscribe?topics=a&token={token[:-4]}xxxx", None),
        (f"/pubsub/v1/subscribe?topics=other.*&token={token}", None),
        (f"/pubsub/v1/subscribe?topics=a..b&token={token}", None),
        (f"/pubsub/v1/subscribe?topics=feed.*&since_seq=%C2%B2&token={token}", None),
        (f"/pubsub/v1/subscribe?topics=feed.*&token={token}", {"Last-Event-ID": "--5"}),
    ):
        raw = await RawSse.open(node, path, headers)
        body = json.loads(await raw.reader.readexactly(int(raw.headers["content-length"])))
        raw.close()
        results.append((raw.status, body["error"]))
    assert [
        (401, "unauthorized"),
        (401, "invalid_signature"),
        (403, "forbidden"),
        (400, "bad_request"),
        (400, "bad_request"),
        (400, "bad_request"),
    ] == results


async def test_long_poll_returns_backlog_at_once_and_waits_for_news(
    node: Node, client: Client
) -> None:
    """Backlog comes back at once; with none, the poll waits for the next message."""
    await publish(node, "lp", 2)
    backlog = await client.request_json(
        "GET", "/pubsub/v1/subscribe", query={"topics": "lp", "since_seq": 0, "timeout_s": 5}
    )
    waiter = asyncio.get_running_loop().create_task(
        client.request_json(
            "GET",
            "/pubsub/v1/subscribe",
            query={"topics": "lp", "since_seq": backlog["head_seq"], "timeout_s": 5},
        )
    )
    # the poll is parked (subscribed, nothing to return) before the next message exists
    await wait_until(
        lambda: any(s.patterns for s in node.pubsub.subscribers), what="the poll to park"
    )
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await publish(node, "lp", 1, start=2)
    news = await waiter
    empty = await client.request_json(
        "GET",
        "/pubsub/v1/subscribe",
        query={"topics": "lp", "since_seq": news["head_seq"], "timeout_s": 0},
    )
    assert ([0, 1], [2], [], node.message_log.epoch) == (
        [m["data"]["data"]["i"] for m in backlog["messages"]],
        [m["data"]["data"]["i"] for m in news["messages"]],
        empty["messages"],
        backlog["epoch"],
    )


@pytest.mark.parametrize(
    ("cursor", "reason"),
    [
        ({"since_seq": 999}, "cursor_ahead"),
        ({"since_epoch": "zzz", "since_seq": 0}, "epoch_changed"),
    ],
)
async def test_long_poll_reset_returns_at_once_with_the_new_epoch_and_head(
    node: Node, client: Client, cursor: dict[str, object], reason: str
) -> None:
    """A cursor from the future or another epoch cannot be used: the poll answers at once
    with a reset frame, the epoch and the head (spec §6.5), instead of waiting and then
    handing out a cursor past messages it never returned."""
    await publish(node, "lp.r", 2)
    started = asyncio.get_running_loop().time()
    page = await client.request_json(
        "GET", "/pubsub/v1/subscribe", query={"topics": "lp.r", "timeout_s": 10, **cursor}
    )
    waited = asyncio.get_running_loop().time() - started
    await publish(node, "lp.r", 1, start=2)
    after = await client.request_json(
        "GET",
        "/pubsub/v1/subscribe",
        query={"topics": "lp.r", "since_epoch": page["epoch"], "since_seq": page["head_seq"]},
    )
    assert waited < 5
    assert [("reset", reason)] == [(m["event"], m["data"]["reason"]) for m in page["messages"]]
    assert (page["epoch"], page["head_seq"]) == (node.message_log.epoch, 2)
    assert [m["data"]["data"]["i"] for m in after["messages"]] == [2]


async def test_long_poll_starts_by_time_or_count_and_refuses_bad_cursors(
    node: Node, client: Client
) -> None:
    """since_ts and last work as on SSE and WebSocket; malformed cursors are 400."""
    await publish(node, "lp.t", 3)
    page, _ = await node.message_log.reader.history("lp.t")
    by_ts = await client.request_json(
        "GET",
        "/pubsub/v1/subscribe",
        query={"topics": "lp.t", "since_ts": page[1].message.ts, "timeout_s": 0},
    )
    by_count = await client.request_json(
        "GET", "/pubsub/v1/subscribe", query={"topics": "lp.t", "last": 1, "timeout_s": 0}
    )
    refused = []
    for bad in ({"since_ts": "abc"}, {"since_seq": "-1"}, {"last": "x"}):
        with pytest.raises(BadRequest) as err:
            await client.request_json(
                "GET", "/pubsub/v1/subscribe", query={"topics": "lp.t", **bad}
            )
        refused.append(err.value.code)
    assert [m["data"]["data"]["i"] for m in by_ts["messages"]][-2:] == [1, 2]
    assert [m["data"]["data"]["i"] for m in by_count["messages"]] == [2]
    assert refused == ["bad_request"] * 3


async def test_long_polls_count_as_connections_and_deliveries(make_config: MakeConfig) -> None:
    """A parked long-poll holds one of the identity's connections (spec §2.5), and what a
    poll returns is counted in hearthnet_pubsub_delivered_total (spec §9)."""
    async with (
        Node(make_config(limits={"connections_per_identity": 2})) as node,
        Client(node.url, keys=node.keys) as client,
    ):
        query = {"topics": "lp.c", "timeout_s": 10}
        parked = [
            asyncio.get_running_loop().create_task(
                client.request_json("GET", "/pubsub/v1/subscribe", query=query)
            )
            for _ in range(2)
        ]
        await wait_until(lambda: node.connections.total == 2, what="two polls parked")
        with pytest.raises(CapacityExceeded):
            await client.request_json("GET", "/pubsub/v1/subscribe", query=query)
        delivered = node.metrics.counter("hearthnet_pubsub_delivered_total", "")
        before = delivered.get()
        await publish(node, "lp.c", 1)
        pages = await asyncio.gather(*parked)
        assert [len(p["messages"]) for p in pages] == [1, 1]
        assert delivered.get() - before == 2
        assert node.connections.total == 0


async def test_long_poll_pages_a_long_backlog_and_resumes_without_loss(
    node: Node, client: Client
) -> None:
    """A backlog over 500 comes back 500 at a time; head_seq of a full page is its last seq,
    so resuming with it gets every message exactly once, in order."""
    seqs = await publish_at_once(node, "lp.many", 650)
    sizes: list[int] = []
    cursors: list[int] = []
    got: list[int] = []
    cursor = 0
    for _ in range(5):
        page = await client.request_json(
            "GET",
            "/pubsub/v1/subscribe",
            query={"topics": "lp.many", "since_seq": cursor, "timeout_s": 0},
        )
        sizes.append(len(page["messages"]))
        got += [m["data"]["data"]["i"] for m in page["messages"]]
        cursor = page["head_seq"]
        cursors.append(cursor)
        if not page["messages"]:
            break
    assert ([500, 150, 0], [*range(650)], seqs[499], True) == (
        sizes,
        got,
        cursors[0],
        cursors[1] >= seqs[-1],
    )


async def test_publish_history_presence_topics_over_http(node: Node, client: Client) -> None:
    """The REST side: publish ack, history paging (each page naming the log's epoch),
    presence listing, topic listing."""
    acks = [await client.publish("room.7", "note", {"n": n}, ttl_s=3600) for n in range(5)]
    page1 = await client.history("room.7", limit=2)
    page0 = await client.history("room.7", before_seq=page1["messages"][0]["seq"], limit=10)
    forward = await client.history("room.7", since_seq=acks[1]["seq"], limit=2)
    topics = await client.topics(prefix="room.")
    members = await client.presence("room.7")
    epoch = node.message_log.epoch
    assert (
        [1, 2, 3, 4, 5],
        [3, 4],
        True,
        [0, 1, 2],
        False,
        [2, 3],
        True,
        [("room.7", 5)],
        [],
        [epoch] * 3,
    ) == (
        [a["seq"] for a in acks],
        [m["data"]["data"]["n"] for m in page1["messages"]],
        page1["has_more"],
        [m["data"]["data"]["n"] for m in page0["messages"]],
        page0["has_more"],
        [m["data"]["data"]["n"] for m in forward["messages"]],
        forward["has_more"],
        [(t["topic"], t["messages"]) for t in topics],
        members,
        [page1["epoch"], page0["epoch"], forward["epoch"]],
    )


async def test_history_is_fast_for_100_messages(node: Node, client: Client) -> None:
    """History of 100 messages is one query and one response with all of them, in order."""
    await publish(node, "replay", 100)
    page = await client.history("replay", since_seq=0, limit=100)
    assert ([*range(100)], False) == (
        [m["data"]["data"]["i"] for m in page["messages"]],
        page["has_more"],
    )


@pytest.mark.parametrize(
    ("topic", "body", "error"),
    [
        ("a..b", {"type": "m", "data": 1}, BadRequest),
        ("ok", {"type": "bad type", "data": 1}, BadRequest),
        ("ok", {"type": "m"}, BadRequest),
        ("ok", {"type": "m", "data": 1, "colour": "red"}, BadRequest),
        ("ok", {"type": "m", "data": "x" * (256 * 1024 + 1)}, PayloadTooLarge),
        ("mesh.beacon", {"type": "m", "data": 1}, Forbidden),
    ],
)
async def test_publish_refusals(
    make_config: MakeConfig, topic: str, body: dict[str, Any], error: type[Exception]
) -> None:
    """Bad topics, types and bodies, oversized payloads and reserved prefixes are refused."""
    async with Node(make_config()) as node:
        member = KeyPair.generate()
        node.add_member(member.node_id)
        async with Client(node.url, keys=member) as c:
            with pytest.raises(error):
                await c.request_json("POST", f"/pubsub/v1/topics/{topic}/messages", body)


async def test_a_token_in_the_authorization_header_publishes_and_reads(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """A token sent as ``Authorization: Bearer hnt1:...`` publishes and reads history as
    with X-HearthNet-Token, and the message's sender is the token's subject."""
    token = token_for(node, "pub:bearer.*", "sub:bearer.*", sub="page-1")
    headers = {"Authorization": f"Bearer {token}"}
    url = node.url + "/pubsub/v1/topics/bearer.a/"
    async with http.post(url + "messages", json={"type": "m", "data": 1}, headers=headers) as r:
        published = (r.status, (await r.json()).get("seq"))
    async with http.get(url + "history", headers=headers) as r:
        read = (r.status, [m["data"]["sender"]["id"] for m in (await r.json())["messages"]])
    subject = f"{node.keys.node_id}/page-1"  # a token's subject is named by its issuer
    async with http.get(url + "history", headers={"Authorization": "Bearer not-a-token"}) as r:
        without = (r.status, "Authorization: Bearer hnt1:" in (await r.json())["message"])
    assert (200, True, (200, [subject]), (401, True)) == (
        published[0],
        isinstance(published[1], int),
        read,
        without,
    )


async def test_a_publish_the_log_cannot_queue_is_answered_503_with_retry_after(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """While the log's queue is full (pubsub.max_pending) an HTTP publish is refused with
    unavailable, 503 and retry_after_ms, and nothing is stored; with room it is taken."""
    url = node.url + "/pubsub/v1/topics/full.a/messages"
    headers = {"X-HearthNet-Token": token_for(node, "pub:full.*")}
    log = node.message_log
    room, before = log.max_pending, log.head_seq
    log.max_pending = 0
    try:
        async with http.post(url, json={"type": "m", "data": 0}, headers=headers) as response:
            refused = (response.status, await response.json())
        held = log.head_seq
    finally:
        log.max_pending = room
    async with http.post(url, json={"type": "m", "data": 1}, headers=headers) as response:
        stored = (response.status, (await response.json())["seq"] > before)
    assert (503, "unavailable", True, before, (200, True)) == (
        refused[0],
        refused[1]["error"],
        refused[1].get("retry_after_ms", 0) > 0,
        held,
        stored,
    )


async def test_signed_request_must_match_path_and_query(node: Node, client: Client) -> None:
    """The request envelope covers the query string: replaying headers on another query fails."""
    headers = await client.signed_headers("GET", "/pubsub/v1/topics/x/history?limit=1", None)
    async with client.session.get(
        node.url + "/pubsub/v1/topics/x/history?limit=2", headers=headers
    ) as resp:
        body = await resp.json()
    assert (401, "invalid_signature") == (resp.status, body["error"])


async def test_shutdown_while_retention_and_anti_entropy_read_the_log(
    make_config: MakeConfig,
) -> None:
    """Background readers of the log stop before it closes: a node stopped while retention
    runs every millisecond (and has been seen to run) shuts down cleanly."""
    config = make_config(
        pubsub={"retention_interval_s": 0.001, "sync": "normal", "max_messages_per_topic": 2}
    )
    for _ in range(8):
        async with Node(config) as node:
            async with Client(node.url, keys=node.keys) as c:
                for i in range(20):
                    await c.publish(f"r.t{i % 4}", "m", {"i": i})
            await wait_until(
                lambda: all(t.messages <= 2 for t in node.message_log.topics.values()),
                what="a retention pass",
            )


LEVEL_RULES = {
    "rules": [
        {"pattern": "staff.**", "subscribe": "trusted", "publish": "anchor"},
        {"pattern": "open.**", "subscribe": "any", "publish": "member"},
        {"pattern": "**", "subscribe": "member", "publish": "member"},
    ],
    "sync": "normal",
}


async def _outcome(request: Any) -> str:
    """'ok', or the wire code the node refused with."""
    try:
        await request
    except WireError as exc:
        return exc.code
    return "ok"


async def test_access_levels_over_http(make_config: MakeConfig) -> None:
    """anchor / trusted / member / token / any (spec §6.9) over real HTTP: history reads
    need subscribe rights, publishes publish rights; a refusal is `forbidden`."""
    trusted, member = KeyPair.generate(), KeyPair.generate()
    async with Node(make_config(pubsub=LEVEL_RULES)) as node:
        node.add_member(trusted.node_id, Level.TRUSTED)
        node.add_member(member.node_id)
        token = token_for(node, "sub:other.*", "pub:open.*")
        clients = {
            "anchor": Client(node.url, keys=node.keys),
            "trusted": Client(node.url, keys=trusted),
            "member": Client(node.url, keys=member),
            "token": Client(node.url, token=token),
        }
        table: dict[str, list[str]] = {}
        try:
            for who, c in clients.items():
                table[who] = [
                    await _outcome(c.history("staff.a")),
                    await _outcome(c.publish("staff.a", "m", 1)),
                    await _outcome(c.history("open.a")),
                    await _outcome(c.publish("open.a", "m", 1)),
                    await _outcome(c.history("chat.a")),
                ]
        finally:
            for c in clients.values():
                await c.close()
    forbidden = "forbidden"
    assert table == {
        #          staff read  staff publish  open read  open publish  chat read
        "anchor": ["ok", "ok", "ok", "ok", "ok"],
        "trusted": ["ok", forbidden, "ok", "ok", "ok"],
        "member": [forbidden, forbidden, "ok", "ok", "ok"],
        "token": [forbidden, forbidden, "ok", forbidden, forbidden],
    }


async def test_token_clients_are_rate_limited_on_publish(make_config: MakeConfig) -> None:
    """Over publish_per_s_token (spec §2.5: 100/s by default) a token client gets 429
    rate_limited with retry_after_ms; the node's own identity is never limited."""
    async with Node(make_config(pubsub={"publish_per_s_token": 5, "sync": "normal"})) as node:
        token = token_for(node, "pub:rl.*")
        async with Client(node.url, token=token) as tc, Client(node.url, keys=node.keys) as me:
            refusals: list[WireError] = []
            started = time.monotonic()
            for i in range(20):
                try:
                    await tc.publish("rl.a", "m", i)
                except WireError as exc:
                    refusals.append(exc)
            elapsed = time.monotonic() - started
            for i in range(50):
                await me.publish("rl.a", "m", i)  # would raise if limited
    accepted = 20 - len(refusals)
    assert refusals
    assert 5 <= accepted <= 5 + 5 * elapsed + 1  # a burst of 5, then 5 per second
    assert {e.code for e in refusals} == {"rate_limited"}
    assert all(e.retry_after_ms and e.retry_after_ms > 0 for e in refusals)
    limit = "over the publish rate limit of a token client, 5 messages/s (publish_per_s_token)"
    assert {limit} == {e.message for e in refusals}


async def test_a_parked_long_poll_ends_with_its_token(node: Node) -> None:
    """A poll parked on a token ends when the token expires (410 expired) or is revoked
    (403 revoked), instead of delivering what comes after."""
    short = token_for(node, "sub:lpt.*", ttl_ms=1500)
    doomed = token_for(node, "sub:lpt.*")
    query = {"topics": "lpt.a", "timeout_s": 20}
    async with Client(node.url, token=short) as a, Client(node.url, token=doomed) as b:
        started = asyncio.get_running_loop().time()
        with pytest.raises(Expired):
            await a.request_json("GET", "/pubsub/v1/subscribe", query=query)
        expired_after = asyncio.get_running_loop().time() - started
        parked = asyncio.get_running_loop().create_task(
            b.request_json("GET", "/pubsub/v1/subscribe", query=query)
        )
        await wait_until(lambda: node.connections.total == 1, what="the poll parked")
        jti = CapabilityToken.decode(doomed).jti
        apply_signed_record(node, "token.revoked", jti, iss=node.keys.node_id)
        await publish(node, "lpt.a", 1)
        with pytest.raises(Revoked):
            await asyncio.wait_for(parked, timeout=5)
    assert expired_after < 5


async def test_sse_last_event_id_beyond_the_head_is_reset_cursor_ahead(node: Node) -> None:
    """An EventSource reconnecting with a Last-Event-ID beyond the head, in the same epoch,
    is told the true reason (cursor_ahead, not epoch_changed) and goes on live."""
    token = token_for(node, "sub:feed.*")
    await publish(node, "feed.c", 3)
    raw = await RawSse.open(
        node, f"/pubsub/v1/subscribe?topics=feed.*&token={token}", {"Last-Event-ID": "50"}
    )
    reset = await raw.event()
    subscribed = await raw.event()
    await publish(node, "feed.c", 1, start=3)
    live = await raw.messages(1)
    raw.close()
    assert (
        ("reset", {"reason": "cursor_ahead", "epoch": node.message_log.epoch, "head_seq": 3}),
        "subscribed",
        [(3, "4")],
    ) == (
        (reset["event"], reset["data"]),
        subscribed["event"],
        [(e["data"]["data"]["i"], e["id"]) for e in live],
    )


async def test_sse_query_with_an_unknown_parameter_is_refused_naming_it(node: Node) -> None:
    """A parameter the subscribe endpoint does not define is 400 bad_request naming it
    (before any event-stream headers go out)."""
    token = token_for(node, "sub:feed.*")
    raw = await RawSse.open(
        node, f"/pubsub/v1/subscribe?topics=feed.*&since_sequence=3&token={token}"
    )
    length = int(raw.headers["content-length"])
    body = json.loads(await raw.reader.readexactly(length))
    raw.close()
    assert (
        400,
        {
            "error": "bad_request",
            "message": "unknown parameter 'since_sequence' in subscribe query",
        },
    ) == (raw.status, body)


@pytest.mark.parametrize(
    ("path", "query", "message"),
    [
        (
            "/pubsub/v1/subscribe",
            {"topics": "lp.q", "timeout_s": 0, "since": 3},
            "unknown parameter 'since' in subscribe query",
        ),
        (
            "/pubsub/v1/topics/lp.q/history",
            {"since_seq": 0, "max": 3},
            "unknown parameter 'max' in history query",
        ),
        (
            "/pubsub/v1/topics/lp.q/presence",
            {"all": 1},
            "unknown parameter 'all' in presence query",
        ),
        (
            "/pubsub/v1/topics",
            {"prefix": "lp", "page": 2},
            "unknown parameter 'page' in topics query",
        ),
    ],
)
async def test_unknown_query_parameters_are_refused_naming_them(
    client: Client, path: str, query: dict[str, object], message: str
) -> None:
    """Long-poll, history, presence and topics refuse parameters they do not define."""
    with pytest.raises(BadRequest) as refused:
        await client.request_json("GET", path, query=query)
    assert message == refused.value.message


async def test_every_documented_query_parameter_is_accepted(node: Node, client: Client) -> None:
    """The tables list what the spec and the client use (and token, for EventSource)."""
    await publish(node, "lp.ok", 2)
    token = token_for(node, "sub:lp.*")
    poll = await client.request_json(
        "GET",
        "/pubsub/v1/subscribe",
        query={
            "topics": "lp.ok",
            "since_epoch": node.message_log.epoch,
            "since_seq": 0,
            "timeout_s": 0,
        },
    )
    history = await client.request_json(
        "GET",
        "/pubsub/v1/topics/lp.ok/history",
        query={"since_seq": 0, "since_ts": 0, "limit": 5},
    )
    raw = await RawSse.open(
        node, f"/pubsub/v1/subscribe?topic=lp.ok&last=1&timeout_s=1&token={token}"
    )
    first = await raw.event()
    raw.close()
    assert (2, 2, (200, "subscribed")) == (
        len(poll["messages"]),
        len(history["messages"]),
        (raw.status, first["event"]),
    )


BODY = '{"type", "data", "data_enc"?, "ttl_s"?, "idempotency_key"?}'


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"type": "note", "data": 1, "msg_type": "note"},
            "unknown field 'msg_type' in publish body (the HTTP body names it type)",
        ),
        (
            {"type": "note", "data": 1, "ttl": 5},
            "unknown field 'ttl' in publish body (did you mean ttl_s?)",
        ),
        ({"data": 1}, f"the body is {BODY}: type is missing"),
        ({"type": "note"}, f"the body is {BODY}: data is missing"),
        ([1, 2], f"the body is {BODY}"),
        (
            {"type": "note", "data": 1, "key": "k"},
            "unknown field 'key' in publish body (did you mean idempotency_key?)",
        ),
    ],
)
async def test_publish_body_with_an_unknown_or_missing_field_is_refused_naming_it(
    client: Client, body: dict[str, object], message: str
) -> None:
    """The publish body is {type, data, data_enc?, ttl_s?, idempotency_key?}: another
    field, or one of the two missing, is 400 naming it (and the message shows the whole
    body)."""
    with pytest.raises(BadRequest) as refused:
        await client.request_json("POST", "/pubsub/v1/topics/lp.b/messages", body)
    assert message == refused.value.message


async def test_a_publish_query_parameter_other_than_token_is_refused_naming_it(
    node: Node, client: Client, http: aiohttp.ClientSession
) -> None:
    """`POST .../messages?ttl_s=60` once published without a TTL and said nothing: the
    publish takes only `token` in its query (everything else goes in the body)."""
    with pytest.raises(BadRequest) as refused:
        await client.request_json(
            "POST", "/pubsub/v1/topics/lp.q/messages", {"type": "m", "data": 1}, {"ttl_s": 60}
        )
    token = token_for(node, "pub:lp.*")
    url = f"{node.url}/pubsub/v1/topics/lp.q/messages?token={token}"
    async with http.post(url, json={"type": "m", "data": 2}) as resp:
        with_token = resp.status
    assert (
        f"unknown parameter 'ttl_s' in publish query (the body carries it: {BODY})",
        200,
    ) == (refused.value.message, with_token)


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (
            {"since_seq": 0, "last": 3},
            "give one of since_seq, since_ts and last, not since_seq and last",
        ),
        (
            {"since_ts": 0, "last": 3},
            "give one of since_seq, since_ts and last, not since_ts and last",
        ),
        ({"since_epoch": "e", "last": 3}, "since_epoch goes with since_seq"),
    ],
)
async def test_a_subscribe_query_gives_one_starting_point(
    client: Client, query: dict[str, object], message: str
) -> None:
    """Two starting points (or an epoch without a seq) are refused, not half applied."""
    with pytest.raises(BadRequest) as refused:
        await client.request_json(
            "GET", "/pubsub/v1/subscribe", query={"topics": "lp.s", "timeout_s": 0, **query}
        )
    assert message == refused.value.message


async def test_a_refusal_by_the_access_rules_says_why(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """A `forbidden` names what refused it: the token's scopes, the level a rule needs,
    a reserved prefix, so the caller knows what to change."""
    rules = [
        {"pattern": "staff.**", "subscribe": "trusted", "publish": "anchor"},
        {"pattern": "open.**", "subscribe": "token", "publish": "token"},
        {"pattern": "**", "subscribe": "member", "publish": "member"},
    ]
    member = KeyPair.generate()
    async with Node(make_config(pubsub={"rules": rules, "sync": "normal"})) as node:
        node.add_member(member.node_id)
        token = token_for(node, "sub:open.*", "pub:open.a")
        messages: list[str] = []
        async with Client(node.url, token=token) as t, Client(node.url, keys=member) as m:
            for request in (
                t.publish("open.b", "m", 1),
                t.history("staff.a"),
                m.publish("staff.a", "m", 1),
                m.publish("mesh.x", "m", 1),
            ):
                with pytest.raises(Forbidden) as refused:
                    await request
                messages.append(refused.value.message)
        query = {"topics": "open.**", "timeout_s": "0", "token": token}
        async with http.get(node.url + "/pubsub/v1/subscribe", params=query) as resp:
            messages.append((await resp.json())["message"])
    assert [
        "publishing to open.b is not allowed: the token's pub scopes (open.a) do not cover it",
        "reading staff.a is not allowed: access rule 'staff.**' lets members of level"
        " trusted or above subscribe, not token clients",
        "publishing to staff.a is not allowed: access rule 'staff.**' needs level anchor"
        " to publish; this caller is member",
        "publishing to mesh.x is not allowed: mesh.* topics are written by the node itself",
        "subscribing to open.** is not allowed: the token's sub scopes (open.*) do not cover it",
    ] == messages


async def test_a_query_parameter_given_twice_is_refused_not_half_read(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """`?topics=a&topics=b` once subscribed to `a` alone and said nothing (the second was
    never read): a repeated parameter is refused naming it, with the list form for
    topics; `topic` beside `topics` likewise."""
    token = token_for(node, "sub:lp.*")
    answers = []
    for query in (
        "topics=lp.a&topics=lp.b&timeout_s=0",
        "topic=lp.a&topics=lp.b&timeout_s=0",
        "topics=lp.a&since_seq=1&since_seq=2&timeout_s=0",
    ):
        url = f"{node.url}/pubsub/v1/subscribe?{query}&token={token}"
        async with http.get(url) as resp:
            answers.append((resp.status, (await resp.json()).get("message")))
    async with http.get(f"{node.url}/pubsub/v1/topics?limit=1&limit=2&token={token}") as resp:
        answers.append((resp.status, (await resp.json()).get("message")))
    assert [
        (400, "parameter 'topics' given 2 times in subscribe query (list them: topics=a.b,c.*)"),
        (400, "give topics or topic in subscribe query, not both"),
        (400, "parameter 'since_seq' given 2 times in subscribe query"),
        (400, "parameter 'limit' given 2 times in topics query"),
    ] == answers
