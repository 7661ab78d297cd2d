"""One subscriber's delivery: window, backlog hand-over, explicit gaps (spec §6.5, §6.7). Pure."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hearthnet.pubsub.channel import ChannelState, SubscriberChannel


def gap(a: int, b: int) -> bytes:
    """A recognisable gap frame."""
    return f"gap:{a}-{b}".encode()


def frame(seq: int) -> bytes:
    """A recognisable message frame."""
    return f"m{seq}".encode()


def channel(
    window: int | None = 4, queue_max: int = 8, catching_up: bool = False
) -> SubscriberChannel:
    """A channel with test encodings."""
    return SubscriberChannel(
        window=window, queue_max=queue_max, encode_gap=gap, catching_up=catching_up
    )


def test_live_messages_go_straight_out_until_the_window_is_full() -> None:
    """With window 4, four frames go out; the rest wait for an ack."""
    ch = channel()
    for seq in range(1, 7):
        ch.offer(seq, frame(seq))
    first = ch.take()
    ch.ack(2)
    assert ([frame(s) for s in (1, 2, 3, 4)], [frame(5), frame(6)]) == (first, ch.take())


def test_backlog_then_live_without_gap_or_duplicate() -> None:
    """Live frames that arrive while catching up wait behind the backlog; overlap is dropped."""
    ch = channel(window=None, catching_up=True)
    ch.offer(5, frame(5))  # live, arrived during catch-up
    ch.offer(6, frame(6))
    ch.add_backlog([(s, frame(s)) for s in (2, 3, 4)])
    during = ch.take()
    ch.finish_catch_up()
    ch.offer(6, frame(6))  # a duplicate can never be sent twice
    ch.offer(7, frame(7))
    assert ([frame(2), frame(3), frame(4)], [frame(5), frame(6), frame(7)], ChannelState.LIVE) == (
        during,
        ch.take(),
        ch.state,
    )


def test_a_whole_batch_goes_out_as_one_shared_bytes_object() -> None:
    """Fan-out hands a batch with its frames pre-joined: a subscriber that takes every frame
    takes the joined bytes; one whose window cuts the batch takes its slice and queues the
    rest."""
    seqs = [1, 2, 3]
    frames = [frame(s) for s in seqs]
    joined = b"".join(frames)
    ch = channel(window=4)
    ch.offer_many(seqs, frames, joined)
    whole = ch.take()
    ch.offer_many([4, 5, 6], [frame(4), frame(5), frame(6)], b"never used")
    cut = ch.take()
    ch.ack(4)
    assert ([joined], [frame(4)], [frame(5), frame(6)]) == (whole, cut, ch.take())


def test_slow_subscriber_gets_one_gap_for_dropped_oldest() -> None:
    """Queue of 3: the oldest overflow is dropped and announced before the next message."""
    ch = channel(window=1, queue_max=3)
    for seq in range(1, 8):
        ch.offer(seq, frame(seq))
    first = ch.take()  # seq 1 in flight; 2..7 offered into a queue of 3 -> 2,3,4 dropped
    ch.ack(1)
    out = ch.take()
    ch.ack(5)
    ch.ack(5)
    assert ([frame(1)], [gap(2, 4), frame(5)], 1, 3) == (
        first,
        out,
        ch.gaps_total,
        ch.dropped_total,
    )


def test_lossless_overflow_asks_for_a_refill_instead_of_a_gap() -> None:
    """A durable consumer's channel (queue 3) drops its live queue on overflow, ignores live
    frames until refilled, then takes backlog from the log and goes live: no gap, no loss."""
    ch = channel(window=1, queue_max=3)
    ch.lossless = True
    for seq in range(1, 8):
        ch.offer(seq, frame(seq))
    first = ch.take()  # seq 1 in flight; 2..5 overflow the queue of 3 -> refill
    ch.ack(1)
    while_refill = ch.take()
    after = ch.begin_refill()  # the glue reads (after, head] from the log as backlog
    ch.offer(8, frame(8))  # live again, behind the backlog
    ch.add_backlog([(s, frame(s)) for s in range(after + 1, 8)])
    ch.finish_catch_up()
    rest: list[bytes] = []
    while out := ch.take():
        rest += out
        ch.ack(ch.delivered_seq)
    assert ([frame(1)], [], 1, [frame(s) for s in range(2, 9)], 0) == (
        first,
        while_refill,
        after,
        rest,
        ch.gaps_total,
    )


def test_not_writable_holds_frames_back() -> None:
    """A full transport pauses delivery; resuming writes in order."""
    ch = channel(window=None)
    ch.set_writable(False)
    ch.offer(1, frame(1))
    ch.offer(2, frame(2))
    held = ch.take()
    ch.set_writable(True)
    assert ([], [frame(1), frame(2)]) == (held, ch.take())


def test_closed_channel_takes_nothing() -> None:
    """After close, offers are ignored; closing twice is fine."""
    ch = channel()
    ch.close()
    ch.close()
    ch.offer(1, frame(1))
    assert [] == ch.take()


def test_illegal_transition() -> None:
    """finish_catch_up on a live channel is a bug."""
    with pytest.raises(RuntimeError):
        channel().finish_catch_up()


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("offer"), st.integers(1, 3)),
            st.tuples(st.just("ack"), st.integers(0, 40)),
            st.tuples(st.just("pause"), st.booleans()),
        ),
        max_size=120,
    )
)
def test_every_seq_is_delivered_once_in_order_or_covered_by_a_gap(
    ops: list[tuple[str, object]],
) -> None:
    """Whatever the interleaving, output seqs increase, and every offered seq is either
    delivered exactly once or inside an announced gap."""
    ch = channel(window=5, queue_max=4)
    seq = 0
    delivered: list[int] = []
    gaps: list[tuple[int, int]] = []

    def drain() -> None:
        for item in ch.take():
            text = item.decode()
            if text.startswith("gap:"):
                a, b = text[4:].split("-")
                gaps.append((int(a), int(b)))
            else:
                delivered.append(int(text[1:]))

    for op, arg in ops:
        if op == "offer":
            for _ in range(int(arg)):  # type: ignore[call-overload]
                seq += 1
                ch.offer(seq, frame(seq))
        elif op == "ack":
            ch.ack(int(arg))  # type: ignore[call-overload]
        else:
            ch.set_writable(bool(arg))
        drain()
    ch.set_writable(True)
    drain()
    for _ in range(seq + 1):  # bounded: each round acks everything in flight
        if not ch.queued:
            break
        assert ch.window is not None
        ch.ack(ch.window.last_seq)
        drain()
    covered = set(delivered) | {s for a, b in gaps for s in range(a, b + 1)}
    assert (sorted(delivered), len(delivered), set(range(1, seq + 1))) == (
        delivered,
        len(set(delivered)),
        covered,
    )


class OneByOne(SubscriberChannel):
    """The channel's rules applied one frame at a time (how it worked before batches):
    each frame offered alone, and let out alone."""

    def offer_many(self, seqs: list[int], frames: list[bytes], whole: bytes | None = None) -> None:
        for seq, data in zip(seqs, frames, strict=True):
            self.offer(seq, data)

    def pump(self) -> None:
        while self.writable and (self.window is None or self.window.open):
            if self._backlog:
                seq, data = self._backlog.popleft()
                if seq > self.delivered_seq:
                    self._emit(seq, data)
                continue
            if self.state is not ChannelState.LIVE or not self._live:
                return
            if self._gap is not None:
                self.out.append(self.encode_gap(*self._gap))
                self.gaps_total += 1
                self._gap = None
            seq, data = self._live.popleft()
            if seq > self.delivered_seq:
                self._emit(seq, data)


_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("batch"), st.integers(1, 12), st.integers(1, 3)),
        st.tuples(st.just("ack"), st.integers(0, 4), st.just(0)),
        st.tuples(st.just("writable"), st.booleans(), st.just(0)),
        st.tuples(st.just("backlog"), st.integers(0, 6), st.just(0)),
    ),
    max_size=20,
)


@given(
    window=st.one_of(st.none(), st.integers(1, 9)),
    queue_max=st.integers(1, 10),
    lossless=st.booleans(),
    catching_up=st.booleans(),
    ops=_OPS,
)
@settings(max_examples=80, deadline=None)
def test_batches_go_in_and_out_as_frames_one_by_one_would(
    window: int | None,
    queue_max: int,
    lossless: bool,
    catching_up: bool,
    ops: list[tuple[str, object, int]],
) -> None:
    """Whole batches offered, queued and let out after acks give the same frames, gaps,
    drops and refills as the same frames one at a time."""
    pair = [
        cls(window=window, queue_max=queue_max, encode_gap=gap, catching_up=catching_up)
        for cls in (SubscriberChannel, OneByOne)
    ]
    for ch in pair:
        ch.lossless = lossless
    seq = 0
    seen: list[list[object]] = [[], []]
    for op, a, b in ops:
        if op == "batch":
            assert isinstance(a, int)
            seqs = [seq + b * (i + 1) for i in range(a)]  # b > 1: another topic's seqs
            seq = seqs[-1]
            for ch in pair:
                ch.offer_many(seqs, [frame(s) for s in seqs])
        elif op == "backlog" and pair[0].state is ChannelState.CATCHING_UP:
            assert isinstance(a, int)
            for ch in pair:
                ch.add_backlog([(s, frame(s)) for s in range(max(1, seq - a), seq + 1)])
                ch.finish_catch_up()
        elif op == "ack":
            assert isinstance(a, int)
            upto = pair[0].delivered_seq - a
            for ch in pair:
                ch.ack(upto)
        elif op == "writable":
            for ch in pair:
                ch.set_writable(bool(a))
        for i, ch in enumerate(pair):
            seen[i].append(
                (ch.take(), ch.delivered_seq, ch.gaps_total, ch.dropped_total, ch.refill)
            )
    assert seen[1] == seen[0]
