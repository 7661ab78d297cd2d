"""Link heartbeats (spec §7.5): ping every 5 s, pong echoes, three misses mark a link down.
Pure: the glue feeds :class:`Heartbeats` the time and the ping/pong frames, and carries out
the actions it returns (pings to send, heartbeat records, links to close)."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hearthnet.mesh.actions import CloseLink, Record, Send
from hearthnet.mesh.frames import Ping, Pong

MISSES_DOWN = 3
RTT_WINDOW = 64


@dataclass(frozen=True, slots=True)
class Observation:
    """Something worth a heartbeat record: a pong (with RTT and clock offset) or a miss."""

    kind: str  # "pong" | "miss"
    seq: int
    rtt_ms: float | None = None
    clock_offset_ms: float | None = None


@dataclass
class HeartbeatTracker:
    """Pings and pongs of one link."""

    interval_s: float
    next_ping: float = 0.0
    seq: int = 0
    outstanding: dict[int, tuple[float, int]] = field(
        default_factory=dict
    )  # seq -> (mono, wall ms)
    missed: int = 0
    rtts: deque[float] = field(default_factory=lambda: deque(maxlen=RTT_WINDOW))
    sent: int = 0
    lost: int = 0

    def tick(self, now: float, wall_ms: int) -> tuple[dict[str, Any] | None, list[Observation]]:
        """At ``now`` (monotonic s): the ping to send (or None) and any misses observed."""
        observations: list[Observation] = []
        for seq, (sent_at, _) in list(self.outstanding.items()):
            if now - sent_at >= self.interval_s:
                del self.outstanding[seq]
                self.missed += 1
                self.lost += 1
                observations.append(Observation("miss", seq))
        if now < self.next_ping:
            return None, observations
        self.seq += 1
        self.sent += 1
        self.outstanding[self.seq] = (now, wall_ms)
        self.next_ping = now + self.interval_s
        return {"seq": self.seq, "ts": wall_ms}, observations

    def pong(
        self, seq: object, ts_echo: object, peer_ts: object, now: float, wall_ms: int
    ) -> Observation | None:
        """A pong arrived; returns its observation (None for an unknown or late seq)."""
        if not isinstance(seq, int) or seq not in self.outstanding:
            return None
        sent_at, sent_wall = self.outstanding.pop(seq)
        rtt_ms = (now - sent_at) * 1000
        self.rtts.append(rtt_ms)
        self.missed = 0
        offset = None
        if isinstance(peer_ts, int | float) and ts_echo == sent_wall:
            # NTP-style: the peer's clock minus the midpoint of our send/receive times
            offset = float(peer_ts) - (sent_wall + wall_ms) / 2
        return Observation(
            "pong", seq, round(rtt_ms, 3), round(offset, 1) if offset is not None else None
        )

    @property
    def down(self) -> bool:
        """Three pings in a row went unanswered."""
        return self.missed >= MISSES_DOWN

    @property
    def rtt_p50_ms(self) -> float | None:
        """Median recent RTT."""
        import statistics  # noqa: PLC0415 - only with peer links (spec §11: idle RSS)

        return statistics.median(self.rtts) if self.rtts else None

    @property
    def loss_pct(self) -> float:
        """Share of pings lost since the link came up."""
        return 100.0 * self.lost / self.sent if self.sent else 0.0


def pong_for(ping: dict[str, Any], wall_ms: int) -> dict[str, Any]:
    """The answer to a ping: ``pong {seq, ts_echo, ts}``."""
    return {"seq": ping.get("seq"), "ts_echo": ping.get("ts"), "ts": wall_ms}


class Heartbeats:
    """The heartbeats of every link of this node.

    Args:
        interval_s: seconds between pings on a link (``--heartbeat-s``).
    """

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._links: dict[str, HeartbeatTracker] = {}

    def up(self, node: str) -> None:
        """A link to ``node`` came up: its heartbeats start afresh (the first ping at once)."""
        self._links[node] = HeartbeatTracker(self.interval_s)

    def down(self, node: str) -> None:
        """The link to ``node`` went down."""
        self._links.pop(node, None)

    def get(self, node: str) -> HeartbeatTracker | None:
        """The tracker of the link to ``node``, if it is up."""
        return self._links.get(node)

    def items(self) -> Iterator[tuple[str, HeartbeatTracker]]:
        """Each linked node and its tracker."""
        return iter(list(self._links.items()))

    def tick(self, now: float, wall_ms: int) -> list[Send | Record | CloseLink]:
        """At ``now`` (monotonic s): the pings due, the misses to record, and the links with
        three pongs missed in a row (to close; spec §7.5)."""
        actions: list[Send | Record | CloseLink] = []
        for node, tracker in list(self._links.items()):
            ping, misses = tracker.tick(now, wall_ms)
            actions.extend(Record(node, miss, wall_ms) for miss in misses)
            if tracker.down:
                actions.append(CloseLink(node, "three pongs missed"))
            elif ping is not None:
                actions.append(Send(node, Ping(ping["seq"], ping["ts"])))
        return actions

    @staticmethod
    def receive_ping(frame: Ping, wall_ms: int) -> Pong:
        """The pong that answers ``frame``."""
        return Pong(frame.seq, frame.ts, wall_ms)

    def receive_pong(self, node: str, frame: Pong, now: float, wall_ms: int) -> Record | None:
        """A pong from ``node``: the observation to record (None for an unknown or late
        seq, or a link that is gone)."""
        tracker = self._links.get(node)
        if tracker is None:
            return None
        observation = tracker.pong(frame.seq, frame.ts_echo, frame.ts, now, wall_ms)
        return Record(node, observation, wall_ms) if observation is not None else None
