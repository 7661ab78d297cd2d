"""Retention plans from the indexes, pure: the prefix cut at once, what goes above it."""

from __future__ import annotations

from hearthnet.pubsub.logindex import Head, LogIndex
from hearthnet.pubsub.retention import RetentionPolicy, RetentionRule
from hearthnet.pubsub.retention_plan import Plan, plan
from hearthnet.pubsub.sequencer import Sequencer


def log_of(heads: list[Head]) -> tuple[LogIndex, Sequencer]:
    """Indexes and stats of one row holding ``heads``."""
    index, sequencer = LogIndex(), Sequencer()
    index.add_row(heads[0].seq, heads)
    sequencer.committed(heads)
    return index, sequencer


def brief(p: Plan) -> tuple[int, list[int], int]:
    """A plan's prefix bound, the seqs above it, and the caps' share."""
    return p.before_seq, [a[0] for a in p.above], p.over_caps


def test_the_prefix_stops_at_the_first_message_kept_and_the_rest_is_listed() -> None:
    """A quiet topic's one old message keeps a busy topic's count cut above the prefix;
    the message cap takes the oldest as a prefix, the count cut extends it; a durable
    consumer's first match stops it, what goes past that is listed."""
    heads = [Head(1, "id1", "q", "o", 1, 1001, None, 10)] + [
        Head(s, f"id{s}", "b", "o", s, 1000 + s, None, 10) for s in range(2, 12)
    ]
    index, sequencer = log_of(heads)
    counts = RetentionPolicy(max_messages=3)
    capped = RetentionPolicy(max_messages=3, max_log_messages=5)
    size = sequencer.total_bytes
    assert ((0, [*range(2, 9)], 0), (9, [], 6), (4, [4, 5, 6, 7, 8], 6)) == (
        brief(plan(index, sequencer.topics, counts, now=2000, total_bytes=size)),
        brief(plan(index, sequencer.topics, capped, now=2000, total_bytes=size)),
        brief(plan(index, sequencer.topics, capped, keep_from=4, now=2000, total_bytes=size)),
    )


def test_ages_ttls_and_bytes_pick_their_messages_and_a_pass_without_scans_skips_ages() -> None:
    """Each topic's own age applies, a ttl that ran out goes, the byte cap takes the
    oldest at the mean size (and the prefix goes on over the expired message after
    them); without a scan only counts and caps apply."""
    heads = [
        Head(1, "id1", "keep.a", "o", 1, 1000, None, 10),
        Head(2, "id2", "other", "o", 2, 1000, None, 10),
        Head(3, "id3", "keep.a", "o", 3, 5000, 6000, 10),
        Head(4, "id4", "other", "o", 4, 9000, None, 10),
    ]
    index, sequencer = log_of(heads)
    rules = RetentionPolicy([RetentionRule("keep.*", 100, 7)], max_age_s=3)
    by_bytes = RetentionPolicy(max_bytes=25)
    topics = sequencer.topics
    assert ((0, [2, 3], 0), (0, [], 0), (4, [], 2)) == (
        brief(plan(index, topics, rules, now=7000, total_bytes=40)),
        brief(plan(index, topics, rules, now=7000, total_bytes=40, scan=False)),
        brief(plan(index, topics, by_bytes, now=7000, total_bytes=40)),
    )
