"""The log's sequencer, pure (spec §6.3): dense seqs, dedupe by id, topic stats, restarts."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hearthnet.pubsub.sequencer import Entry, Sequencer

# A step: a batch of (id, topic, local) items, whether its commit succeeds, and whether
# the node restarts after it.
ITEM = st.tuples(
    st.sampled_from("abcdefghij"), st.sampled_from(["t.1", "t.2", "t.3"]), st.booleans()
)
STEP = st.tuples(st.lists(ITEM, max_size=8), st.booleans(), st.booleans())


def run(steps: list[tuple[list[tuple[str, str, bool]], bool, bool]]) -> list[Entry]:
    """Drive a sequencer through the steps as the log does; returns every committed entry."""
    seq = Sequencer()
    committed: list[Entry] = []
    local = 0
    for items, commits, restart in steps:
        batch = []
        for drawn, topic, is_local in items:
            if is_local:
                local += 1
            # a local publish has a new id
            mid = f"L{seq.next_origin_seq()}" if is_local else drawn
            batch.append((mid, topic, is_local))
        numbers = seq.number([(mid, is_local) for mid, _, is_local in batch])
        if commits:
            entries = [
                Entry(n, mid, topic, 10, n)
                for n, (mid, topic, _) in zip(numbers, batch, strict=True)
                if n is not None
            ]
            seq.committed(entries)
            committed += entries
        if restart:
            seq = Sequencer.restore(seq.head_seq, seq.origin_seq, committed)
    assert local == seq.origin_seq
    return committed


@settings(max_examples=60, deadline=None)
@given(st.lists(STEP, max_size=12))
def test_seqs_are_dense_and_monotonic_and_ids_numbered_once(steps: list) -> None:  # type: ignore[type-arg]
    """Committed seqs are 1..N in commit order across failed commits and restarts, per
    topic strictly increasing, and no id is numbered twice."""
    committed = run(steps)
    seqs = [e.seq for e in committed]
    ids = [e.id for e in committed]
    per_topic = {
        t: [e.seq for e in committed if e.topic == t] for t in {e.topic for e in committed}
    }
    assert (list(range(1, len(seqs) + 1)), len(ids), per_topic) == (
        seqs,
        len(set(ids)),
        {t: sorted(set(s)) for t, s in per_topic.items()},
    )


@settings(max_examples=40, deadline=None)
@given(st.lists(STEP, max_size=12))
def test_topic_stats_count_what_is_held(steps: list) -> None:  # type: ignore[type-arg]
    """Topic stats count the entries held after forgetting some; a topic's head stays the
    last seq it was given."""
    committed = run(steps)
    seq = Sequencer.restore(len(committed), 0, committed)
    seq.forget(committed[::2])
    kept = committed[1::2]
    expected = {
        t: (sum(1 for e in kept if e.topic == t), max(e.seq for e in committed if e.topic == t))
        for t in {e.topic for e in kept}
    }
    assert (expected, 10 * len(kept)) == (
        {t: (s.messages, s.head_seq) for t, s in seq.topics.items()},
        seq.total_bytes,
    )


def test_a_duplicate_in_one_batch_takes_no_number() -> None:
    """A peer's message seen twice in one batch, or already held, and a publish refused
    before its commit take no seq."""
    seq = Sequencer()
    seq.committed([Entry(1, "x", "t", 1, 1)])
    assert [None, 2, None, None, 3] == seq.number(
        [("x", False), ("y", False), ("y", False), None, ("L1", True)]
    )
