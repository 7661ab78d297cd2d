"""What fan-out costs the node per subscriber, in one process, on the real code.

Spec §11 asks for server CPU per delivery at 1->100 and 1->1,000 subscribers. Over a
socket (``bench_pubsub``) that number also holds the publish path, the log and the
kernel's loopback work, and moves with the machine's load; this measures fan-out's own
part on the thread that runs it (``time.thread_time``), so runs of two trees compare:

- ``fanout``: ``FanOut.on_commit`` for a committed batch of ``--batch`` messages (256-byte
  payloads, batch-signed, one topic) and the flush that follows it, to ``--subs``
  subscribers, each a real :class:`~hearthnet.pubsub.sinks.SocketSink` on one end of a
  socket pair (``sink=socket``: the write system calls included; the other ends are read
  between rounds, untimed), of a loopback TCP connection (``sink=tcp``: the kernel's TCP
  work per write too, as the node's subscribers cost it) or a sink that only takes the
  frames (``sink=null``: Python alone), then each subscriber's ack of the batch and the
  flush after it (with ``--window`` below ``--batch`` the rest of each batch waits in the
  subscriber's queue until that ack). Per batch, per subscriber per batch (the batch's
  encoding, made once, taken out by a 1-subscriber run) and per delivery; medians of
  ``--rounds``;
- ``ack``: reading one client ack ``{"type":"ack","upto":N}`` (JSON and CBOR): the full
  decoder and frame parser, and the byte-level fast path where the tree has one.

Run: python -m bench.bench_fanout_cost [--subs 100,1000 --batch 80 --rounds 200]
     [--fields topic,type,data]   (lean frames)
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import time
import timeit
from typing import Any

import cbor2

from bench.common import save
from hearthnet.caller import Caller
from hearthnet.identity import KeyPair
from hearthnet.membership_fold import Level
from hearthnet.metrics import MetricsRegistry
from hearthnet.pubsub import frames as client_frames
from hearthnet.pubsub.access import AccessPolicy
from hearthnet.pubsub.channel import SubscriberChannel
from hearthnet.pubsub.envelope import Message, StoredMessage, canonical_body
from hearthnet.pubsub.fanout import FanOut, PubSubMetrics
from hearthnet.pubsub.index import SubscriptionIndex
from hearthnet.pubsub.sinks import SocketSink
from hearthnet.pubsub.subscriber import Subscriber
from hearthnet.pubsub.topics import TopicPattern
from hearthnet.transport.codec import SUBPROTOCOL_CBOR, SUBPROTOCOL_JSON, FrameCodec

TOPIC = "bench.fanout"
ME = Caller("n_bench", "node", Level.ANCHOR, None, True)
WINDOW = 1 << 16  # acked every round: never the limit
SOCKET_BUFFER = 8 << 20  # a whole batch fits: one write per subscriber, none left queued


class NullSink:
    """Takes the frames and does nothing: fan-out's Python alone."""

    stream = True
    paused = False
    subscriber: Any = None

    def write(self, frames: list[bytes], shared: Any = None) -> bool:
        """Taken."""
        return True


def _gap(a: int, b: int) -> bytes:
    return b"gap"


def _messages(n: int) -> list[Message]:
    keys = KeyPair.generate()
    bodies = [
        Message.unsigned(
            keys.node_id, topic=TOPIC, msg_type="bench", data="x" * 256, origin_seq=1 + i, ts=5
        )
        for i in range(n)
    ]
    return Message.signed_batch(keys, bodies, [canonical_body(b) for b in bodies])


async def fanout_batch_s(
    subs: int, batch: int, rounds: int, sink: str, window: int = WINDOW, fields: str = ""
) -> tuple[list[float], list[int]]:
    """CPU seconds of each round's on_commit and flush, then every subscriber's ack of
    the round and the flush after it (``rounds`` of them), and the bytes each
    subscriber's socket received (none with the null sink). A ``window`` below the batch
    leaves the rest of each batch queued until the ack lets it out. ``fields``: the
    subscribers ask for lean frames of those envelope fields (comma-separated)."""
    loop = asyncio.get_running_loop()
    index: SubscriptionIndex[Subscriber] = SubscriptionIndex()
    fanout = FanOut(
        node_id="n_bench",
        index=index,
        policy=AccessPolicy(),
        metrics=PubSubMetrics.register(MetricsRegistry(), lambda: 0.0),
        refill=lambda sub: None,
    )
    readers: list[socket.socket] = []
    transports: list[asyncio.Transport] = []
    for i in range(subs):
        channel = SubscriberChannel(window=window, queue_max=WINDOW, encode_gap=_gap)
        if sink in ("socket", "tcp"):
            ours, theirs = socket.socketpair() if sink == "socket" else _tcp_pair()
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
            theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
            theirs.setblocking(False)
            transport, _ = await loop.create_connection(asyncio.Protocol, sock=ours)
            transports.append(transport)
            readers.append(theirs)
            out: Any = SocketSink(transport)
        else:
            out = NullSink()
        sub = Subscriber(caller=ME, client_id=f"c{i}", form="ws_text", channel=channel, sink=out)
        sub.fanout = fanout
        if fields:
            sub.ask_fields(tuple(fields.split(",")))
        index.add(TopicPattern.parse(TOPIC), sub)
    messages = _messages(batch)
    took: list[float] = []
    received = [0] * len(readers)
    seq = 0
    try:
        for _ in range(rounds):
            stored = [StoredMessage(seq + i + 1, m) for i, m in enumerate(messages)]
            seq += batch
            start = time.thread_time()
            fanout.on_commit(stored)  # writes to every subscriber before it returns
            took.append(time.thread_time() - start)
            drain(readers, received)  # untimed: the subscribers' side
            # Each subscriber acks what it got (as PubSub.ack: the window moves, a flush
            # follows), until the batch is all out: one ack with the default window.
            for _ in range(batch // window + 1):
                start = time.thread_time()
                for sub in index.match(TOPIC):
                    if sub.channel.ack(sub.channel.delivered_seq):
                        fanout.wake(sub)
                fanout._flush_dirty()
                took[-1] += time.thread_time() - start
                drain(readers, received)
    finally:
        for each in transports:
            each.abort()
        for reader in readers:
            reader.close()
    return took, received


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    """Two ends of a loopback TCP connection (the kernel's work per write as the node's
    subscribers cost it), the first non-blocking for the transport. The buffers are sized
    before the handshake, so the window scale lets a whole batch in."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        theirs = socket.socket()
        theirs.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
        theirs.connect(listener.getsockname())
        ours, _ = listener.accept()
    ours.setblocking(False)
    return ours, theirs


def drain(readers: list[socket.socket], received: list[int]) -> None:
    """Read what each subscriber's socket holds; count the bytes."""
    for i, reader in enumerate(readers):
        try:
            while chunk := reader.recv(1 << 22):
                received[i] += len(chunk)
        except BlockingIOError:
            pass


def ack_costs(number: int) -> dict[str, float | None]:
    """µs to read one client ack: full decode and parse, and the fast path if present."""
    out: dict[str, float | None] = {}
    fast = getattr(client_frames, "fast_ack_upto", None)
    for name, sub, payload in (
        ("json", SUBPROTOCOL_JSON, b'{"type":"ack","upto":1234567}'),
        ("cbor", SUBPROTOCOL_CBOR, cbor2.dumps({"type": "ack", "upto": 1234567})),
    ):
        codec = FrameCodec(sub)
        binary = codec.binary

        def full(codec: FrameCodec = codec, payload: bytes = payload, binary: bool = binary) -> Any:
            return client_frames.parse_client_frame(
                codec.decode(payload, binary=binary, max_bytes=1 << 20)
            )

        out[f"{name}_full_us"] = _us(full, number)
        if fast is not None:
            out[f"{name}_fast_us"] = _us(lambda p=payload, b=binary: fast(p, b), number)
        else:
            out[f"{name}_fast_us"] = None
    return out


def _us(fn: Any, number: int) -> float:
    """Median of 5 timings, CPU µs per call."""
    runs = timeit.repeat(fn, number=number, repeat=5, timer=time.thread_time)
    return round(statistics.median(runs) / number * 1e6, 3)


def main(argv: list[str] | None = None) -> None:
    """Run and save bench/results/fanout_cost.json."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--subs", default="100,1000", help="subscriber counts")
    p.add_argument("--batch", type=int, default=80, help="messages per committed batch")
    p.add_argument("--rounds", type=int, default=200, help="batches per measurement")
    p.add_argument(
        "--sinks",
        default="socket,null",
        help="socket (a Unix socket pair), tcp (loopback TCP) and/or null",
    )
    p.add_argument(
        "--window",
        type=int,
        default=WINDOW,
        help="subscribers' window (below --batch: part of each batch waits for the ack)",
    )
    p.add_argument(
        "--fields", default="", help="subscribers ask for lean frames of these fields (a,b,c)"
    )
    p.add_argument("--name", default="fanout_cost")
    opts = p.parse_args(argv)
    fanout: list[dict[str, Any]] = []
    for sink in opts.sinks.split(","):
        one = statistics.median(
            asyncio.run(fanout_batch_s(1, opts.batch, opts.rounds, sink, opts.window, opts.fields))[
                0
            ]
        )
        for subs in (int(s) for s in opts.subs.split(",")):
            rounds = max(20, opts.rounds * 100 // subs)
            took, received = asyncio.run(
                fanout_batch_s(subs, opts.batch, rounds, sink, opts.window, opts.fields)
            )
            per_batch = statistics.median(took)
            per_sub = (per_batch - one) / (subs - 1)
            row = {
                "sink": sink,
                "subs": subs,
                "batch": opts.batch,
                "window": opts.window,
                "rounds": rounds,
                "us_per_batch": round(per_batch * 1e6, 1),
                "us_per_batch_one_subscriber": round(one * 1e6, 1),
                "us_per_subscriber_per_batch": round(per_sub * 1e6, 3),
                "us_per_delivery": round(per_batch / (subs * opts.batch) * 1e6, 4),
                "bytes_per_delivery": round(sum(received) / (subs * opts.batch * rounds), 1)
                if received
                else None,
            }
            print(row, flush=True)
            fanout.append(row)
    save(opts.name, {"fanout": fanout, "ack": ack_costs(20000), "settings": vars(opts)})


if __name__ == "__main__":
    main()
