"""What one retention pass deletes (spec §6.3), worked out from the log's in-memory
indexes. Pure.

Retention mostly deletes the oldest messages: the caps on the whole log take the oldest
first, a topic's count limit takes that topic's oldest, ages take what is old. So a plan
is a **prefix**, every seq below :attr:`Plan.before_seq` (deleted as a range: see
:mod:`hearthnet.pubsub.logprune`), plus the messages **above** it that go as well (a
busy topic's oldest while an older message of a quiet topic stays; a ttl that ran out;
a message that came late with an old ``ts``), listed one by one. The prefix is the cap's
share of the oldest, extended for as long as each next message goes anyway; it never
reaches ``keep_from``, the first message a durable consumer may hold (those above it are
listed, for the pass to check against each consumer).

Which of the messages above the prefix a durable consumer holds is :func:`unheld`.

The work is bounded per pass (:data:`CAP_PAGE`, :data:`PREFIX_MAX`, :data:`ABOVE_MAX`,
:data:`SCAN_MAX`); :attr:`Plan.more` says a bound was reached and another pass should
follow at once. The scans over every message (ages, ttls) run at C speed (see
:meth:`~hearthnet.pubsub.logcolumns.SeqColumns.below`).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hearthnet.pubsub.logcolumns import DEAD
from hearthnet.pubsub.logindex import LogIndex
from hearthnet.pubsub.retention import RetentionPolicy
from hearthnet.pubsub.sequencer import TopicStats
from hearthnet.pubsub.topics import TopicPattern

CAP_PAGE = 50_000  # messages over pubsub.max_messages / max_bytes deleted per pass
PREFIX_MAX = 200_000  # index positions a pass deletes as a prefix at most
ABOVE_MAX = 20_000  # messages above the prefix a pass deletes at most
SCAN_MAX = 10_000  # messages one age or ttl scan finds per pass at most
NOTHING_HELD = 1 << 62  # keep_from when no durable consumer holds anything

Above = tuple[int, str, int, int]  # a message above the prefix: seq, topic, ts, expires_ms


@dataclass(slots=True)
class Plan:
    """One pass's deletes: every held seq below ``before_seq`` (0: none), and ``above``:
    ``(seq, topic, ts, expires_ms)`` of the messages above it, ascending (those a
    durable consumer holds still among them)."""

    before_seq: int = 0
    above: list[Above] = field(default_factory=list)
    over_caps: int = 0  # of the oldest, how many the caps on the whole log take
    more: bool = False  # a bound was reached: more would go


def plan(
    index: LogIndex,
    topics: Mapping[str, TopicStats],
    policy: RetentionPolicy,
    *,
    now: int,
    total_bytes: int,
    keep_from: int = NOTHING_HELD,
    scan: bool = True,
) -> Plan:
    """The deletes the rules let go at ``now``, below ``keep_from`` as a prefix; without
    ``scan``, by count and the caps only (ages and ttls need a look at every message)."""
    out = Plan()
    cols = index.cols
    bounds, ages = _per_topic(index, topics, policy)
    extra: set[int] = set()
    if scan:  # messages past their age or their own ttl, by position in the columns
        for age, topic_mask in ages.items():
            found = cols.below(cols.ts, now - int(age * 1000), SCAN_MAX, topic_mask)
            out.more |= len(found) == SCAN_MAX
            extra.update(found)
        found = cols.below(cols.expires, now + 1, SCAN_MAX)
        out.more |= len(found) == SCAN_MAX
        extra.update(found)
    # The caps on the whole log: the oldest ``over`` messages.
    held = len(cols)
    over = held - policy.max_log_messages
    over_bytes = total_bytes - policy.max_bytes
    if over_bytes > 0 and total_bytes > 0:
        over = max(over, -(-over_bytes * held // total_bytes))  # at the mean size
    if over > CAP_PAGE:
        over, out.more = CAP_PAGE, True
    out.over_caps = max(0, over)
    start = cols.after_live(over) if over > 0 else cols.base
    # The prefix: the caps' share, then on while each message goes anyway.
    seqs, ts, number_at = cols.seqs, cols.ts, cols.topic
    held_at = cols.position(keep_from)
    stop = min(held_at, cols.base + PREFIX_MAX)
    pos = min(start, stop)
    while pos < stop:
        if ts[pos] != DEAD and seqs[pos] >= bounds.get(number_at[pos], 0) and pos not in extra:
            break
        pos += 1
    out.more |= pos == stop < held_at
    if pos > cols.base:
        out.before_seq = seqs[pos] if pos < len(seqs) else seqs[-1] + 1
    if pos < len(seqs):
        out.more |= _above(out, index, pos, start=start, extra=extra, bounds=bounds)
    return out


def _per_topic(
    index: LogIndex, topics: Mapping[str, TopicStats], policy: RetentionPolicy
) -> tuple[dict[int, int], dict[float, bytearray]]:
    """By topic number: the count limit's bound (the topic's seqs below it go), and per
    age limit, which topic numbers it applies to (a mask)."""
    bounds: dict[int, int] = {}
    names, numbers = index.topic_names, index.topic_numbers
    default_age = policy.default[1]
    ages: dict[float, bytearray] = {default_age: bytearray(b"\x01") * len(names)}
    for topic, stats in topics.items():
        number = numbers.get(topic)
        if number is None:  # nothing of it held
            continue
        max_n, max_age = policy.limits_for(topic)
        if max_age != default_age:
            ages.setdefault(max_age, bytearray(len(names)))[number] = 1
            ages[default_age][number] = 0
        if stats.messages > max_n:
            seqs = index.by_topic.get(topic)
            if seqs is not None and len(seqs) > max_n:
                bounds[number] = seqs[-max_n]
    return bounds, ages


def _above(
    out: Plan, index: LogIndex, pos: int, *, start: int, extra: set[int], bounds: dict[int, int]
) -> bool:
    """Fill ``out.above`` from position ``pos`` on: what the caps still take (up to
    ``start``), each topic's oldest past its count, what is too old or expired. True when
    :data:`ABOVE_MAX` left some out."""
    cols, names = index.cols, index.topic_names
    seqs, ts, expires, number_at = cols.seqs, cols.ts, cols.expires, cols.topic
    above: dict[int, tuple[str, int, int]] = {}
    for p in range(pos, min(start, pos + ABOVE_MAX)):
        if ts[p] != DEAD:
            above[seqs[p]] = (names[number_at[p]], ts[p], expires[p])
    for p in extra:
        if p >= pos:
            above[seqs[p]] = (names[number_at[p]], ts[p], expires[p])
    floor = seqs[pos]
    for number, bound in bounds.items():
        if bound > floor:
            topic = names[number]
            for seq in index.topic_range(topic, floor - 1, bound - 1)[:ABOVE_MAX]:
                at = cols.position(seq)
                above[seq] = (topic, ts[at], expires[at])
    out.above = [(seq, *above[seq]) for seq in sorted(above)[:ABOVE_MAX]]
    return len(above) > ABOVE_MAX or start - pos > ABOVE_MAX


def unheld(
    above: list[Above],
    holds: Sequence[tuple[int, int, Sequence[str]]],
    oldest_held: int,
    now: int,
) -> tuple[list[int], dict[int, tuple[int, int]]]:
    """Which of ``above`` (a plan's) no durable consumer holds, and what each consumer
    loses by that: ``holds[i]`` is a consumer's ``(cursor, limit, patterns)``, and it
    holds its matches in ``(cursor, limit]`` with ``ts >= oldest_held`` whose own ttl
    has not run out by ``now`` (spec §6.8: a message past its ttl is delivered to no
    one, so it is neither held nor lost). Returns the seqs to delete, ascending, and
    per consumer index the first and last deleted seq past its cursor that it lost.

    Worked out per topic, not per message and consumer: each topic of ``above`` is
    matched once against the consumers (literal patterns looked up, each set of
    wildcards tested once),
    their held ranges merged, and each message bisected into them."""
    by_topic: dict[str, list[tuple[int, int]]] = {}
    delete: list[int] = []
    for seq, topic, ts, expires in above:
        if expires <= now:
            delete.append(seq)
        else:
            by_topic.setdefault(topic, []).append((seq, ts))
    named: dict[str, list[int]] = {}
    wild: dict[tuple[str, ...], list[int]] = {}  # consumers by their set of wildcards
    for i, (_, _, patterns) in enumerate(holds):
        parsed = [TopicPattern.parse(p) for p in patterns]
        for p in parsed:
            if p.is_literal:
                named.setdefault(p.text, []).append(i)
        wildcards = tuple(p.text for p in parsed if not p.is_literal)
        if wildcards:
            wild.setdefault(wildcards, []).append(i)
    wild_parsed = [([TopicPattern.parse(p) for p in ps], who) for ps, who in wild.items()]
    lost: dict[int, tuple[int, int]] = {}
    for topic, messages in by_topic.items():
        holders = set(named.get(topic, ()))
        for ps, who in wild_parsed:
            if any(p.matches(topic) for p in ps):
                holders.update(who)
        starts, ends = _merged((holds[i][0] + 1, holds[i][1]) for i in holders)
        gone = [
            seq
            for seq, ts in messages
            if ts < oldest_held or (at := bisect_right(starts, seq) - 1) < 0 or seq > ends[at]
        ]
        for i in holders:
            past = bisect_right(gone, holds[i][0])
            if past < len(gone):
                first, last = gone[past], gone[-1]
                if i in lost:
                    first, last = min(first, lost[i][0]), max(last, lost[i][1])
                lost[i] = (first, last)
        delete.extend(gone)
    delete.sort()
    return delete, lost


def _merged(ranges: Iterable[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """Inclusive ranges ``(first, last)`` merged where they touch or overlap: their starts
    and ends, ascending (empty ranges, ``first > last``, left out)."""
    starts: list[int] = []
    ends: list[int] = []
    for first, last in sorted(r for r in ranges if r[0] <= r[1]):
        if ends and first <= ends[-1] + 1:
            ends[-1] = max(ends[-1], last)
        else:
            starts.append(first)
            ends.append(last)
    return starts, ends
