"""The relay's seen-cache (spec §8: a ``(from, id)`` already forwarded is dropped). Pure.

Two generations of sets rather than one ordered map: a key is looked up in both, added to
the newer, and when the newer holds half the cache it becomes the older one and the older
one is dropped. So the cache remembers at least the last ``size / 2`` keys it took and at
most ``size`` (plus one batch), with no per-key eviction, and a route batch's keys are
checked and added with one set operation each (spec §11).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence


class SeenCache:
    """Keys seen lately, bounded by ``size`` (at least the last ``size // 2`` kept)."""

    __slots__ = ("_half", "_new", "_old")

    def __init__(self, size: int) -> None:
        self._half = max(1, size // 2)
        self._new: set[Hashable] = set()
        self._old: set[Hashable] = set()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._new or key in self._old

    def __len__(self) -> int:
        return len(self._new) + len(self._old)

    def add(self, key: Hashable) -> None:
        """Remember ``key``."""
        new = self._new
        new.add(key)
        if len(new) >= self._half:
            self._old, self._new = new, set()

    def fresh(self, keys: Sequence[Hashable]) -> bool:
        """Whether none of ``keys`` is remembered and no two of them are equal."""
        return (
            self._new.isdisjoint(keys)
            and self._old.isdisjoint(keys)
            and (len(keys) == 1 or len(set(keys)) == len(keys))
        )

    def add_all(self, keys: Sequence[Hashable]) -> None:
        """Remember ``keys`` (a route batch's run: one set operation)."""
        new = self._new
        new.update(keys)
        if len(new) >= self._half:
            self._old, self._new = new, set()

    def clear(self) -> None:
        """Forget everything."""
        self._new.clear()
        self._old.clear()
