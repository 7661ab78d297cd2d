"""Token-bucket rate limits per caller (spec §2.5). Pure: callers pass the time."""

from __future__ import annotations

from collections import OrderedDict

from hearthnet.errors import RateLimited


class TokenBucket:
    """``rate`` tokens per second, holding at most ``burst``."""

    __slots__ = ("burst", "rate", "tokens", "updated")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.updated = now

    def take(self, now: float, amount: float = 1.0) -> float:
        """Take ``amount`` tokens; return 0 on success, else seconds until they exist."""
        elapsed = now - self.updated
        if elapsed > 0:
            self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
            self.updated = now
        if self.tokens >= amount:
            self.tokens -= amount
            return 0.0
        return (amount - self.tokens) / self.rate if self.rate > 0 else 3600.0


class RateLimiter:
    """One bucket per key, the least recently used keys forgotten past ``max_keys``.

    Forgetting a key refills its bucket, which errs towards serving a caller; the
    bound keeps memory flat when many identities come and go.
    """

    def __init__(self, rate: float, *, burst: float | None = None, max_keys: int = 100_000) -> None:
        self.rate = rate
        self.burst = burst if burst is not None else max(1.0, rate)
        self.max_keys = max_keys
        self._buckets: OrderedDict[object, TokenBucket] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def check(self, key: object, now: float, amount: float = 1.0) -> None:
        """Spend from ``key``'s budget.

        Raises:
            RateLimited: over budget; ``retry_after_ms`` says when it will fit.
        """
        buckets = self._buckets
        bucket = buckets.get(key)
        if bucket is not None:
            # The usual call, a known key with tokens left: TokenBucket.take inlined.
            buckets.move_to_end(key)
            elapsed = now - bucket.updated
            if elapsed > 0:
                tokens = bucket.tokens + elapsed * bucket.rate
                if tokens > bucket.burst:  # noqa: PLR1730 - min() costs ~0.2 µs more here
                    tokens = bucket.burst
                bucket.updated = now
            else:
                tokens = bucket.tokens
            if tokens >= amount:
                bucket.tokens = tokens - amount
                return
            bucket.tokens = tokens
        else:
            bucket = TokenBucket(self.rate, self.burst, now)
            buckets[key] = bucket
            if len(buckets) > self.max_keys:
                buckets.popitem(last=False)
        wait = bucket.take(now, amount)
        if wait > 0:
            raise RateLimited(
                "over the rate limit", retry_after_ms=max(1, int(wait * 1000 + 0.999))
            )
