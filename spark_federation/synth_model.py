"""The simulated mesh behind :mod:`spark_federation.synth`: nodes, links, and link sessions.

A link is simulated the way spec §7.5 and §7.2 describe the node: each side pings
every ``heartbeat_ms``; a ping that falls in a *broken* interval (either end down,
the link cut by a partition or impaired by flapping, the relay of a relayed link
down) is a ``miss``; three misses in a row on either side close the link
(``link_down`` on both live sides); the link comes back at the first redial
attempt (backoff 0.5 s doubling to 30 s) that finds it whole, or when a restarted
end dials out right after it starts. Outside broken intervals a rare single
``miss`` stands for ordinary loss; two never follow each other, so ordinary loss
never closes a link. Every random choice comes from a generator seeded by the
link, so each end of a link replays the same history.
"""

from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field
from typing import Literal

from spark_federation.params import HEARTBEAT_MS, MISSES_TO_DOWN

Format = Literal["jsonl", "parquet"]
BeaconMode = Literal["all", "own", "none"]
VERSION = "0.3.0"
DEFAULT_START_MS = 1_763_798_400_000  # 2025-11-22T08:00:00Z, an hour boundary
BEACON_MS = 30_000  # spec §7.5

BACKOFF_MS = (500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000)  # spec §7.2
ORDINARY_LOSS = 0.002  # share of pings lost on a healthy link (single misses only)
KIND_PONG, KIND_MISS, KIND_UP, KIND_DOWN = "pong", "miss", "link_up", "link_down"


@dataclass(frozen=True, slots=True)
class Interval:
    """A half-open span of true time ``[start_ms, end_ms)``."""

    start_ms: int
    end_ms: int

    def holds(self, t_ms: float) -> bool:
        """Whether ``t_ms`` falls inside the span."""
        return self.start_ms <= t_ms < self.end_ms


class Timeline:
    """A sorted union of intervals with O(log n) membership tests."""

    def __init__(self, intervals: list[Interval]) -> None:
        merged: list[Interval] = []
        for iv in sorted(intervals, key=lambda i: i.start_ms):
            if iv.end_ms <= iv.start_ms:
                continue
            if merged and iv.start_ms <= merged[-1].end_ms:
                last = merged[-1]
                merged[-1] = Interval(last.start_ms, max(last.end_ms, iv.end_ms))
            else:
                merged.append(iv)
        self.intervals = merged
        self._starts = [iv.start_ms for iv in merged]

    def find(self, t_ms: float) -> Interval | None:
        """The interval holding ``t_ms``, if any."""
        i = bisect.bisect_right(self._starts, t_ms) - 1
        if i >= 0 and self.intervals[i].holds(t_ms):
            return self.intervals[i]
        return None


@dataclass(frozen=True, slots=True)
class SimNode:
    """One simulated node.

    Attributes:
        node_id: NodeID (``ed25519:`` + 43 base64url characters).
        name: display name, as in its beacons.
        clock_offset_ms: how far its clock is ahead of true time.
        relay_id: the relay a node behind NAT dials (None for directly reachable nodes).
        is_relay: whether other nodes use it as a relay.
    """

    node_id: str
    name: str
    clock_offset_ms: float
    relay_id: str | None = None
    is_relay: bool = False


@dataclass(frozen=True, slots=True)
class SimLink:
    """One undirected peer link; ``via`` is set for a link carried by a relay."""

    index: int
    a: str
    b: str
    base_rtt_ms: float
    via: str | None


@dataclass(slots=True)
class DirectionRecords:
    """Heartbeat observations of one side of a link, as parallel columns (true time)."""

    t: list[float] = field(default_factory=list)
    kind: list[str] = field(default_factory=list)
    seq: list[int | None] = field(default_factory=list)
    rtt: list[float | None] = field(default_factory=list)
    offset: list[float | None] = field(default_factory=list)

    def add(
        self, t: float, kind: str, seq: int | None, rtt: float | None, offset: float | None
    ) -> None:
        """Append one observation."""
        self.t.append(t)
        self.kind.append(kind)
        self.seq.append(seq)
        self.rtt.append(rtt)
        self.offset.append(offset)


@dataclass(slots=True)
class LinkHistory:
    """What a link simulation produced: each side's records and the spans it was up."""

    records: dict[str, DirectionRecords]
    up_spans: list[Interval]


def simulate_link(
    link: SimLink,
    nodes: dict[str, SimNode],
    broken: Timeline,
    outages: dict[str, Timeline],
    *,
    start_ms: int,
    end_ms: int,
    seed: int,
    heartbeat_ms: int = HEARTBEAT_MS,
) -> LinkHistory:
    """Replay one link from ``start_ms`` to ``end_ms``; see the module docstring for the rules."""
    rng = random.Random(seed * 1_000_003 + link.index)
    sides = (link.a, link.b)
    out = {n: DirectionRecords() for n in sides}
    up_spans: list[Interval] = []
    seqs = dict.fromkeys(sides, 0)
    restarts = sorted(
        iv.end_ms
        for n in (*sides, *([link.via] if link.via else []))
        for iv in outages[n].intervals
    )

    def node_up(n: str, t: float) -> bool:
        return outages[n].find(t) is None

    t_up: float = start_ms + rng.uniform(100.0, 900.0)
    for n in sides:
        out[n].add(t_up + rng.uniform(0.0, 40.0), KIND_UP, None, None, None)
    while t_up < end_ms:
        next_ping = {n: t_up + rng.uniform(500.0, float(heartbeat_ms)) for n in sides}
        misses = dict.fromkeys(sides, 0)
        lost_last = dict.fromkeys(sides, False)
        t_down: float | None = None
        closer = sides[0]
        while t_down is None:
            n = min(sides, key=lambda s: next_ping[s])
            t = next_ping[n]
            if t >= end_ms:
                break
            next_ping[n] = t + heartbeat_ms
            if not node_up(n, t):
                continue  # a stopped node pings nobody and writes nothing
            peer = link.b if n == link.a else link.a
            seqs[n] += 1
            lost = broken.find(t) is not None
            ordinary = not lost and not lost_last[n] and rng.random() < ORDINARY_LOSS
            if lost or ordinary:
                out[n].add(t, KIND_MISS, seqs[n], None, None)
                misses[n] += 1
                lost_last[n] = True
                if misses[n] >= MISSES_TO_DOWN:
                    t_down, closer = t, n
            else:
                rtt = link.base_rtt_ms * math.exp(rng.gauss(0.0, 0.25))
                offset = (
                    nodes[peer].clock_offset_ms
                    - nodes[n].clock_offset_ms
                    + rng.gauss(0.0, 0.05 * rtt)
                )
                out[n].add(t + rtt, KIND_PONG, seqs[n], round(rtt, 3), round(offset, 3))
                misses[n] = 0
                lost_last[n] = False
        if t_down is None:
            up_spans.append(Interval(int(t_up), end_ms))
            break
        up_spans.append(Interval(int(t_up), int(t_down)))
        for n in sides:
            if node_up(n, t_down):
                out[n].add(
                    t_down + (0.0 if n == closer else rng.uniform(1.0, 50.0)),
                    KIND_DOWN,
                    None,
                    None,
                    None,
                )
        t_up = _redial(t_down, broken, restarts, rng)
        if t_up >= end_ms:
            break
        for n in sides:
            out[n].add(t_up + rng.uniform(0.0, 40.0), KIND_UP, None, None, None)
    return LinkHistory(out, up_spans)


def _redial(t_down: float, broken: Timeline, restarts: list[int], rng: random.Random) -> float:
    """When a closed link is whole again: the first redial attempt or restart dial that works."""
    candidates: list[float] = []
    t = t_down
    for step in range(10_000):  # bounded: 30 s steps cover ~80 hours of outage
        t += BACKOFF_MS[min(step, len(BACKOFF_MS) - 1)] * rng.uniform(0.9, 1.1)
        if broken.find(t) is None:
            candidates.append(t)
            break
    i = bisect.bisect_right(restarts, t_down)
    for r in restarts[i:]:
        dial = r + rng.uniform(200.0, 1_500.0)
        if broken.find(dial) is None:
            candidates.append(dial)
            break
    return min(candidates) if candidates else math.inf


@dataclass(frozen=True, slots=True)
class InjectedEvent:
    """One thing the generator made happen, in true time.

    Attributes:
        kind: ``node_down``, ``partition``, ``flapping_link``, ``relay_only`` or ``clock_skew``.
        nodes: the nodes involved (for a link: its two ends, sorted).
        start_ms: when it began (None for standing conditions such as relay_only).
        end_ms: when it ended as the mesh saw it (restart, first link back).
        groups: for a partition, the node groups that lost sight of each other.
        value: clock offset in ms for clock_skew, down→up cycles for flapping_link.
    """

    kind: str
    nodes: tuple[str, ...]
    start_ms: int | None = None
    end_ms: int | None = None
    groups: tuple[tuple[str, ...], ...] = ()
    value: float | None = None


@dataclass(frozen=True, slots=True)
class SynthConfig:
    """What to generate; every default gives a small community with one event of each kind."""

    nodes: int = 5
    hours: float = 2.0
    seed: int = 0
    start_ms: int = DEFAULT_START_MS
    heartbeat_ms: int = HEARTBEAT_MS
    partitions: tuple[tuple[int, int], ...] | None = None  # (offset_ms, duration_ms)
    down: int = 1
    flapping: int = 1
    relay_only: int = 1
    skewed: int = 1
    duplicates: int = 0
    malformed: int = 0
    fmt: Format = "jsonl"
    beacons: BeaconMode = "all"
    traces: bool = True
    trace_interval_ms: int = 15_000


@dataclass(slots=True)
class Scenario:
    """A generated community: nodes, links, outages, link impairments and injected events."""

    nodes: dict[str, SimNode]
    order: list[str]
    links: list[SimLink]
    outages: dict[str, Timeline]
    link_breaks: dict[int, list[Interval]]
    events: list[InjectedEvent]
    partition_groups: list[tuple[int, int, set[str]]]
