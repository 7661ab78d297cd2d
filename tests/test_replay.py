"""The replay cache (spec §1.4) and token-bucket rate limits (spec §2.5)."""

from __future__ import annotations

import contextlib

import pytest

from hearthnet.errors import RateLimited, Replayed, Unavailable
from hearthnet.ratelimit import RateLimiter, TokenBucket
from hearthnet.replay import ReplayCache


def test_same_pair_within_window_is_replayed() -> None:
    """A (from, request_id) pair seen in the last 120 s is refused."""
    cache = ReplayCache(window_ms=120_000)
    cache.check_and_add("a", "r1", 1_000)
    with pytest.raises(Replayed):
        cache.check_and_add("a", "r1", 120_999)


def test_pair_forgotten_after_window() -> None:
    """After the window the pair is forgotten (the clock window refuses it anyway)."""
    cache = ReplayCache(window_ms=120_000)
    cache.check_and_add("a", "r1", 1_000)
    cache.check_and_add("a", "r1", 121_000)
    assert 1 == len(cache)


def test_different_senders_do_not_collide() -> None:
    """Request ids are per sender."""
    cache = ReplayCache()
    cache.check_and_add("a", "r1", 0)
    cache.check_and_add("b", "r1", 0)
    assert 2 == len(cache)


def test_full_cache_refuses_rather_than_forgets() -> None:
    """A cache full of live pairs answers unavailable with a retry hint; none is forgotten."""
    cache = ReplayCache(window_ms=1_000, max_entries=2)
    cache.check_and_add("a", "1", 0)
    cache.check_and_add("a", "2", 100)
    with pytest.raises(Unavailable) as info:
        cache.check_and_add("a", "3", 200)
    assert 800 == info.value.retry_after_ms
    cache.check_and_add("a", "3", 1_000)  # the first pair expired, making room


def test_rate_limiter_allows_burst_then_refuses_with_retry_after() -> None:
    """A bucket of 10/s lets 10 through at once, then says when the next fits."""
    limiter = RateLimiter(10)
    for _ in range(10):
        limiter.check("k", 0.0)
    with pytest.raises(RateLimited) as info:
        limiter.check("k", 0.0)
    assert 100 == info.value.retry_after_ms
    limiter.check("k", 0.1)


def test_rate_limiter_is_bounded() -> None:
    """Past max_keys the least recently used callers are forgotten."""
    limiter = RateLimiter(1, max_keys=3)
    for key in "abcde":
        limiter.check(key, 0.0)
    assert 3 == len(limiter)


def test_rate_limiter_spends_as_one_bucket_per_key() -> None:
    """Known keys, refills, the burst cap and refusals: each answer is what one
    TokenBucket per key gives for the same calls."""
    limiter = RateLimiter(4, burst=3)
    buckets: dict[str, TokenBucket] = {}
    calls = [("a", 0.0), ("b", 0.0), ("a", 0.0), ("a", 0.0), ("a", 0.0), ("a", 0.1)]
    calls += [("a", 0.3), ("b", 0.2), ("a", 0.3), ("a", 0.3), ("a", 9.0), ("a", 8.0)]
    calls += [("a", 9.0), ("a", 9.0), ("a", 9.0), ("b", 9.25)]
    expected: list[int] = []
    actual: list[int | None] = []
    for key, now in calls:
        bucket = buckets.setdefault(key, TokenBucket(4, 3, now))
        wait = bucket.take(now)
        expected.append(max(1, int(wait * 1000 + 0.999)) if wait > 0 else 0)
        try:
            limiter.check(key, now)
            actual.append(0)
        except RateLimited as exc:
            actual.append(exc.retry_after_ms)
    assert [0, 0, 0, 0, 250, 150, 0, 0, 200, 200, 0, 0, 0, 250, 250, 0] == expected
    assert expected == actual


def test_rate_limiter_forgets_the_least_recently_used_key() -> None:
    """A key used again is kept past max_keys (its bucket still spent); the one unused
    longest is forgotten, and so refilled."""
    limiter = RateLimiter(1, max_keys=3)
    for key in "abca":
        with contextlib.suppress(RateLimited):
            limiter.check(key, 0.0)
    limiter.check("d", 0.0)  # forgets b
    limiter.check("b", 0.0)  # a fresh bucket; forgets c
    with pytest.raises(RateLimited):
        limiter.check("a", 0.0)
    assert 3 == len(limiter)
