"""A flow window kept as runs of seqs answers as the per-seq window does (spec §3.6). Pure."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hearthnet.pubsub.seqwindow import SeqWindow
from hearthnet.transport.flow import FlowWindow

# One step: ("send", gaps before each seq of a batch) or ("ack", how far back from the
# last seq sent, or past it) or ("one", a gap before a single seq).
_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.lists(st.integers(0, 3), min_size=0, max_size=12)),
        st.tuples(st.just("ack"), st.integers(-3, 14)),
        st.tuples(st.just("one"), st.integers(0, 2)),
    ),
    max_size=60,
)


@settings(max_examples=120, deadline=None)
@given(size=st.integers(1, 16), steps=_STEPS)
def test_runs_answer_as_the_per_seq_window(size: int, steps: list[tuple[str, object]]) -> None:
    """Over mixed batches with and without holes, acks inside, between and past runs, the
    room, released counts and refusals are the per-seq window's."""
    runs, plain = SeqWindow(size), FlowWindow(size)
    seq = 0
    expected: list[object] = []
    actual: list[object] = []
    for kind, arg in steps:
        if kind == "send":
            assert isinstance(arg, list)
            seqs = []
            for hole in arg:
                seq += 1 + hole
                seqs.append(seq)
            expected.append(plain.send_many(seqs))
            actual.append(runs.send_many(seqs))
        elif kind == "ack":
            assert isinstance(arg, int)
            upto = plain.last_seq - arg
            expected.append(plain.ack(upto))
            actual.append(runs.ack(upto))
        else:
            assert isinstance(arg, int)
            nxt = plain.last_seq + 1 + arg
            if plain.open:
                plain.sent(nxt)
                runs.sent(nxt)
            seq = plain.last_seq
        expected.append((plain.room, plain.open, plain.in_flight, plain.last_seq))
        actual.append((runs.room, runs.open, runs.in_flight, runs.last_seq))
    assert expected == actual


def test_consecutive_batches_make_one_run_and_a_partial_ack_splits_it() -> None:
    """Two batches that follow on are one run; an ack inside it releases up to the ack."""
    window = SeqWindow(1024)
    window.send_many(list(range(1, 105)))
    window.send_many(list(range(105, 209)))
    released = window.ack(150)
    assert (1, 150, 58) == (len(window._runs), released, window.in_flight)


def test_a_full_window_and_old_seqs_are_refused() -> None:
    """A full window takes nothing; a seq at or below the last one sent is a sender's bug."""
    window = SeqWindow(2)
    window.send_many([5, 9])
    with pytest.raises(ValueError):
        window.sent(10)
    window.ack(9)
    with pytest.raises(ValueError):
        window.send_many([9])
    assert (0, 2) == (window.send_many([]), window.room)
