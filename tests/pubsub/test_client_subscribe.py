"""The public client's subscription against a real node: refusals it waits out, gaps
handed to ``on_gap`` (spec §3.7, §2.5, §6.7)."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest

from hearthnet.client import Client
from hearthnet.errors import BadRequest, InvalidSignature
from hearthnet.ids import new_ulid
from hearthnet.node import Node
from hearthnet.pubsub.envelope import Message
from hearthnet.pubsub.sinks import SocketSink
from hearthnet.subscription import Delivery, Gap, Reset
from tests.conftest import MakeConfig
from tests.helpers import collect_numbers, publish, publish_at_once, wait_until
from tests.pubsub.test_ws import session


async def test_subscription_waits_out_a_full_node_and_loses_nothing(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """A reconnect refused with capacity_exceeded is retried with backoff, not fatal."""
    config = make_config(limits={"connections_per_identity": 2}, pubsub={"sync": "normal"})
    async with (
        Node(config) as node,
        Client(node.url, keys=node.keys) as client,
        client.subscribe("cap.*", first_backoff_s=0.3) as sub,
    ):
        got: list[int] = []
        reader = asyncio.get_running_loop().create_task(collect_numbers(sub, got, None))
        other = await session(http, node)  # the identity's second connection
        await wait_until(lambda: any(s.patterns for s in node.pubsub.subscribers))
        await publish(node, "cap.a", 3)
        await wait_until(lambda: len(got) == 3, what="first messages")

        mine = [s for s in node.pubsub.subscribers if s.patterns]
        for s in mine:
            assert isinstance(s.sink, SocketSink)
            transport = s.sink.transport
            assert isinstance(transport, asyncio.Transport)
            transport.abort()
        await wait_until(lambda: len(node.pubsub.subscribers) == 1, what="the drop seen")
        squatter = await session(http, node)  # takes the freed slot before the reconnect
        await publish(node, "cap.a", 3, start=3)
        refused = node.metrics.counter("hearthnet_connections_refused_total", "", ("limit",))
        await wait_until(
            lambda: refused.get("identity") >= 1, within_s=5, what="a refused reconnect"
        )
        assert not reader.done(), reader
        await squatter.ws.close()
        await wait_until(lambda: len(got) == 6, within_s=10, what="resumed after the refusal")
        await publish(node, "cap.a", 2, start=6)
        await wait_until(lambda: len(got) == 8, what="live again")
        reader.cancel()
        await other.ws.close()
    assert (got, sub.reconnects) == ([*range(8)], 1)


async def test_on_gap_receives_the_gap_and_the_iterator_only_messages(
    make_config: MakeConfig,
) -> None:
    """With ``on_gap``, a slow subscription's gap goes to the callback, in stream order."""
    async with (
        Node(make_config(pubsub={"queue_max": 10, "sync": "normal"})) as node,
        Client(node.url, keys=node.keys) as client,
    ):
        events: list[object] = []
        async with client.subscribe("gap.t", window=4, on_gap=events.append) as sub:
            await wait_until(lambda: any(s.patterns for s in node.pubsub.subscribers))
            await publish(node, "gap.t", 100)  # nobody reads: the node's queue overflows

            async def read() -> None:
                async for item in sub:
                    assert isinstance(item, Delivery), item  # gaps go to on_gap, not here
                    events.append(item.data["i"])
                    if item.data["i"] == 99:
                        return

            await asyncio.wait_for(read(), timeout=10)
    gaps = [e for e in events if isinstance(e, Gap)]
    numbers = [e for e in events if isinstance(e, int)]
    assert len(gaps) == 1
    assert events.index(gaps[0]) == 4  # after the window's 4 messages, before the rest
    assert numbers[:4] == [0, 1, 2, 3]
    # seq = i + 1; the gap names the first and last seq dropped
    assert (gaps[0].from_seq, numbers[4:]) == (5, list(range(gaps[0].to_seq, 100)))


async def test_a_backlog_larger_than_the_window_keeps_flowing(
    make_config: MakeConfig,
) -> None:
    """`last: 50` with a window of 16: every message arrives (the client acks what it got,
    not the head it was told about), then live ones."""
    async with (
        Node(make_config(pubsub={"sync": "normal"})) as node,
        Client(node.url, keys=node.keys) as client,
    ):
        await publish(node, "bulk.a", 80)
        got: list[int] = []
        async with client.subscribe("bulk.a", since={"last": 50}, window=16) as sub:
            reader = asyncio.get_running_loop().create_task(collect_numbers(sub, got, 52))
            await wait_until(lambda: len(got) == 50, within_s=10, what="the whole backlog")
            await publish(node, "bulk.a", 2, start=80)
            await asyncio.wait_for(reader, timeout=10)
    assert got == list(range(30, 82))


async def test_a_durable_consumer_reconnecting_mid_backlog_loses_nothing(
    make_config: MakeConfig,
) -> None:
    """A consumer with more unacked messages than its window drops mid-backlog: after the
    reconnect the node redelivers from the last ack (no `since` overrides it), and the
    client hands out every message once, in order."""
    async with (
        Node(make_config(pubsub={"sync": "normal"})) as node,
        Client(node.url, keys=node.keys) as client,
    ):
        async with client.subscribe("work.*", consumer="w", window=16) as sub:
            await wait_until(lambda: any(s.patterns for s in node.pubsub.subscribers))
        await publish(node, "work.a", 40)  # nobody connected: all held for the consumer
        got: list[int] = []
        async with client.subscribe("work.*", consumer="w", window=16, first_backoff_s=0.05) as sub:

            async def read() -> None:
                async for item in sub:
                    assert isinstance(item, Delivery)
                    got.append(item.data["i"])
                    if len(got) == 10:  # mid-backlog, nothing acked past the window yet
                        for s in list(node.pubsub.subscribers):
                            if isinstance(s.sink, SocketSink):
                                transport = s.sink.transport
                                assert isinstance(transport, asyncio.Transport)
                                transport.abort()
                    if len(got) == 40:
                        return

            await asyncio.wait_for(read(), timeout=15)
            reconnects = sub.reconnects
    assert (got, reconnects) == (list(range(40)), 1)


async def test_a_subscribe_the_node_refuses_as_malformed_ends_the_iteration(
    make_config: MakeConfig,
) -> None:
    """A bad pattern or start is `bad_request`: resubscribing cannot help, so the
    iteration ends with the error instead of waiting forever."""
    async with (
        Node(make_config()) as node,
        Client(node.url, keys=node.keys) as client,
    ):
        for patterns, since, consumer in (
            ("chat..x", None, None),
            ("chat.x", {"last": -3}, None),
            ("chat.x", None, ""),  # an empty consumer name is not "no consumer"
        ):
            async with client.subscribe(patterns, since=since, consumer=consumer) as sub:
                with pytest.raises(BadRequest):
                    await asyncio.wait_for(anext(aiter(sub)), timeout=5)


async def test_a_cursor_beyond_the_head_resumes_from_the_head_of_the_same_epoch(
    make_config: MakeConfig,
) -> None:
    """reset{cursor_ahead}: the client resubscribes from the node's head on the same
    session (no reconnect, no error), says so once (``on_reset``), and gets everything
    published after it."""
    async with (
        Node(make_config(pubsub={"sync": "normal"})) as node,
        Client(node.url, keys=node.keys) as client,
    ):
        await publish(node, "ahead.a", 2)
        epoch = node.message_log.epoch
        resets: list[Reset] = []
        since = {"epoch": epoch, "seq": 500}
        async with client.subscribe("ahead.*", since=since, on_reset=resets.append) as sub:
            got: list[int] = []
            reader = asyncio.get_running_loop().create_task(collect_numbers(sub, got, 2))
            await wait_until(lambda: any(s.patterns for s in node.pubsub.subscribers))
            await publish(node, "ahead.a", 2, start=2)
            await asyncio.wait_for(reader, timeout=10)
            reset = Reset("cursor_ahead", since, epoch, 2)
            assert ([2, 3], 0, {"epoch": epoch, "seq": 4}, [reset]) == (
                got,
                sub.reconnects,
                sub.state.since(),
                resets,
            )


async def test_a_verifying_client_accepts_batch_signatures_and_skips_a_forgery(
    make_config: MakeConfig,
) -> None:
    """With verify=True, batch-signed messages (published together) are delivered and
    history verifies; a message whose batch proof was altered is skipped and counted."""
    config = make_config(pubsub={"sync": "normal"})
    async with (
        Node(config) as node,
        Client(node.url, keys=node.keys) as client,
        client.subscribe("ver.*", verify=True) as sub,
    ):
        got: list[int] = []
        reader = asyncio.get_running_loop().create_task(collect_numbers(sub, got, None))
        await wait_until(lambda: any(s.patterns for s in node.pubsub.subscribers))
        await publish_at_once(node, "ver.a", 6)
        await wait_until(lambda: len(got) == 6, what="batch-signed messages")
        page = await client.history("ver.a", since_seq=0, verify=True)
        genuine = page["messages"][2]["data"]
        forged = {**genuine, "id": new_ulid(), "data": {"i": 99}}
        await node.pubsub.log.ingest(Message.trusted(forged, orjson.dumps(forged)))
        await publish(node, "ver.a", 1, start=6)
        await wait_until(lambda: len(got) == 7, what="the message after the forgery")
        reader.cancel()
        with pytest.raises(InvalidSignature):
            await client.history("ver.a", since_seq=0, verify=True)
    assert (got, sub.rejected, isinstance(genuine["sig"], dict)) == ([*range(7)], 1, True)


async def test_ack_moves_a_durable_consumer_past_what_was_handed_out(
    make_config: MakeConfig,
) -> None:
    """A program that leaves the loop after the message it wanted calls ``sub.ack()``:
    the consumer's next subscription goes on after it, not from it again."""
    async with (
        Node(make_config(pubsub={"sync": "normal"})) as node,
        Client(node.url, keys=node.keys) as client,
    ):
        await publish(node, "work.b", 3)
        got: list[int] = []
        for since in ({"seq": 0}, None, None):
            async with client.subscribe("work.b", consumer="one", since=since) as sub:
                async for item in sub:
                    assert isinstance(item, Delivery)
                    got.append(item.data["i"])
                    await sub.ack()
                    break
    assert [0, 1, 2] == got
