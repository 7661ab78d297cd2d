"""Topic names and patterns (spec §6.1)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hearthnet.errors import BadRequest
from hearthnet.pubsub.topics import TopicPattern, pattern_covers, patterns_overlap, validate_topic

segments = st.text(alphabet="abcxyz09_-", min_size=1, max_size=4)
topics = st.lists(segments, min_size=1, max_size=6).map(".".join)


@pytest.mark.parametrize(
    ("pattern", "topic", "expected"),
    [
        ("chat.session.abc", "chat.session.abc", True),
        ("chat.session.*", "chat.session.abc", True),
        ("chat.session.*", "chat.session", False),
        ("chat.session.*", "chat.session.a.b", False),
        ("agent.**", "agent.bot1", True),
        ("agent.**", "agent.bot1.events", True),
        ("agent.**", "agent", False),
        ("**", "a", True),
        ("a.**.z", "a.b.c.z", True),
        ("a.**.z", "a.z", False),
        ("*.b", "a.b", True),
    ],
)
def test_pattern_examples(pattern: str, topic: str, expected: bool) -> None:
    """* matches exactly one segment, ** one or more."""
    assert expected == TopicPattern.parse(pattern).matches(topic)


@pytest.mark.parametrize(
    "bad",
    ["", ".", "a..b", "a.", "a b", "a.*", "ü", "a." * 16 + "a", "x" * 256, "a.b\n", "a\n"],
)
def test_invalid_topics_refused(bad: str) -> None:
    """Topics are 1..16 segments of [A-Za-z0-9_-], at most 255 bytes, no wildcards (and
    no trailing newline, which a `$` anchor would let through)."""
    with pytest.raises(BadRequest):
        validate_topic(bad)


@pytest.mark.parametrize("bad", ["a.b\n", "a.*\n", "**\n"])
def test_invalid_patterns_refused(bad: str) -> None:
    """Subscription patterns have the same segments, plus * and **."""
    with pytest.raises(BadRequest):
        TopicPattern.parse(bad)


def _regex(pattern: str) -> re.Pattern[str]:
    parts = []
    for seg in pattern.split("."):
        parts.append({"*": r"[^.]+", "**": r"[^.]+(?:\.[^.]+)*"}.get(seg, re.escape(seg)))
    return re.compile("^" + r"\.".join(parts) + "$")


@given(
    st.lists(segments | st.sampled_from(["*", "**"]), min_size=1, max_size=5).map(".".join), topics
)
def test_matching_agrees_with_a_regular_expression(pattern: str, topic: str) -> None:
    """The matcher agrees with an independent regex translation of the pattern."""
    assert bool(_regex(pattern).match(topic)) == TopicPattern.parse(pattern).matches(topic)


@given(
    st.lists(segments | st.sampled_from(["*", "**"]), min_size=1, max_size=4).map(".".join),
    st.lists(segments | st.sampled_from(["*", "**"]), min_size=1, max_size=4).map(".".join),
    topics,
)
def test_cover_and_overlap_agree_with_matching(outer: str, inner: str, topic: str) -> None:
    """If outer covers inner, any topic inner matches, outer matches; a topic both match
    means they overlap."""
    o, i = TopicPattern.parse(outer), TopicPattern.parse(inner)
    if pattern_covers(outer, inner) and i.matches(topic):
        assert o.matches(topic)
    if o.matches(topic) and i.matches(topic):
        assert patterns_overlap(outer, inner)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        ("node.*.inbox", "**", True),
        ("node.*.inbox", "chat.**", False),
        ("a.**", "*.b", True),
        ("a.*", "a.b.c", False),
        ("a.**.c", "a.b.**", True),
        ("x", "x", True),
        ("*", "**", True),
    ],
)
def test_overlap_examples(a: str, b: str, expected: bool) -> None:
    """Two patterns overlap when some topic matches both."""
    assert expected == patterns_overlap(a, b)
