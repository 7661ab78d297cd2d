"""Link heartbeats (spec §7.5): ping every 5 s, pong echoes, three misses mark a link down.
Pure: the glue sends what :meth:`HeartbeatTracker.tick` asks for and feeds pongs back."""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

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
        return statistics.median(self.rtts) if self.rtts else None

    @property
    def loss_pct(self) -> float:
        """Share of pings lost since the link came up."""
        return 100.0 * self.lost / self.sent if self.sent else 0.0


def pong_for(ping: dict[str, Any], wall_ms: int) -> dict[str, Any]:
    """The answer to a ping: ``pong {seq, ts_echo, ts}``."""
    return {"seq": ping.get("seq"), "ts_echo": ping.get("ts"), "ts": wall_ms}
