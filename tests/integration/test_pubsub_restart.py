"""Node restarts, including kill -9: no acknowledged publish is lost and clients resume
(spec §6.4, §9). Real node processes, the public client."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from pathlib import Path

from hearthnet.client import Client
from hearthnet.errors import HearthNetError
from hearthnet.identity import load_or_create_keys
from hearthnet.subscription import Delivery
from tests.helpers import start_node_process, wait_until


def free_port() -> int:
    """A port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_kill_9_loses_no_acknowledged_publish_and_subscribers_resume(tmp_path: Path) -> None:
    """Publishers race a kill -9; after restart every acknowledged message is in the log,
    and a resuming subscriber has each of them exactly once, in order."""
    data, port = tmp_path / "node", free_port()
    node = start_node_process(data, "--port", str(port))
    keys = load_or_create_keys(data)
    acked: list[str] = []
    received: list[Delivery] = []
    try:
        async with Client(node.url, keys=keys) as client:
            async with client.subscribe("crash.*", first_backoff_s=0.05) as sub:

                async def consume() -> None:
                    async for item in sub:
                        if isinstance(item, Delivery):
                            received.append(item)

                consumer = asyncio.get_running_loop().create_task(consume())

                async def publisher(n: int) -> None:
                    for i in range(1000):
                        try:
                            ack = await client.publish(f"crash.p{n}", "m", {"n": n, "i": i})
                        except (HearthNetError, OSError):
                            return  # the node died under us: this one was not acknowledged
                        acked.append(ack["id"])

                publishers = [
                    asyncio.get_running_loop().create_task(publisher(n)) for n in range(4)
                ]
                await wait_until(lambda: len(acked) >= 200, within_s=30, what="200 acknowledged")
                node.stop(signal.SIGKILL)
                await asyncio.gather(*publishers)
                node = start_node_process(data, "--port", str(port))
                await wait_until(
                    lambda: {d.id for d in received} >= set(acked),
                    within_s=30,
                    what="the subscriber to catch up after the restart",
                )
                consumer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await consumer
            stored: list[str] = []
            for topic in (f"crash.p{n}" for n in range(4)):
                page = await client.history(topic, since_seq=0, limit=500)
                while True:
                    stored += [m["data"]["id"] for m in page["messages"]]
                    if not page["has_more"]:
                        break
                    page = await client.history(
                        topic, since_seq=page["messages"][-1]["seq"], limit=500
                    )
    finally:
        node.stop()
    seqs = [d.seq for d in received]
    assert (set(), len(received), seqs) == (
        set(acked) - set(stored),
        len({d.id for d in received}),
        sorted(seqs),
    )
