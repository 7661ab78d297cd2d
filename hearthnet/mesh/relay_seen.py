"""The relay's seen-cache (spec §8: a ``(from, id)`` already forwarded is dropped). Pure.

Two generations rather than one ordered map: a key is looked up in both, added to the
newer, and when the newer holds half the cache it becomes the older one and the older
one is dropped. So the cache remembers at least the last ``size / 2`` keys it took and at
most ``size`` (plus one batch), with no per-key eviction. Each generation keeps the ids
of one sender in one set of integers, so a route batch's run (one sender, many ids) is
checked and added with one set operation each, and no ``(from, id)`` tuple is built,
hashed or freed per frame (spec §11).
"""

from __future__ import annotations

from collections.abc import Sequence


class SeenCache:
    """``(from, id)`` keys seen lately, bounded by ``size`` (at least the last
    ``size // 2`` kept)."""

    __slots__ = ("_count", "_half", "_new", "_old")

    def __init__(self, size: int) -> None:
        self._half = max(1, size // 2)
        self._new: dict[str, set[int]] = {}  # sender -> its ids, the newer generation
        self._old: dict[str, set[int]] = {}
        self._count = 0  # keys in the newer generation

    def seen(self, from_: str, id_: int) -> bool:
        """Whether ``(from_, id_)`` is remembered."""
        ids = self._new.get(from_)
        if ids is not None and id_ in ids:
            return True
        ids = self._old.get(from_)
        return ids is not None and id_ in ids

    def __len__(self) -> int:
        return self._count + sum(len(ids) for ids in self._old.values())

    def add(self, from_: str, id_: int) -> None:
        """Remember ``(from_, id_)``."""
        ids = self._new.get(from_)
        if ids is None:
            ids = self._new[from_] = set()
        if id_ not in ids:
            ids.add(id_)
            self._count += 1
            if self._count >= self._half:
                self._turn()

    def fresh(self, from_: str, ids: Sequence[int]) -> bool:
        """Whether none of ``(from_, id)`` for ``ids`` is remembered and no two of
        ``ids`` are equal."""
        new = self._new.get(from_)
        if new is not None and not new.isdisjoint(ids):
            return False
        old = self._old.get(from_)
        if old is not None and not old.isdisjoint(ids):
            return False
        return len(ids) == 1 or len(set(ids)) == len(ids)

    def add_all(self, from_: str, ids: Sequence[int]) -> None:
        """Remember ``(from_, id)`` for each of ``ids`` (a route batch's run: one set
        operation)."""
        known = self._new.get(from_)
        if known is None:
            known = self._new[from_] = set(ids)
            self._count += len(known)
        else:
            before = len(known)
            known.update(ids)
            self._count += len(known) - before
        if self._count >= self._half:
            self._turn()

    def _turn(self) -> None:
        self._old, self._new, self._count = self._new, {}, 0

    def clear(self) -> None:
        """Forget everything."""
        self._new.clear()
        self._old.clear()
        self._count = 0
