"""Delivery to one subscriber (spec §6.5, §6.7, §3.6). Pure: bytes in, bytes out.

A channel receives frames that are already encoded for its transport (the same bytes
for every subscriber) and decides what may be written now:

- **window**: at most ``window`` message frames unacknowledged (WebSocket); none for SSE
  and long-poll, where TCP back-pressure (``writable``) paces delivery;
- **catch-up**: while the backlog is read from the log, live messages wait in the live
  queue; backlog frames go first, so the hand-over has no gap and no duplicate;
- **slow subscribers**: the live queue holds at most ``queue_max`` frames; on overflow the
  oldest are dropped *for this subscriber only* and one ``gap {from_seq, to_seq}`` frame
  says so before the next message. Nothing is dropped silently, and nobody else waits;
- **lossless** (durable consumers, spec §6.8): an overflow drops the whole live queue and
  sets ``refill`` instead of a gap; further live frames are ignored until the glue has read
  everything after ``delivered_seq`` back from the log (``begin_refill``, backlog, then
  ``finish_catch_up``). Memory stays bounded; the log is the queue.

States::

    CATCHING_UP --finish_catch_up--> LIVE --close--> CLOSED
         ^  \\--------------------close----------------->/
         \\--------begin_refill (lossless)--/
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable

from hearthnet.pubsub.seqwindow import SeqWindow


class ChannelState(enum.Enum):
    """Where a channel is."""

    CATCHING_UP = "catching_up"
    LIVE = "live"
    CLOSED = "closed"


_TRANSITIONS = {
    ChannelState.CATCHING_UP: frozenset({ChannelState.LIVE, ChannelState.CLOSED}),
    ChannelState.LIVE: frozenset({ChannelState.CATCHING_UP, ChannelState.CLOSED}),
    ChannelState.CLOSED: frozenset(),
}

GapEncoder = Callable[[int, int], bytes]
# Module constants for the hot paths: an Enum member read through its class is a slow
# attribute lookup on Python 3.11.
_LIVE = ChannelState.LIVE
_CLOSED = ChannelState.CLOSED


class SubscriberChannel:
    """One subscriber's ordered, bounded, flow-controlled delivery."""

    __slots__ = (
        "_backlog",
        "_gap",
        "_live",
        "delivered_seq",
        "dropped_total",
        "encode_gap",
        "gaps_total",
        "lossless",
        "out",
        "out_count",
        "queue_max",
        "refill",
        "state",
        "window",
        "writable",
    )

    def __init__(
        self,
        *,
        window: int | None,
        queue_max: int,
        encode_gap: GapEncoder,
        catching_up: bool = False,
    ) -> None:
        self.window = SeqWindow(window) if window else None
        self.queue_max = queue_max
        self.encode_gap = encode_gap
        self.state = ChannelState.CATCHING_UP if catching_up else ChannelState.LIVE
        self.out: list[bytes] = []
        self.out_count = 0  # message frames in `out` (gap frames not counted)
        # Created on first use: an empty deque costs ~600 bytes, and most subscribers of an
        # idle node never queue anything.
        self._live: deque[tuple[int, bytes]] | None = None
        self._backlog: deque[tuple[int, bytes]] | None = None
        self._gap: tuple[int, int] | None = None
        self.delivered_seq = 0
        self.writable = True
        self.gaps_total = 0
        self.dropped_total = 0
        self.lossless = False  # a durable consumer: overflow refills from the log
        self.refill = False  # live frames were dropped; the log must supply them

    def _to(self, state: ChannelState) -> None:
        if state not in _TRANSITIONS[self.state]:
            raise RuntimeError(f"illegal channel transition {self.state.value} -> {state.value}")
        self.state = state

    @property
    def queued(self) -> int:
        """Frames waiting (backlog and live)."""
        return len(self._live or ()) + len(self._backlog or ())

    @property
    def backlog_room(self) -> int:
        """How many backlog frames the glue may add now (it reads pages on demand)."""
        return 0 if self._backlog else self.queue_max

    def _window_open(self) -> bool:
        return self.window is None or self.window.open

    def _nothing_waits(self) -> bool:
        """Live, writable, and nothing queued or owed ahead of a new frame."""
        return self.state is _LIVE and not self._live and self._gap is None and self.writable

    def _emit(self, seq: int, data: bytes) -> None:
        if self.window is not None:
            self.window.sent(seq)
        self.delivered_seq = seq
        self.out.append(data)
        self.out_count += 1

    def offer(self, seq: int, data: bytes) -> None:
        """A live message for this subscriber (called by fan-out, in seq order)."""
        if self.state is _CLOSED or seq <= self.delivered_seq or self.refill:
            return
        if self._nothing_waits() and self._window_open():
            self._emit(seq, data)  # the common case: straight out
            return
        live = self._live
        if live is None:
            live = self._live = deque()
        live.append((seq, data))
        if len(live) > self.queue_max:
            if self.lossless:
                self._live = None
                self.refill = True
                return
            dropped, _ = live.popleft()
            self.dropped_total += 1
            self._gap = (self._gap[0], dropped) if self._gap else (dropped, dropped)

    def offer_many(self, seqs: list[int], frames: list[bytes], whole: bytes | None = None) -> None:
        """Live messages in seq order, as parallel lists (the fan-out hot path: one call per
        subscriber per topic per committed batch; ``frames`` is shared, never changed).

        ``whole``, for stream transports, is all ``frames`` as one shared bytes object:
        written when every frame goes out at once, so subscribers do not each join the
        batch.
        """
        if self.state is _CLOSED or not seqs or self.refill:
            return
        start = 0
        if seqs[0] <= self.delivered_seq:  # only after a backlog overlap; rare
            while start < len(seqs) and seqs[start] <= self.delivered_seq:
                start += 1
            if start == len(seqs):
                return
        # Nothing queued or owed ahead of these (see _nothing_waits), inline: this runs
        # for every subscriber of every batch.
        if self.state is _LIVE and not self._live and self._gap is None and self.writable:
            todo = seqs[start:] if start else seqs
            window = self.window
            room = len(todo) if window is None else window.send_many(todo)
            if room:
                end = start + room
                if start or end < len(frames):
                    self.out.extend(frames[start:end])
                elif whole is not None:
                    self.out.append(whole)
                else:
                    self.out.extend(frames)
                self.out_count += room
                self.delivered_seq = seqs[end - 1]
                start = end
                if start == len(seqs):
                    return
        # The rest waits (behind the queue, a gap, a paused transport or a full window).
        self._queue(seqs, frames, start)

    def _queue(self, seqs: list[int], frames: list[bytes], start: int) -> None:
        """``offer`` of each of ``seqs[start:]`` that must wait, at once: queued in order,
        the oldest dropped beyond ``queue_max`` (one gap for them), or, lossless, a refill
        asked for on overflow."""
        live = self._live
        if live is None:
            live = self._live = deque()
        live.extend(zip(seqs[start:], frames[start:], strict=True))
        excess = len(live) - self.queue_max
        if excess <= 0:
            return
        if self.lossless:
            self._live = None
            self.refill = True
            return
        first = live[0][0]
        for _ in range(excess - 1):
            live.popleft()
        last = live.popleft()[0]
        self.dropped_total += excess
        self._gap = (self._gap[0], last) if self._gap else (first, last)

    def add_backlog(self, items: list[tuple[int, bytes]]) -> None:
        """Backlog frames, in seq order, all older than any live frame queued."""
        if self.state is not ChannelState.CATCHING_UP:
            raise RuntimeError("backlog only while catching up")
        if self._backlog is None:
            self._backlog = deque(items)
        else:
            self._backlog.extend(items)
        self.pump()

    def begin_refill(self) -> int:
        """Start reading what overflowed back from the log (lossless channels); returns the
        seq after which the log must be read. Live frames queue again from now on."""
        if self.state is ChannelState.LIVE:
            self._to(ChannelState.CATCHING_UP)
        self.refill = False
        return self.delivered_seq

    def finish_catch_up(self) -> None:
        """The backlog is complete: live frames follow."""
        self._to(ChannelState.LIVE)
        self.pump()

    def ack(self, upto: int) -> int:
        """Apply an ack; returns how many frames it released."""
        if self.window is None:
            return 0
        released = self.window.ack(upto)
        if released:
            self.pump()
        return released

    def set_writable(self, writable: bool) -> None:
        """The transport's buffer went above (False) or back below (True) its mark."""
        self.writable = writable
        if writable:
            self.pump()

    def pump(self) -> None:
        """Move what the window and the transport allow from the queues to ``out``."""
        while self.writable and self._window_open():
            if self._backlog:
                seq, data = self._backlog.popleft()
                if seq > self.delivered_seq:
                    self._emit(seq, data)
                continue
            if self.state is not _LIVE or not self._live:
                return
            if self._gap is not None:
                self.out.append(self.encode_gap(*self._gap))
                self.gaps_total += 1
                self._gap = None
            # Every live frame the window lets out, at once (an ack frees hundreds).
            live = self._live
            window = self.window
            n = len(live) if window is None else min(len(live), window.room)
            taken = [live.popleft() for _ in range(n)]
            delivered = self.delivered_seq
            if taken[0][0] <= delivered:  # only after a backlog overlap; rare
                taken = [item for item in taken if item[0] > delivered]
                if not taken:
                    continue
            seqs = [item[0] for item in taken]
            if window is not None:
                window.send_many(seqs)
            self.out.extend([item[1] for item in taken])
            self.out_count += len(seqs)
            self.delivered_seq = seqs[-1]

    def take(self) -> list[bytes]:
        """What to write now (and forget it)."""
        out, self.out = self.out, []
        self.out_count = 0
        return out

    def close(self) -> None:
        """No more delivery."""
        if self.state is not ChannelState.CLOSED:
            self._to(ChannelState.CLOSED)
        self._live = self._backlog = None
        self.out = []
