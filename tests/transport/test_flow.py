"""The seq/ACK window (spec §3.6), pure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hearthnet.transport.flow import FlowWindow


def test_window_of_16_stops_at_16() -> None:
    """Sixteen frames may be in flight; the seventeenth must wait."""
    window = FlowWindow(16)
    for _ in range(16):
        window.next_seq()
    assert (False, 16) == (window.open, window.in_flight)
    with pytest.raises(ValueError):
        window.next_seq()


def test_ack_for_8_releases_exactly_8() -> None:
    """ack{upto:8} on a full window of 16 frees exactly 8 places."""
    window = FlowWindow(16)
    for _ in range(16):
        window.next_seq()
    assert (8, 8) == (window.ack(8), window.in_flight)


@pytest.mark.parametrize("upto", [0, -3, 17, 100])
def test_old_or_unknown_acks_are_noops(upto: int) -> None:
    """Acks for seqs not yet sent, or already acked, change nothing."""
    window = FlowWindow(16)
    for _ in range(16):
        window.next_seq()
    window.ack(4)
    before = window.in_flight
    assert (0, before) == (window.ack(upto if upto != 0 else 4), window.in_flight)


def test_sparse_seqs_for_pubsub() -> None:
    """Pub/sub seqs are log positions with holes; acks release by position."""
    window = FlowWindow(3)
    for seq in (5, 9, 12):
        window.sent(seq)
    assert (2, 1, 0) == (window.ack(10), window.in_flight, window.ack(7))


def test_terminal_frame_may_pass_a_full_window() -> None:
    """force=True lets the final frame out even with the window full."""
    window = FlowWindow(1)
    window.next_seq()
    assert 2 == window.next_seq(force=True)


@given(st.lists(st.integers(min_value=-5, max_value=60), max_size=80))
def test_in_flight_never_exceeds_window(acks: list[int]) -> None:
    """Whatever acks arrive, a sender that respects `open` never has more than size in flight."""
    window = FlowWindow(16)
    for upto in acks:
        while window.open:
            window.next_seq()
        window.ack(upto)
        assert window.in_flight <= 16
        assert window.in_flight == window.last_seq - max(window.acked_upto, 0)


def test_send_many_records_what_fits_and_says_how_many() -> None:
    """send_many takes the front of the seqs up to the window's room, never past it."""
    window = FlowWindow(5)
    first = window.send_many([2, 4, 6])
    second = window.send_many([7, 9, 11, 13])
    third = window.send_many([14])
    window.ack(4)
    assert (3, 2, 0, 3, 9) == (first, second, third, window.in_flight, window.last_seq)
    with pytest.raises(ValueError):
        window.send_many([9])
