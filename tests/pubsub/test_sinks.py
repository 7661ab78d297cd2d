"""Subscribers' sinks (pubsub/sinks.py): a socket sink follows its transport's
pause/resume (over a real socket pair); a long-poll sink collects without counting."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from hearthnet.caller import Caller
from hearthnet.membership_fold import Level
from hearthnet.pubsub.channel import SubscriberChannel
from hearthnet.pubsub.sinks import WRITE_HIGH_WATER, LongPollSink, SocketSink
from hearthnet.pubsub.subscriber import Subscriber
from tests.helpers import wait_until

ME = Caller("n_test", "node", Level.ANCHOR, None, True)


def gap(a: int, b: int) -> bytes:
    """A recognisable gap frame."""
    return f"gap:{a}-{b};".encode()


def frame(seq: int) -> bytes:
    """A recognisable message frame."""
    return f"m{seq};".encode()


class Resumed:
    """Counts resumes."""

    def __init__(self) -> None:
        self.calls: list[bool] = []

    def resume(self) -> None:
        """One more."""
        self.calls.append(True)


class Forwarding(asyncio.Protocol):
    """A connection's protocol that hands the transport's pause/resume to its sink, as
    the raw WebSocket protocol does."""

    sink: SocketSink | None = None

    def pause_writing(self) -> None:
        """Forwarded."""
        assert self.sink is not None
        self.sink.pause_writing()

    def resume_writing(self) -> None:
        """Forwarded."""
        assert self.sink is not None
        self.sink.resume_writing()


@asynccontextmanager
async def connected() -> AsyncIterator[tuple[SocketSink, socket.socket]]:
    """A socket sink on one end of a socket pair, and the other end (not read yet)."""
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_connection(Forwarding, sock=ours)
    sink = SocketSink(transport)
    protocol.sink = sink
    try:
        yield sink, theirs
    finally:
        transport.abort()
        theirs.close()


async def read_until(sock: socket.socket, end: bytes, limit: int = 8 << 20) -> bytes:
    """Bytes from ``sock`` until they end with ``end`` (at most ``limit``)."""
    loop = asyncio.get_running_loop()
    got = bytearray()
    while not got.endswith(end):
        chunk = await asyncio.wait_for(loop.sock_recv(sock, 1 << 16), timeout=10)
        assert chunk, "closed early"
        got += chunk
        assert len(got) <= limit
    return bytes(got)


async def test_a_socket_sink_pauses_above_the_high_mark_and_resumes_once_read() -> None:
    """More than the high mark unread pauses the sink; reading it all resumes it once."""
    resumed = Resumed()
    big = b"x" * (3 * WRITE_HIGH_WATER) + b"end"
    async with connected() as (sink, theirs):
        sink.subscriber = resumed
        written = sink.write([big])
        paused_after_write = sink.paused
        received = await read_until(theirs, b"end")
        await wait_until(lambda: bool(resumed.calls), what="resume")
    assert (True, True, len(big), [True], False) == (
        written,
        paused_after_write,
        len(received),
        resumed.calls,
        sink.paused,
    )


async def test_a_paused_subscriber_queues_then_writes_gap_and_rest_on_resume() -> None:
    """While its socket is full a subscriber lets nothing out (its queue overflows into a
    gap); once the client read, the resume writes what the channel lets out."""
    big = b"x" * (3 * WRITE_HIGH_WATER) + frame(1)
    replay = SubscriberChannel(window=None, queue_max=4, encode_gap=gap)
    replay.offer(1, big)
    replay.take()
    replay.set_writable(False)
    for seq in range(2, 11):
        replay.offer(seq, frame(seq))
    replay.set_writable(True)
    expected_after = b"".join(replay.take())
    async with connected() as (sink, theirs):
        channel = SubscriberChannel(window=None, queue_max=4, encode_gap=gap)
        sub = Subscriber(caller=ME, client_id="t", form="ws_text", channel=channel, sink=sink)
        channel.offer(1, big)
        first = sub.flush()
        for seq in range(2, 11):
            channel.offer(seq, frame(seq))
            sub.flush()
        held = channel.writable
        received = await read_until(theirs, frame(10))
    assert (1, False, big + expected_after) == (first, held, received)
    assert b"gap:" in expected_after  # the queue of 4 did overflow


async def test_a_long_poll_sink_collects_frames_and_counts_none() -> None:
    """Frames go to the response (which counts them), not to metrics at write time."""
    sink = LongPollSink()
    channel = SubscriberChannel(window=None, queue_max=8, encode_gap=gap)
    sub = Subscriber(caller=ME, client_id="lp", form="json", channel=channel, sink=sink)
    for seq in (1, 2, 3):
        channel.offer(seq, frame(seq))
    counted = sub.flush()
    assert (0, [frame(1), frame(2), frame(3)], True) == (
        counted,
        sink.frames,
        sink.arrived.is_set(),
    )
