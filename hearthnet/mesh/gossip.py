"""Gossip bookkeeping (spec §7.3): what each origin's messages this node holds, and what to
ask a peer for. Pure.

Every origin numbers its messages 1, 2, 3, ... (``origin_seq``). A node's *head* for an
origin is the highest ``origin_seq`` up to which it holds everything from the lowest it
ever held (older messages removed by retention do not count as missing). Anti-entropy
exchanges heads every 5 s per link (``ihave``); a node behind asks (``iwant``) for the
range it lacks, in bounded slices, and does not ask two peers for the same range at once.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_ABOVE = 100_000  # out-of-order origin_seqs remembered above the heads, in all
IWANT_SLICE = 500  # messages asked for per origin per round
IWANT_RETRY_S = 5.0


@dataclass
class OriginTracker:
    """Held ``origin_seq`` values per origin: a contiguous head and a bounded set above it."""

    heads: dict[str, int] = field(default_factory=dict)
    above: dict[str, set[int]] = field(default_factory=dict)
    floors: dict[str, int] = field(default_factory=dict)  # the lowest seq ever held
    above_count: int = 0

    def load(self, origin: str, head: int, floor: int, above: list[int] | None = None) -> None:
        """Initialise one origin from the log (at start)."""
        self.heads[origin] = head
        self.floors[origin] = floor
        for seq in above or ():
            self.add(origin, seq)

    def add(self, origin: str, seq: int) -> None:
        """Record that ``(origin, seq)`` is held. A new origin starts at head 0, so a new or
        long-offline node backfills all the history its peers still hold."""
        head = self.heads.get(origin, 0)
        self.floors.setdefault(origin, seq)
        if seq <= head:
            return
        if seq > head + 1:
            bucket = self.above.setdefault(origin, set())
            if seq not in bucket and self.above_count < MAX_ABOVE:
                bucket.add(seq)
                self.above_count += 1
            return
        self.heads[origin] = self._advance(origin, seq)

    def _advance(self, origin: str, head: int) -> int:
        """Fold the seqs held just above ``head`` into it."""
        bucket = self.above.get(origin)
        while bucket and head + 1 in bucket:
            head += 1
            bucket.discard(head)
            self.above_count -= 1
        if bucket is not None and not bucket:
            del self.above[origin]
        return head

    def skip_to(self, origin: str, lowest_available: int) -> None:
        """A peer that is ahead holds nothing below ``lowest_available``: stop asking for the
        hole below it (retention removed those messages from the mesh)."""
        head = self.heads.get(origin, 0)
        if lowest_available > head + 1:
            bucket = self.above.get(origin)
            if bucket:
                dropped = {s for s in bucket if s < lowest_available}
                bucket -= dropped
                self.above_count -= len(dropped)
            self.heads[origin] = self._advance(origin, lowest_available - 1)

    def missing(self, origin: str, peer_head: int) -> tuple[int, int] | None:
        """The next slice ``(from, to)`` to ask for, when a peer's head is ahead of ours."""
        head = self.heads.get(origin, 0)
        if peer_head <= head:
            return None
        start = head + 1
        end = min(peer_head, start + IWANT_SLICE - 1)
        above = self.above.get(origin)
        if above:
            held = [s for s in above if start <= s <= end]
            if held:
                end = min(held) - 1  # stop the slice before what we already hold
        return (start, end) if end >= start else None


@dataclass
class AntiEntropy:
    """Decides what to ask which peer for, without asking twice at once."""

    tracker: OriginTracker
    requested: dict[str, tuple[int, float]] = field(default_factory=dict)  # origin -> (to, until)

    def plan(self, peer_heads: dict[str, int], now: float) -> dict[str, list[int]]:
        """From a peer's ``ihave`` heads, the ``iwant`` ranges to send: ``{origin: [from, to]}``."""
        wants: dict[str, list[int]] = {}
        for origin, peer_head in peer_heads.items():
            if not isinstance(origin, str) or not isinstance(peer_head, int):
                continue
            gap = self.tracker.missing(origin, peer_head)
            if gap is None:
                continue
            pending = self.requested.get(origin)
            if pending is not None and pending[1] > now and pending[0] >= gap[1]:
                continue  # asked someone already; wait for that answer
            self.requested[origin] = (gap[1], now + IWANT_RETRY_S)
            wants[origin] = [gap[0], gap[1]]
        return wants

    def answered(self, origin: str) -> None:
        """A reply for ``origin`` arrived: a later round may ask again at once."""
        self.requested.pop(origin, None)
