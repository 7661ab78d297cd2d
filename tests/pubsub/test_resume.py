"""A resuming client sees every message exactly once and in order, whatever happens
(spec §3.7, §6.5). Real node, real sockets, the public client."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hearthnet.caller import Caller
from hearthnet.client import Client
from hearthnet.community import Level
from hearthnet.config import load_config
from hearthnet.node import Node
from hearthnet.pubsub.sinks import SocketSink
from hearthnet.subscription import Delivery
from tests.helpers import wait_until

Op = tuple[str, int]


async def scenario(data_dir: Path, ops: list[Op]) -> tuple[list[int], int]:
    """Run the ops against a fresh node; return what the client received and how many
    messages were published."""
    config = load_config(
        None,
        env={},
        overrides={
            "node": {"data_dir": str(data_dir), "host": "127.0.0.1", "port": 0},
            "pubsub": {"sync": "normal"},
            "mesh": {"zeroconf": False},
        },
    )
    async with Node(config) as node, Client(node.url, keys=node.keys) as client:
        me = Caller(node.keys.node_id, "node", Level.ANCHOR, None, True)
        received: list[int] = []
        published = 0
        async with client.subscribe("prop.*", first_backoff_s=0.01, window=8) as sub:

            async def consume() -> None:
                async for item in sub:
                    assert isinstance(item, Delivery)  # no gaps expected: queues are large
                    received.append(item.data["i"])

            consumer = asyncio.get_running_loop().create_task(consume())
            await wait_until(
                lambda: (
                    bool(node.pubsub.subscribers)
                    and all(s.patterns for s in node.pubsub.subscribers)
                ),
                what="subscribed",
            )
            for op, arg in ops:
                if op == "pub":
                    for _ in range(arg):
                        await node.pubsub.publish(
                            me, f"prop.t{published % 3}", "m", {"i": published}
                        )
                        published += 1
                elif op == "drop":
                    # a network drop, at whatever point delivery has reached
                    for session in list(node.pubsub.subscribers):
                        if isinstance(session.sink, SocketSink):
                            transport = session.sink.transport
                            assert isinstance(transport, asyncio.Transport)
                            transport.abort()
                else:
                    await asyncio.sleep(arg / 1000)
            total = published
            await wait_until(
                lambda: len(received) >= total or consumer.done(), within_s=20, what="all messages"
            )
            if consumer.done():
                consumer.result()  # the consumer's own failure (say, a gap), not a timeout
            consumer.cancel()
        return received, total


ops_strategy = st.lists(
    st.one_of(
        st.tuples(st.just("pub"), st.integers(1, 25)),
        st.just(("drop", 0)),
        st.tuples(st.just("wait"), st.integers(0, 20)),
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops_strategy)
def test_random_publishes_and_drops_deliver_each_message_once_in_order(ops: list[Op]) -> None:
    """Whatever mix of publishes, connection drops and pauses: every message, once, in order."""
    with tempfile.TemporaryDirectory() as tmp:
        received, total = asyncio.run(scenario(Path(tmp), ops))
    assert [*range(total)] == received
