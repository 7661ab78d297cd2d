"""Messages per second per topic, for the console (pure: the caller passes the time).

The log's per-topic counts are what it holds now (retention lowers them); a rate needs
what arrived lately. :class:`TopicRates` counts committed messages per topic in
one-second buckets over the last :data:`WINDOW_S` seconds. Bounded: at most
``max_topics`` topics are tracked (the least recently active is forgotten).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Iterable

WINDOW_S = 10
MAX_TOPICS = 4096


class TopicRates:
    """Recent arrivals per topic, in one-second buckets."""

    def __init__(self, window_s: int = WINDOW_S, max_topics: int = MAX_TOPICS) -> None:
        self.window_s = window_s
        self.max_topics = max_topics
        self._buckets: OrderedDict[str, deque[list[int]]] = OrderedDict()

    def record(self, topics: Iterable[str], now_s: float) -> None:
        """Count one message on each of ``topics`` (repeats count again) at ``now_s``.

        A commit's topics are counted first (in C), so the buckets are touched once per
        distinct topic, not once per message: a batch is mostly one or a few topics.
        """
        second = int(now_s)
        for topic, count in Counter(topics).items():
            self._add(topic, count, second)

    def record_one(self, topic: str, now_s: float) -> None:
        """:meth:`record` of one message (a commit of one: no count made first)."""
        self._add(topic, 1, int(now_s))

    def _add(self, topic: str, count: int, second: int) -> None:
        buckets = self._buckets.get(topic)
        if buckets is None:
            buckets = self._buckets[topic] = deque()
            if len(self._buckets) > self.max_topics:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(topic)
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += count
            return
        buckets.append([second, count])
        while buckets and buckets[0][0] <= second - self.window_s:
            buckets.popleft()

    def rate(self, topic: str, now_s: float) -> float:
        """Messages per second on ``topic`` over the last ``window_s`` seconds."""
        buckets = self._buckets.get(topic)
        if not buckets:
            return 0.0
        since = int(now_s) - self.window_s
        return sum(n for second, n in buckets if second > since) / self.window_s
