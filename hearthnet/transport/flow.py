"""Seq/ACK flow control (spec §3.6). Pure: no clock, no I/O.

The sender numbers frames with strictly increasing ``seq`` (1, 2, 3 on a bus stream;
log positions on a pub/sub session, which may skip numbers). At most ``size`` frames
may be unacknowledged. ``ack(upto)`` releases every sent frame with ``seq <= upto``;
an ack for an old seq, or for a seq not yet sent, is a no-op.
"""

from __future__ import annotations

import bisect


class FlowWindow:
    """The sender's view of one flow-controlled stream."""

    __slots__ = ("_unacked", "acked_upto", "last_seq", "size")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("a window holds at least one frame")
        self.size = size
        self.last_seq = 0
        self.acked_upto = 0
        # Strictly increasing, so an ack is a bisect; a list (not a deque) keeps an idle
        # window small.
        self._unacked: list[int] = []

    @property
    def in_flight(self) -> int:
        """Frames sent and not yet acknowledged."""
        return len(self._unacked)

    @property
    def open(self) -> bool:
        """True when one more frame may be sent."""
        return len(self._unacked) < self.size

    def sent(self, seq: int, *, force: bool = False) -> None:
        """Record that frame ``seq`` was sent; ``force`` lets a stream's final frame past
        a full window (a cancelled or timed-out stream must still say how it ended).

        Raises:
            ValueError: the window is full or ``seq`` does not increase (a bug in the sender).
        """
        if len(self._unacked) >= self.size and not force:
            raise ValueError("flow window is full")
        if seq <= self.last_seq:
            raise ValueError(f"seq {seq} does not increase past {self.last_seq}")
        self.last_seq = seq
        self._unacked.append(seq)

    def sent_many(self, seqs: list[int]) -> None:
        """Record increasing ``seqs`` sent at once (the caller checked the room).

        Raises:
            ValueError: more than the window holds, or seqs that do not increase.
        """
        if not seqs:
            return
        if len(self._unacked) + len(seqs) > self.size:
            raise ValueError("flow window is full")
        if seqs[0] <= self.last_seq:
            raise ValueError(f"seq {seqs[0]} does not increase past {self.last_seq}")
        self.last_seq = seqs[-1]
        self._unacked.extend(seqs)

    def send_many(self, seqs: list[int]) -> int:
        """Record as many of increasing ``seqs`` as the window holds, from the first;
        returns how many (the pub/sub fan-out path: one call, no property).

        Raises:
            ValueError: seqs that do not increase past the last one sent.
        """
        fit = self.size - len(self._unacked)
        if fit <= 0 or not seqs:
            return 0
        if seqs[0] <= self.last_seq:
            raise ValueError(f"seq {seqs[0]} does not increase past {self.last_seq}")
        if fit < len(seqs):
            seqs = seqs[:fit]
        self.last_seq = seqs[-1]
        self._unacked.extend(seqs)
        return len(seqs)

    @property
    def room(self) -> int:
        """How many more frames may be sent now."""
        return self.size - len(self._unacked)

    def next_seq(self, *, force: bool = False) -> int:
        """Number and record the next frame of a contiguous (bus) stream."""
        seq = self.last_seq + 1
        self.sent(seq, force=force)
        return seq

    def ack(self, upto: int) -> int:
        """Apply ``ack{upto}``; return how many frames it released (0 for a no-op)."""
        if upto <= self.acked_upto or upto > self.last_seq:
            return 0
        self.acked_upto = upto
        released = bisect.bisect_right(self._unacked, upto)
        del self._unacked[:released]
        return released
