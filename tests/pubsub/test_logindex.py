"""The log's in-memory indexes, pure: lookups by seq, topic and origin, deletes, holes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hearthnet.pubsub.floorruns import Removed
from hearthnet.pubsub.logindex import (
    NO_EXPIRY,
    TOPIC_NUMBERS_SPARE,
    Head,
    LogIndex,
    origin_start,
)


def head(seq: int, topic: str = "t.a", origin: str = "o1", oseq: int = 0) -> Head:
    """A header with ``ts`` = 1000 + seq and no expiry."""
    return Head(seq, f"id{seq}", topic, origin, oseq or seq, 1000 + seq, None, 10)


def test_rows_topics_and_origins_are_found_after_deletes_and_a_topic_coming_back() -> None:
    """Deleting every message of a topic drops it; a later commit to it is found again,
    and each seq maps to the row that holds it."""
    index = LogIndex()
    index.add_row(1, [head(1), head(2, "t.b"), head(3)])
    index.add_row(4, [head(4, "t.b"), head(5)])
    index.remove([head(1), head(3), head(5)], [])
    index.add_row(6, [head(6)])
    assert (
        [1, 1, 4, 6],
        {"t.a": [6], "t.b": [2, 4]},
        [2, 4, 6],
        [(2, "t.b", 1002, NO_EXPIRY), (4, "t.b", 1004, NO_EXPIRY), (6, "t.a", 1006, NO_EXPIRY)],
    ) == (
        [index.row_of(s) for s in (2, 3, 4, 7)],
        {t: list(s) for t, s in index.by_topic.items()},
        index.origin_range("o1", 1, 10),
        list(index.live()),
    )


def test_a_repaired_hole_is_inserted_in_origin_order() -> None:
    """A peer's message that fills a hole lands in its place: the contiguous head moves
    past it and the messages above the hole are listed until then."""
    index = LogIndex()
    index.add_row(1, [head(1, origin="p", oseq=1), head(2, origin="p", oseq=2)])
    index.add_row(3, [head(3, origin="p", oseq=5)])
    before = index.origin_heads()
    index.add_row(4, [head(4, origin="p", oseq=3), head(5, origin="p", oseq=4)])
    assert ([("p", 1, 2, [5], [])], [("p", 1, 5, [], [])], [1, 2, 4, 5, 3]) == (
        before,
        index.origin_heads(),
        index.origin_range("p", 1, 5),
    )


def test_deleting_half_compacts_and_keeps_every_lookup() -> None:
    """Past half tombstones the arrays are compacted; lookups give the same answers."""
    index = LogIndex()
    index.add_row(1, [head(s, "t.a" if s % 2 else "t.b") for s in range(1, 101)])
    index.remove([head(s, "t.a" if s % 2 else "t.b") for s in range(1, 61)], [])
    assert (40, [s for s in range(61, 101)], 1061, -1) == (
        len(index),
        [s for s, _, _, _ in index.live()],
        index.ts_of(61),
        index.ts_of(60),
    )


def test_topics_no_longer_held_are_forgotten_and_the_rest_numbered_afresh() -> None:
    """A topic per message, 5,000 of them, all but the last 10 cut: after the compaction
    the index keeps 10 topic numbers, not 5,000; a walk begun before the cut reads on with
    the old numbers (and without what the cut took), lookups and a topic seen again work,
    a scan by topic mask too."""
    n = TOPIC_NUMBERS_SPARE + 904
    index = LogIndex()
    index.add_row(1, [head(s, f"t.{s}") for s in range(1, n + 1)])
    walk = index.live(n - 12)
    before = next(walk)
    index.cut_prefix(n - 9, [])
    after_cut = [*walk]
    index.add_row(n + 1, [head(n + 1, "t.1"), head(n + 2, f"t.{n}")])
    mask = bytearray(t in ("t.1", f"t.{n}") for t in index.topic_names)
    assert (
        (n - 11, f"t.{n - 11}"),
        [(s, f"t.{s}") for s in range(n - 9, n + 1)],
        11,
        [(s, f"t.{s}") for s in range(n - 9, n + 1)] + [(n + 1, "t.1"), (n + 2, f"t.{n}")],
        [n, n + 2],
        (n, n + 2),
    ) == (
        before[:2],
        [(s, t) for s, t, _, _ in after_cut],
        len(index.topic_names),
        [(s, t) for s, t, _, _ in index.live()],
        list(index.topic_range(f"t.{n}", 0, n + 2)),
        index.cols.span(mask, 0, n + 2, 3),
    )


# A commit's row: (topic, origin, expires) of each message; origin_seq counts per origin,
# skipping one ahead when drawn (a hole), seq counts across rows.
ROW = st.lists(
    st.tuples(st.sampled_from(["t.a", "t.b"]), st.sampled_from(["o1", "o2"]), st.booleans()),
    min_size=1,
    max_size=6,
)


def _fill(
    index: LogIndex,
    rows: list[tuple[list[tuple[str, str, bool]], bool]],
    *,
    first_oseq: int,
    columns: bool = False,
) -> list[Head]:
    """Add the drawn ``rows`` to ``index`` (each origin's origin_seq counting on from
    ``first_oseq``); every message added, in seq order (seqs from 1)."""
    seq, oseqs = 0, {"o1": first_oseq, "o2": first_oseq}
    model: list[Head] = []
    for drawn, hole in rows:
        heads = []
        for topic, origin, expires in drawn:
            seq += 1
            oseqs[origin] += 2 if hole else 1
            heads.append(
                Head(
                    seq, f"id{seq}", topic, origin, oseqs[origin], 1000 + seq,
                    seq if expires else None, 5,
                )
            )  # fmt: skip
        if columns and heads:
            index.add_columns(heads[0].seq, list(zip(*heads, strict=True)))
        else:
            index.add_row(heads[0].seq, heads)
        model += heads
    return model


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(ROW, st.booleans()), max_size=8))
def test_rows_of_one_topic_and_origin_are_indexed_as_any_other(
    rows: list[tuple[list[tuple[str, str, bool]], bool]],
) -> None:
    """Rows added whole (one topic and origin in a row of consecutive origin_seq, or
    not) give the lookups of a plain model of every message."""
    index = LogIndex()
    model = _fill(index, rows, first_oseq=0)
    assert (
        [(h.seq, h.topic, h.ts, h.expires_ms or NO_EXPIRY) for h in model],
        {
            t: [h.seq for h in model if h.topic == t]
            for t in ("t.a", "t.b")
            if any(h.topic == t for h in model)
        },
        {o: [h.seq for h in model if h.origin == o] for o in ("o1", "o2")},
    ) == (
        list(index.live()),
        {t: list(s) for t, s in index.by_topic.items()},
        {o: index.origin_range(o, 0, 1 << 40) for o in ("o1", "o2")},
    )


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(ROW, st.booleans()), max_size=8))
def test_rows_added_as_columns_give_the_lookups_of_rows_added_whole(
    rows: list[tuple[list[tuple[str, str, bool]], bool]],
) -> None:
    """Rows added as their headers' columns (a lone message's, a run's) index as add_row does."""
    whole, by_columns = LogIndex(), LogIndex()
    _fill(whole, rows, first_oseq=0)
    _fill(by_columns, rows, first_oseq=0, columns=True)
    assert (
        list(whole.live()),
        list(whole.rows),
        {t: list(s) for t, s in whole.by_topic.items()},
        {o: whole.origin_range(o, 0, 1 << 40) for o in ("o1", "o2")},
    ) == (
        list(by_columns.live()),
        list(by_columns.rows),
        {t: list(s) for t, s in by_columns.by_topic.items()},
        {o: by_columns.origin_range(o, 0, 1 << 40) for o in ("o1", "o2")},
    )


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(ROW, st.booleans()), min_size=1, max_size=8),
    st.integers(0, 60),
    st.sets(st.integers(1, 60), max_size=10),
    st.booleans(),
)
def test_a_cut_prefix_and_scattered_deletes_give_the_lookups_of_a_model(
    rows: list[tuple[list[tuple[str, str, bool]], bool]],
    before: int,
    scattered: set[int],
    late: bool,
) -> None:
    """Scattered deletes, then every seq below a bound cut at once (with a peer's message
    repaired into a hole first, when drawn), leave the lookups of a plain model."""
    index = LogIndex()
    model = _fill(index, rows, first_oseq=1)
    seq = len(model)
    if late:  # origin_seq 1 of o1 comes last: its seqs are no longer ascending
        seq += 1
        model.append(Head(seq, f"id{seq}", "t.a", "o1", 1, 1000 + seq, None, 5))
        index.add_row(seq, [model[-1]])
    index.remove([h for h in model if h.seq in scattered], [])
    model = [h for h in model if h.seq not in scattered]
    rows_below = [
        r for r in index.rows if r < before and all(h.seq < before for h in model if h.seq >= r)
    ]
    held = index.cut_prefix(before, rows_below[:-1])
    kept = [h for h in model if h.seq >= before]
    assert (
        len(model) - len(kept),
        len(kept),
        [(h.seq, h.topic, h.ts, h.expires_ms or NO_EXPIRY) for h in kept],
        {
            t: [h.seq for h in kept if h.topic == t]
            for t in ("t.a", "t.b")
            if any(h.topic == t for h in kept)
        },
        {
            o: [h.seq for h in sorted(kept, key=lambda h: h.origin_seq) if h.origin == o]
            for o in ("o1", "o2")
        },
        [h.ts for h in kept],
    ) == (
        held,
        len(index),
        list(index.live()),
        {t: list(s) for t, s in index.by_topic.items()},
        {o: index.origin_range(o, 0, 1 << 40) for o in ("o1", "o2")},
        [index.ts_of(h.seq) for h in kept],
    )


def test_scans_find_old_and_expired_positions_of_the_topics_asked() -> None:
    """A scan by ts keeps to the topics marked; one by expiry finds ttls run out; neither
    finds what a prefix cut or a scattered delete removed."""
    index = LogIndex()
    index.add_row(1, [head(s, "t.a" if s % 2 else "t.b") for s in range(1, 11)])
    index.add_row(11, [Head(11, "id11", "t.b", "o1", 11, 1011, 1500, 10)])
    index.cut_prefix(3, [])
    index.remove([head(4, "t.b")], [])
    cols = index.cols
    only_a = bytearray(len(index.topic_names))
    only_a[index.topic_numbers["t.a"]] = 1
    assert ([3, 5, 7], [3, 5], [11], 8, 7) == (
        [cols.seqs[p] for p in cols.below(cols.ts, 1008, 100, only_a)],
        [cols.seqs[p] for p in cols.below(cols.ts, 1009, 2)],
        [cols.seqs[p] for p in cols.below(cols.expires, 1501, 100)],
        len(index),
        cols.seqs[cols.after_live(3)],
    )


def test_origin_start_counts_retention_not_the_lowest_held() -> None:
    """A hole below what is held is a hole unless retention removed it: 2..5 held and
    nothing removed start at head 0 with 2..5 above, floor 1; 1..3 removed and 4..5 held
    start at floor 4, head 5; everything removed starts past it; a message held below
    what retention removed keeps the floor down."""
    assert [
        (1, 0, [2, 3, 4, 5], []),
        (4, 5, [], []),
        (8, 7, [], []),
        (1, 5, [7], []),
        (1, 1, [3], []),
    ] == [
        origin_start([2, 3, 4, 5], Removed(0), 100),
        origin_start([4, 5], Removed(3), 100),
        origin_start([], Removed(7), 100),
        origin_start([1, 4, 5, 7], Removed(3), 100),
        origin_start([1, 3], Removed(0), 100),
    ]


def test_origin_start_does_not_rise_over_a_hole_retention_removed_around() -> None:
    """5 never came and retention removed 1..8 around it: floor 5, head 4, 9..10 above,
    6..8 a removed run above the head (not floor 9 head 10); a hole filled since is held;
    a run up to the bound counts the seqs still held in it (6 of 6..7)."""
    assert [(5, 4, [9, 10], [(6, 8)]), (5, 10, [], []), (1, 4, [8], [(6, 7)])] == [
        origin_start([9, 10], Removed(8, ((5, 5),)), 100),
        origin_start([5, 9, 10], Removed(8, ((5, 5),)), 100),
        origin_start([1, 2, 3, 4, 6, 8], Removed(7, ((5, 5),)), 100),
    ]


def test_origin_heads_include_what_retention_removed_whole() -> None:
    """An origin retention removed whole still starts past what it removed."""
    index = LogIndex()
    index.add_row(1, [head(1, origin="p", oseq=2)])
    index.removed = {"q": Removed(9)}
    assert [("p", 1, 0, [2], []), ("q", 10, 9, [], [])] == index.origin_heads()
