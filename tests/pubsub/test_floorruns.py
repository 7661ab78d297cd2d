"""What retention removed of an origin as a bound and the holes below it (spec §7.3). Pure."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hearthnet.pubsub.floorruns import (
    MAX_HOLES,
    Removed,
    after_removal,
    after_skip,
    gaps,
    start,
    without,
)


def test_gaps_are_the_runs_not_held() -> None:
    """Runs of a range missing from what is held, the ends included; none when all is."""
    held = [1, 2, 3, 6, 7, 9, 20]
    assert [[(4, 5), (8, 8), (10, 12)], [], [(1, 3)], [(4, 5)]] == [
        gaps(held, 1, 12),
        gaps(held, 1, 3),
        gaps([], 1, 3),
        gaps(held, 2, 12, limit=0),  # at most limit + 1
    ]


def test_without_splits_runs_around_seqs() -> None:
    assert [(1, 1), (3, 4), (8, 9)] == without([(1, 5), (7, 9)], [2, 5, 7])


def test_a_removal_around_a_hole_keeps_the_hole() -> None:
    """5 never came; retention removes 1..8 of 1..4, 6..10: bound 8, hole 5. Then 5 came
    (repair) and is removed too: the hole is gone. A skip on a peer's floor 12 clears
    the holes below it."""
    held = [1, 2, 3, 4, 6, 7, 8, 9, 10]
    first = after_removal(Removed(0), [1, 2, 3, 4, 6, 7, 8], held)
    filled = after_removal(first, [5], [5, 9, 10])
    assert [Removed(8, ((5, 5),)), Removed(8), Removed(11)] == [
        first,
        filled,
        after_skip(first, 11),
    ]


def test_a_removal_below_the_bound_moves_nothing_but_a_filled_hole() -> None:
    """Removing 3 under bound 8 (hole 5..6) changes nothing; removing 6, a hole filled
    since, shrinks the hole to 5."""
    was = Removed(8, ((5, 6),))
    assert [was, Removed(8, ((5, 5),))] == [
        after_removal(was, [3], [3, 9]),
        after_removal(was, [6], [6, 9]),
    ]


def test_past_the_cap_the_bound_comes_down_below_the_first_hole_not_kept() -> None:
    """Odd seqs 1..69 held, all removed: 34 holes (2, 4, .., 68); the first MAX_HOLES are
    kept and the bound is just below the next one (what was removed above it is asked
    for again, never counted as removed)."""
    held = list(range(1, 70, 2))
    got = after_removal(Removed(0), held, held)
    kept = tuple((s, s) for s in range(2, 2 * MAX_HOLES + 1, 2))
    assert Removed(2 * MAX_HOLES + 1, kept) == got


def test_a_skip_keeps_holes_above_it() -> None:
    assert Removed(20, ((13, 15),)) == after_skip(Removed(20, ((4, 5), (12, 15))), 12)


@given(
    st.lists(
        st.tuples(st.booleans(), st.sets(st.integers(1, 40), max_size=12)),
        max_size=14,
    )
)
def test_the_start_counts_removed_exactly_what_came_and_was_removed(
    steps: list[tuple[bool, set[int]]],
) -> None:
    """Messages arrive and retention removes some, in any order: the start's floor is the
    lowest seq not removed, its head the end of the run from 1 of what ever came, and
    its removed runs and seqs above hold nothing that never came."""
    held: set[int] = set()
    came: set[int] = set()
    record = Removed(0)
    for arrive, seqs in steps:
        if arrive:
            held |= seqs
            came |= seqs
        else:
            gone = sorted(seqs & held)
            record = after_removal(record, gone, sorted(held))
            held -= set(gone)
    floor, head, above, done = start(sorted(held), record, 1_000)
    removed = came - held
    never = next(s for s in range(1, 42) if s not in came)
    in_runs = {s for a, b in done for s in range(a, b + 1)}
    assert (min(s for s in range(1, 42) if s not in removed), never - 1) == (floor, head)
    assert in_runs <= came
    assert set(above) <= held
    assert {s for s in held if s > head} <= in_runs | set(above)
