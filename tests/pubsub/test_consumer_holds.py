"""What durable consumers hold from retention, pure: the n-th match by position over the
topics' indexes, and which messages a pass may delete (checked against the plain walk
over every message and every consumer that they replace)."""

from __future__ import annotations

import heapq
import itertools

from hypothesis import example, given, settings
from hypothesis import strategies as st

from hearthnet.pubsub.logcolumns import SeqColumns
from hearthnet.pubsub.logindex import NO_EXPIRY
from hearthnet.pubsub.logread import held_span
from hearthnet.pubsub.retention_plan import unheld
from hearthnet.pubsub.topics import TopicPattern


def split(seqs: list[int], owners: list[int], k: int) -> list[list[int]]:
    """``seqs`` (ascending, distinct) dealt out to ``k`` lists by ``owners``."""
    lists: list[list[int]] = [[] for _ in range(k)]
    for seq, owner in zip(seqs, itertools.cycle(owners or [0])):
        lists[owner % k].append(seq)
    return lists


@settings(max_examples=300)
@given(
    st.sets(st.integers(1, 150), max_size=120),
    st.lists(st.integers(0, 1000), min_size=1, max_size=50),
    st.integers(1, 80),
    st.integers(0, 150),
    st.integers(0, 150),
    st.one_of(st.integers(1, 3), st.integers(1, 130)),
)
def test_the_nth_value_is_found_by_position_as_a_merge_would_find_it(
    values: set[int], owners: list[int], k: int, after: int, upto: int, n: int
) -> None:
    """One list or many give the first and the ``n``-th that walking the merged
    window gives."""
    lists = split(sorted(values), owners, k)
    window = [v for v in heapq.merge(*lists) if after < v <= upto]
    nth = window[n - 1] if len(window) >= n else None
    assert (window[0] if window else None, nth) == held_span(lists, after, upto, n)


def test_the_nth_of_many_lists_and_of_none() -> None:
    """70 lists, 3 lists, none."""
    many = [[i, i + 70] for i in range(1, 71)]
    few = [[1, 5, 9], [2, 6], [30]]
    assert [(1, 72), (1, 1), (2, 2), (5, 9), (1, 30), (1, None), (None, None)] == [
        held_span(many, 0, 200, 72),
        held_span(few, 0, 100, 1),
        held_span(few, 1, 100, 1),
        held_span(few, 2, 100, 3),
        held_span(few, 0, 100, 6),
        held_span(few, 0, 100, 7),
        held_span([], 0, 100, 1),
    ]


def walk(
    above: list[tuple[int, str, int, int]],
    holds: list[tuple[int, int, tuple[str, ...]]],
    oldest_held: int,
    now: int,
) -> tuple[list[int], dict[int, tuple[int, int]]]:
    """Each message against each consumer, as retention did it before :func:`unheld`
    (and a message past its ttl neither held nor lost)."""

    def match(i: int, topic: str) -> bool:
        return any(TopicPattern.parse(p).matches(topic) for p in holds[i][2])

    delete, lost = [], dict[int, tuple[int, int]]()
    for seq, topic, ts, expires in above:
        if expires <= now:
            delete.append(seq)
            continue
        if any(
            c < seq <= lim and ts >= oldest_held and match(i, topic)
            for i, (c, lim, _) in enumerate(holds)
        ):
            continue
        for i, (cursor, _, _) in enumerate(holds):
            if seq > cursor and match(i, topic):
                lost[i] = (lost.get(i, (seq, seq))[0], seq)
        delete.append(seq)
    return delete, lost


TOPICS = ["a.x", "a.y", "b.x", "b.y.z"]
PATTERNS = [*TOPICS, "a.*", "*.x", "b.**", "**"]


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(st.sampled_from(TOPICS), st.integers(0, 6), st.sampled_from([5, 10, NO_EXPIRY])),
        max_size=60,
    ),
    st.lists(
        st.tuples(
            st.integers(0, 70),
            st.integers(0, 70),
            st.lists(st.sampled_from(PATTERNS), min_size=1, max_size=3, unique=True),
        ),
        max_size=8,
    ),
    st.integers(0, 6),
    st.sampled_from([5, 10]),
)
def test_a_pass_deletes_and_reports_lost_what_the_walk_over_every_consumer_did(
    messages: list[tuple[str, int, int]],
    consumers: list[tuple[int, int, list[str]]],
    oldest_held: int,
    now: int,
) -> None:
    """Literal and wildcard consumers, overlapping and empty held ranges, old messages,
    messages past their ttl: the same deletes and the same lost range per consumer."""
    above = [(seq, topic, ts, exp) for seq, (topic, ts, exp) in enumerate(messages, 1)]
    holds = [(cursor, cursor + span, tuple(ps)) for cursor, span, ps in consumers]
    assert walk(above, holds, oldest_held, now) == unheld(above, holds, oldest_held, now)


@settings(max_examples=300)
@given(
    st.lists(st.integers(0, 5), min_size=1, max_size=80),
    st.sets(st.integers(0, 5), min_size=1, max_size=4),
    st.sets(st.integers(1, 80), max_size=20),
    st.integers(0, 20),
    st.integers(0, 20),
    st.integers(30, 90),
    st.one_of(st.integers(1, 3), st.integers(1, 30)),
    st.integers(1, 9),
)
@example([0, 1] * 6, {0}, set(), 0, 0, 12, 4, 3)  # the 4th two chunks on, the first alone
@example([0, 1] * 6, {0}, {1, 5}, 0, 0, 10, 2, 5)  # tombstones among the matches
@example([0] * 10, {0}, set(), 0, 0, 5, 7, 4)  # fewer up to upto than after it
def test_the_columns_find_the_first_and_nth_of_some_topics_past_tombstones(
    topics: list[int],
    wanted: set[int],
    killed: set[int],
    cut: int,
    after: int,
    upto: int,
    n: int,
    chunk: int,
) -> None:
    """Seqs 1..k on topic numbers ``topics``, some deleted one by one and a prefix cut:
    :meth:`SeqColumns.span` and :meth:`SeqColumns.count_of` give what walking the held
    ones gives, in chunks of any size (the first and the ``n``-th found in different
    chunks)."""
    cols = SeqColumns()
    seqs = list(range(1, len(topics) + 1))
    cols.extend(seqs, [1000] * len(seqs), [None] * len(seqs), topics)
    for seq in killed:
        cols.kill(seq)
    cols.cut_prefix(cut)
    held = [
        s for s, t in zip(seqs, topics, strict=True) if s not in killed and s >= cut and t in wanted
    ]
    window = [s for s in held if after < s <= upto]
    mask = bytearray(t in wanted for t in range(6))
    expected = (window[0] if window else None, window[n - 1] if len(window) >= n else None)
    assert (expected, len(window)) == (
        cols.span(mask, after, upto, n, chunk),
        cols.count_of(mask, after, upto),
    )
