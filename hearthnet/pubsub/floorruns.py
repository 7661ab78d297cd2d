"""What retention removed of one origin, as a bound and the holes below it (spec §7.3). Pure.

Per origin the log keeps ``removed`` and ``holes``: every ``origin_seq`` up to
``removed`` was held here (and then removed by retention, or is still held), or was
skipped on a peer's floor (retention removed it on the mesh), except the seqs in
``holes``: ascending, disjoint runs ``(first, last)`` below ``removed`` of seqs that
never came. A hole is found when retention removes seqs above it (the seqs between the
old bound and the highest removed that the log never held), and leaves the list when a
message that filled it later is removed too, or when gossip skips it on a peer's floor.

A log keeps at most :data:`MAX_HOLES` holes an origin. Past that, ``removed`` comes down
to just below the first hole it cannot keep: what retention removed above is forgotten,
which only costs asking the mesh for it again (never a seq counted as removed that was
not). The held seqs are taken for distinct (an origin numbers each message once): an
origin that numbered two alike can hide a hole of its own next to them.

:func:`start` turns an origin's bound, holes and held seqs into the gossip tracker's
start: its floor, head, the seqs held above the head and the removed runs above it.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from typing import NamedTuple

MAX_HOLES = 32  # holes kept per origin (see the module's docstring)

Run = tuple[int, int]  # first, last: inclusive


class Removed(NamedTuple):
    """One origin's record: the bound and the holes below it."""

    upto: int
    holes: tuple[Run, ...] = ()


class Start(NamedTuple):
    """An origin's gossip start (:func:`start`)."""

    floor: int
    head: int
    above: list[int]
    done: list[Run]  # runs removed by retention above the head, ascending


def run_end(held: Sequence[int], i: int) -> int:
    """The position of the last entry of the run of consecutive values starting at
    ``held[i]`` (``held`` ascending): by bisection, not a step a value."""
    base, lo, hi = held[i], i, len(held) - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if held[mid] - base == mid - i:
            lo = mid
        else:
            hi = mid - 1
    return lo


def gaps(held: Sequence[int], first: int, last: int, limit: int = MAX_HOLES) -> list[Run]:
    """The runs of ``first .. last`` not in ``held`` (ascending, distinct values), at most
    ``limit + 1`` of them (the first ones): a bisection each run held, none a value."""
    out: list[Run] = []
    covered = first - 1
    k = bisect_right(held, covered)
    n = len(held)
    while covered < last and len(out) <= limit:
        if k < n and held[k] == covered + 1:
            k = run_end(held, k)
            covered = held[k]
            k = bisect_right(held, covered, k)
        else:
            end = min(held[k] - 1, last) if k < n else last
            out.append((covered + 1, end))
            covered = end
    return out


def without(runs: Sequence[Run], seqs: Sequence[int]) -> list[Run]:
    """``runs`` without the values in ``seqs`` (ascending)."""
    out: list[Run] = []
    for first, last in runs:
        i, j = bisect_left(seqs, first), bisect_right(seqs, last)
        at = first
        for seq in seqs[i:j]:
            if seq > at:
                out.append((at, seq - 1))
            at = max(at, seq + 1)
        if at <= last:
            out.append((at, last))
    return out


def capped(upto: int, holes: list[Run]) -> Removed:
    """``Removed(upto, holes)`` with at most :data:`MAX_HOLES` holes: past them, the bound
    comes down to below the first hole not kept."""
    if len(holes) > MAX_HOLES:
        upto = holes[MAX_HOLES][0] - 1
        holes = holes[:MAX_HOLES]
    return Removed(upto, tuple(holes))


def after_removal(was: Removed, gone: Sequence[int], held: Sequence[int]) -> Removed:
    """The record once retention removed ``gone`` (ascending origin_seqs) of an origin
    whose seqs held before the removal are ``held``: the bound rises to the highest
    removed, over the seqs never held between (new holes), and a removed seq that had
    filled a hole leaves it."""
    if not gone:
        return was
    holes = list(was.holes)
    top = gone[-1]
    upto = was.upto
    if top > upto:
        holes += gaps(held, upto + 1, top)
        upto = top
    return capped(upto, without(holes, gone))


def after_skip(was: Removed, upto: int) -> Removed:
    """The record once gossip skipped everything up to ``upto`` on a peer's floor."""
    if upto <= 0:
        return was
    holes = [(max(a, upto + 1), b) for a, b in was.holes if b > upto]
    return Removed(max(was.upto, upto), tuple(holes))


def start(held: Sequence[int], was: Removed, above_max: int) -> Start:
    """An origin's gossip start from its origin_seqs held (ascending) and its record.

    Done is what is held or was removed (everything up to ``was.upto`` but the holes):
    the head is the end of the done run from 1, the floor ("nothing below it to be had
    from us") the lowest seq neither held nor removed, or the lowest held if lower. A
    node holding 2.. that removed nothing says floor 1 head 0; one that never had 5 and
    removed 1..8 around it says floor 5 head 4 (not 9: a peer that missed 5 would skip
    it). ``above``: held seqs above the head outside the removed runs (at most
    ``above_max``); ``done``: the removed runs above the head, for the tracker to fold
    in once the hole below them is filled.
    """
    upto, holes = was
    runs: list[Run] = []  # removed (or held): 1..upto without the holes
    at = 1
    for first, last in holes:
        if first > at:
            runs.append((at, first - 1))
        at = last + 1
    if upto >= at:
        runs.append((at, upto))
    head, r, n = 0, 0, len(held)
    while True:
        while r < len(runs) and runs[r][0] <= head + 1:
            head = max(head, runs[r][1])
            r += 1
        k = bisect_right(held, head)
        if k < n and held[k] == head + 1:
            head = held[run_end(held, k)]
            continue
        break
    lowest = holes[0][0] if holes else upto + 1
    floor = min(held[0], lowest) if held else lowest
    done = runs[r:]
    above: list[int] = []
    k = bisect_right(held, head)
    for first, last in [*done, (-1, -1)]:  # held seqs between the runs (the last: open)
        stop = n if first < 0 else bisect_left(held, first)
        take = max(k, min(stop, k + above_max - len(above)))
        above += held[k:take]
        k = bisect_right(held, last) if first >= 0 else n
    return Start(floor, head, above, done)
