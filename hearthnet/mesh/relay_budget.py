"""The relay's token bucket per member (spec §8 budgets; :mod:`hearthnet.mesh.relay_core`).
Pure."""

from __future__ import annotations


class FairBucket:
    """A token bucket that may go into debt: a frame is admitted while the bucket holds any
    tokens, and its whole size is taken, so frames larger than the burst still pass at the
    average rate."""

    __slots__ = ("burst_s", "rate", "tokens", "updated")

    def __init__(self, rate: float, burst_s: float, now: float) -> None:
        self.rate = rate
        self.burst_s = burst_s
        self.tokens = rate * burst_s
        self.updated = now

    def _refill(self, now: float) -> None:
        if now > self.updated:
            self.tokens = min(
                self.rate * self.burst_s, self.tokens + (now - self.updated) * self.rate
            )
            self.updated = now

    def set_rate(self, rate: float, now: float) -> None:
        """Change the rate from ``now`` on (what was earned before keeps the old rate)."""
        self._refill(now)
        self.rate = rate
        self.tokens = min(self.tokens, rate * self.burst_s)

    def admit_all(self, now: float, total: int, last: int) -> bool:
        """Take ``total`` for frames whose last has ``last`` bytes, when :meth:`admit` would
        admit every one of them in turn (a route batch's run, spec §11); else take nothing
        and return False (the caller admits them one by one)."""
        self._refill(now)
        if self.tokens - (total - last) <= 0:
            return False
        self.tokens -= total
        return True

    def admit(self, now: float, amount: int) -> float:
        """Take ``amount``; return 0 when admitted, else the seconds until it would be."""
        self._refill(now)
        if self.tokens <= 0:
            return -self.tokens / self.rate + 1e-3
        self.tokens -= amount
        return 0.0
