"""The subscription index: literal and wildcard matching, once per subscriber. Pure."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hearthnet.pubsub.index import SubscriptionIndex
from hearthnet.pubsub.topics import TopicPattern

P = TopicPattern.parse


def test_literal_and_wildcard_subscribers_each_once() -> None:
    """A session with two matching patterns appears once; removal is counted."""
    index: SubscriptionIndex[str] = SubscriptionIndex()
    index.add(P("chat.a"), "s1")
    index.add(P("chat.*"), "s1")
    index.add(P("chat.**"), "s2")
    index.add(P("other"), "s3")
    first = sorted(index.match("chat.a"))
    index.remove(P("chat.a"), "s1")
    second = sorted(index.match("chat.a"))
    index.remove(P("chat.*"), "s1")
    assert (["s1", "s2"], ["s1", "s2"], ["s2"], ["s3"]) == (
        first,
        second,
        list(index.match("chat.a")),
        list(index.match("other")),
    )


patterns = st.lists(st.sampled_from(["a", "b", "*", "**"]), min_size=1, max_size=3).map(".".join)
topics = st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3).map(".".join)


@given(st.lists(st.tuples(patterns, st.integers(0, 4)), max_size=12), st.lists(topics, max_size=6))
def test_index_agrees_with_brute_force(subs: list[tuple[str, int]], probe: list[str]) -> None:
    """The cached index returns exactly the subscribers a linear scan finds, for any topic."""
    index: SubscriptionIndex[int] = SubscriptionIndex()
    for pattern, sid in subs:
        index.add(P(pattern), sid)
    for topic in probe:
        expected = {sid for pattern, sid in subs if P(pattern).matches(topic)}
        assert expected == set(index.match(topic))
        assert len(set(index.match(topic))) == len(index.match(topic))
