"""Which sessions a topic's messages go to. Pure.

Literal subscriptions live in a dict keyed by topic (no scan); wildcard subscriptions
are matched per topic once and cached until the wildcard set changes. A session that
subscribes to several patterns matching the same topic appears once in the result.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from hearthnet.pubsub.topics import TopicPattern

S = TypeVar("S")
_CACHE_MAX = 65536


class SubscriptionIndex(Generic[S]):
    """Patterns -> subscribers, with per-topic match caching."""

    def __init__(self) -> None:
        self._literal: dict[str, dict[S, int]] = {}
        self._wild: dict[str, tuple[TopicPattern, dict[S, int]]] = {}
        self._cache: dict[str, tuple[S, ...]] = {}

    def __len__(self) -> int:
        return sum(len(v) for v in self._literal.values()) + sum(
            len(v) for _, v in self._wild.values()
        )

    def add(self, pattern: TopicPattern, sub: S) -> None:
        """Subscribe ``sub`` to ``pattern`` (counted: add twice, remove twice)."""
        if pattern.is_literal:
            subs = self._literal.setdefault(pattern.text, {})
            subs[sub] = subs.get(sub, 0) + 1
            self._cache.pop(pattern.text, None)
            return
        _, subs = self._wild.setdefault(pattern.text, (pattern, {}))
        subs[sub] = subs.get(sub, 0) + 1
        self._cache.clear()

    def remove(self, pattern: TopicPattern, sub: S) -> None:
        """Undo one :meth:`add`."""
        if pattern.is_literal:
            subs = self._literal.get(pattern.text)
            table = self._literal
            key = pattern.text
            self._cache.pop(pattern.text, None)
        else:
            entry = self._wild.get(pattern.text)
            subs = entry[1] if entry else None
            table = self._wild  # type: ignore[assignment]
            key = pattern.text
            self._cache.clear()
        if subs is None or sub not in subs:
            return
        subs[sub] -= 1
        if subs[sub] <= 0:
            del subs[sub]
        if not subs:
            del table[key]

    def match(self, topic: str) -> tuple[S, ...]:
        """Every subscriber of ``topic``, each once."""
        cached = self._cache.get(topic)
        if cached is not None:
            return cached
        found: dict[S, None] = dict.fromkeys(self._literal.get(topic, ()))
        for pattern, subs in self._wild.values():
            if pattern.matches(topic):
                found.update(dict.fromkeys(subs))
        result = tuple(found)
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()
        self._cache[topic] = result
        return result
