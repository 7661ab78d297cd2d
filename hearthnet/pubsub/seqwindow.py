"""A subscriber's flow window kept as runs of log positions (spec §3.6, §6.5). Pure.

Same contract as :class:`hearthnet.transport.flow.FlowWindow` for what a pub/sub channel
asks of it: at most ``size`` message frames unacknowledged; ``ack(upto)`` releases every
sent frame with ``seq <= upto``; an ack for an old seq, or for a seq not yet sent, is a
no-op. A session's seqs are log positions, strictly increasing but skipping the other
topics' messages, and fan-out sends them a committed batch at a time. ``FlowWindow``
keeps every unacknowledged seq in a list: one element appended per delivery and one
freed per acknowledged delivery (6–11 ns a delivery at 1→1,000 in one process; 3.6–4.4
here). A batch of consecutive seqs (one topic's commit: the common case) is one run (its
first and last seq), grown in place when the next batch follows on, so sending and
acknowledging cost per batch and per ack, not per frame; seqs with holes are kept as a
run with their list.
"""

from __future__ import annotations

import bisect


class _Run:
    """Sent, unacknowledged seqs from ``first`` to ``last``: all of them, or ``seqs``."""

    __slots__ = ("first", "last", "seqs")

    def __init__(self, first: int, last: int, seqs: list[int] | None) -> None:
        self.first = first
        self.last = last
        self.seqs = seqs  # None: every seq from first to last

    def __len__(self) -> int:
        return self.last - self.first + 1 if self.seqs is None else len(self.seqs)


class SeqWindow:
    """The sender's view of one subscriber's flow-controlled message frames."""

    __slots__ = ("_runs", "acked_upto", "in_flight", "last_seq", "size")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("a window holds at least one frame")
        self.size = size
        self.last_seq = 0
        self.acked_upto = 0
        self.in_flight = 0  # frames sent and not yet acknowledged
        self._runs: list[_Run] = []

    @property
    def open(self) -> bool:
        """True when one more frame may be sent."""
        return self.in_flight < self.size

    @property
    def room(self) -> int:
        """How many more frames may be sent now."""
        return self.size - self.in_flight

    def sent(self, seq: int) -> None:
        """Record that frame ``seq`` was sent.

        Raises:
            ValueError: the window is full or ``seq`` does not increase.
        """
        if self.in_flight >= self.size:
            raise ValueError("flow window is full")
        self.send_many([seq])

    def send_many(self, seqs: list[int]) -> int:
        """Record as many of increasing ``seqs`` as the window holds, from the first;
        returns how many (one call per subscriber per committed batch).

        Raises:
            ValueError: seqs that do not increase past the last one sent.
        """
        fit = self.size - self.in_flight
        if fit <= 0 or not seqs:
            return 0
        first = seqs[0]
        if first <= self.last_seq:
            raise ValueError(f"seq {first} does not increase past {self.last_seq}")
        n = len(seqs)
        if fit < n:
            seqs = seqs[:fit]
            n = fit
        last = seqs[-1]
        runs = self._runs
        if last - first + 1 == n:  # consecutive (strictly increasing: no other way)
            if runs:
                tail = runs[-1]
                if tail.seqs is None and tail.last + 1 == first:
                    tail.last = last  # follows on from the last run: grow it
                    self.in_flight += n
                    self.last_seq = last
                    return n
            runs.append(_Run(first, last, None))
        else:
            runs.append(_Run(first, last, list(seqs)))
        self.in_flight += n
        self.last_seq = last
        return n

    def ack(self, upto: int) -> int:
        """Apply ``ack{upto}``; return how many frames it released (0 for a no-op)."""
        if upto <= self.acked_upto or upto > self.last_seq:
            return 0
        self.acked_upto = upto
        runs = self._runs
        released = 0
        whole = 0
        for run in runs:
            if run.last > upto:
                break
            released += len(run)
            whole += 1
        if whole:
            del runs[:whole]
        if runs:
            run = runs[0]
            if run.first <= upto:  # the ack falls inside this run
                seqs = run.seqs
                if seqs is None:
                    released += upto - run.first + 1
                    run.first = upto + 1
                else:
                    cut = bisect.bisect_right(seqs, upto)
                    released += cut
                    del seqs[:cut]
                    run.first = seqs[0]
        self.in_flight -= released
        return released
