"""Messages per second per topic (hearthnet.console.rates): pure, fake clock."""

from __future__ import annotations

from hearthnet.console.rates import TopicRates


def test_rate_over_the_window() -> None:
    """Arrivals in the last 10 s count; older ones fall out."""
    rates = TopicRates(window_s=10)
    for second in range(20):
        rates.record(["a.b"] * 3, 1000.0 + second)
    assert (3.0, 0.0, 1.5) == (
        rates.rate("a.b", 1019.5),
        rates.rate("a.c", 1019.5),
        rates.rate("a.b", 1024.0),
    )


def test_bounded_topics() -> None:
    """Past max_topics the least recently active topic is forgotten."""
    rates = TopicRates(max_topics=2)
    rates.record(["a"], 1.0)
    rates.record(["b"], 1.0)
    rates.record(["a"], 2.0)
    rates.record(["c"], 2.0)
    assert (0.2, 0.0, 0.1) == (rates.rate("a", 2.0), rates.rate("b", 2.0), rates.rate("c", 2.0))
