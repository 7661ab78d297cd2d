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


def test_record_one_counts_as_record() -> None:
    """record_one (a commit of one message) leaves what record of that one topic does,
    with the window and the topic bound alike."""
    rates, ones = TopicRates(window_s=10, max_topics=2), TopicRates(window_s=10, max_topics=2)
    for second in range(15):
        for topic in ("a", "b", "c")[second % 3 :]:
            rates.record([topic], 500.0 + second)
            ones.record_one(topic, 500.0 + second)
    assert rates._buckets == ones._buckets
    assert [ones.rate(t, 514.5) for t in ("a", "b", "c")] == [
        rates.rate(t, 514.5) for t in ("a", "b", "c")
    ]
    assert ones.rate("c", 514.5) > 0
