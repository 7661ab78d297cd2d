"""Gossip bookkeeping: held origin_seqs and anti-entropy planning (spec §7.3). Pure."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hearthnet.mesh.gossip import IWANT_SLICE, AntiEntropy, OriginTracker


def test_out_of_order_seqs_fold_into_the_head() -> None:
    """1, 2, 4, 5 then 3: the head moves to 5 once the hole is filled."""
    tracker = OriginTracker()
    for seq in (1, 2, 4, 5):
        tracker.add("o", seq)
    before = tracker.heads["o"]
    tracker.add("o", 3)
    assert (2, 5, {}) == (before, tracker.heads["o"], tracker.above)


def test_missing_slices_stop_before_what_is_held() -> None:
    """Behind a peer at 900 with 10..12 held above a hole, ask 4..9 first, in bounded slices."""
    tracker = OriginTracker()
    for seq in (1, 2, 3, 10, 11, 12):
        tracker.add("o", seq)
    fresh = OriginTracker()
    assert ((4, 9), (1, IWANT_SLICE), None) == (
        tracker.missing("o", 900),
        fresh.missing("o", 900),
        tracker.missing("o", 3),
    )


def test_skip_a_hole_nobody_holds() -> None:
    """When an ahead peer's lowest held seq is 500, stop asking for 4..499 (500 is next)."""
    tracker = OriginTracker()
    for seq in (1, 2, 3, 501):
        tracker.add("o", seq)
    tracker.skip_to("o", 500)
    skipped = (tracker.heads["o"], tracker.missing("o", 700))
    tracker.add("o", 500)
    assert ((499, (500, 500)), 501) == (skipped, tracker.heads["o"])


def test_one_request_per_origin_at_a_time() -> None:
    """Two peers ahead: ask the first; ask again only after the retry time or an answer."""
    anti = AntiEntropy(OriginTracker())
    first = anti.plan({"o": 10}, now=0.0)
    second = anti.plan({"o": 10}, now=1.0)
    later = anti.plan({"o": 10}, now=6.0)
    anti.answered("o")
    again = anti.plan({"o": 10}, now=6.1)
    assert ({"o": [1, 10]}, {}, {"o": [1, 10]}, {"o": [1, 10]}) == (first, second, later, again)


@given(st.permutations(list(range(1, 60))))
def test_any_arrival_order_ends_with_the_full_head(order: list[int]) -> None:
    """Whatever order 1..59 arrive in, the head ends at 59 with nothing left above."""
    tracker = OriginTracker()
    for seq in order:
        tracker.add("o", seq)
    assert (59, {}, 0) == (tracker.heads["o"], tracker.above, tracker.above_count)
