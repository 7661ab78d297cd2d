"""A member's pacing of what it sends through each relay (spec §8 budgets). Pure.

A relay grants each attached member a data budget (``attached.bytes_per_s``, then
``budget {bytes_per_s, burst}`` whenever its fair share changes) and refuses, frame by
frame, whatever goes over it (``route_error rate_limited``). A refused frame leaves a gap
in the member's path sequence that waits ``retransmit_s`` for its resend, which the relay
may refuse again; sent far over the budget for long, the unacknowledged frames reach their
bound and the relayed link closes. So the member paces itself: one token bucket per relay
at the rate granted, holding half the burst the relay holds (the other half absorbs the
jitter between our clock and the frames' arrival there), and frames that find the bucket
empty wait in their peer's sequence (:class:`~hearthnet.mesh.pathseq.Outbound`) until
:meth:`Pacer.admit` lets them go: the path core names the moment the next one fits
(:meth:`Pacer.wait`, ``PathCore.paced.release_at``) and the glue releases them then, not on
its next tick. A refusal all the same (a budget that shrank before we
heard of it) empties the bucket for the ``retry_after_ms`` the relay named.

Only the path sequence's data is paced: heartbeats, acks, drains and session hellos are
``control`` frames, which the relay charges to a separate allowance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from hearthnet.mesh.frame_fields import Frame, int_field
from hearthnet.shapes import Shape

# What the relay charges beyond a peer frame's own bytes: the ``pframe`` and ``sealed``
# maps around it (keys, sequence numbers, epoch, MAC): 81 bytes with 9-byte numbers.
PACE_OVERHEAD_BYTES = 100
BURST_SHARE = 0.5  # of the relay's burst, the part our bucket holds
DEFAULT_BURST_S = 0.5  # the relay's burst, in seconds of its rate, until it says otherwise


@dataclass(frozen=True, slots=True)
class Budget(Frame):
    """Relay -> member: the data budget the relay holds it to now (its fair share, spec
    §8), ``bytes_per_s`` with a bucket of ``burst`` bytes; sent after ``attached`` and
    whenever the share changes, so the member paces itself instead of being refused
    (:class:`Pacer`). A member that does not know the kind ignores it."""

    KIND: ClassVar[str] = "budget"
    SHAPE: ClassVar[Shape] = Shape.of("budget frame", ("t", "bytes_per_s", "burst"))
    bytes_per_s: int
    burst: int

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Budget:
        """Parse a decoded frame (raises :class:`BadRequest`)."""
        cls.SHAPE.check(obj)
        return cls(int_field(obj, "budget", "bytes_per_s", 1), int_field(obj, "budget", "burst", 1))

    def serialize(self) -> dict[str, Any]:
        """The wire map."""
        return {"t": self.KIND, "bytes_per_s": self.bytes_per_s, "burst": self.burst}


@dataclass(slots=True)
class TokenBucket:
    """A strict token bucket: a frame goes when the bucket holds its size (one larger
    than the whole burst goes when the bucket is full, and leaves it in debt)."""

    rate: float
    burst: float
    tokens: float
    updated: float

    def _refill(self, now: float) -> None:
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
            self.updated = now

    def take(self, size: int, now: float) -> bool:
        """Take ``size`` tokens if the bucket holds them; False (nothing taken) if not."""
        self._refill(now)
        if self.tokens >= min(size, self.burst):
            self.tokens -= size
            return True
        return False

    def wait(self, size: int, now: float) -> float:
        """Seconds from ``now`` until :meth:`take` of ``size`` succeeds (0: it would now)."""
        self._refill(now)
        short = min(size, self.burst) - self.tokens
        return max(0.0, short / self.rate)

    def empty_for(self, seconds: float, now: float) -> None:
        """Nothing goes for ``seconds`` (a refusal's ``retry_after``)."""
        self._refill(now)
        self.tokens = min(self.tokens, -seconds * self.rate)


@dataclass(frozen=True, slots=True)
class PaceSnapshot:
    """The pacer's counters (``/metrics``)."""

    paced_bytes: int  # data bytes sent through paced relays (as the relays charge them)
    refusals: int  # rate_limited refusals that came all the same


@dataclass(slots=True)
class Pacer:
    """One token bucket per relay, at the rate that relay granted. A relay that granted
    nothing yet is not paced (nothing goes through it before ``attached`` anyway)."""

    buckets: dict[str, TokenBucket] = field(default_factory=dict)
    paced_bytes: int = 0
    refusals: int = 0

    def grant(self, relay: str, bytes_per_s: int, burst: int | None, now: float) -> None:
        """``relay`` grants ``bytes_per_s`` with a bucket of ``burst`` bytes (None: the
        relay's default of half a second's worth)."""
        relay_burst = burst if burst is not None else bytes_per_s * DEFAULT_BURST_S
        ours = max(1.0, relay_burst * BURST_SHARE)
        rate = float(max(1, bytes_per_s))
        b = self.buckets.get(relay)
        if b is None:
            self.buckets[relay] = TokenBucket(rate, ours, ours, now)
            return
        b._refill(now)
        b.rate, b.burst = rate, ours
        b.tokens = min(b.tokens, ours)

    def refused(self, relay: str, retry_after_ms: int | None, now: float) -> None:
        """The relay refused a data frame ``rate_limited``: wait as long as it asks."""
        self.refusals += 1
        b = self.buckets.get(relay)
        if b is not None:
            b.empty_for((retry_after_ms or 0) / 1000, now)

    def admit(self, relay: str, size: int, now: float) -> bool:
        """True when a data frame of ``size`` bytes may go through ``relay`` now."""
        b = self.buckets.get(relay)
        charged = size + PACE_OVERHEAD_BYTES
        if b is None:
            return True
        if not b.take(charged, now):
            return False
        self.paced_bytes += charged
        return True

    def wait(self, relay: str, size: int, now: float) -> float:
        """Seconds from ``now`` until :meth:`admit` of ``size`` bytes through ``relay``
        succeeds (the exact moment the frame fits, for the release timer)."""
        b = self.buckets.get(relay)
        return 0.0 if b is None else b.wait(size + PACE_OVERHEAD_BYTES, now)

    def forget(self, relay: str) -> None:
        """``relay`` is gone: a new attachment gets a new grant."""
        self.buckets.pop(relay, None)

    def snapshot(self) -> PaceSnapshot:
        """The counters now."""
        return PaceSnapshot(self.paced_bytes, self.refusals)
