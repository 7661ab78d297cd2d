"""The replay cache of spec §1.4: remembers ``(from, request_id)`` pairs for 120 s.

Pure: the caller passes the current time. Bounded: when the cache is full of pairs
that are still inside their window, a new pair is refused with :class:`Unavailable`
rather than forgetting a live pair (which would open a replay hole).
"""

from __future__ import annotations

from collections import OrderedDict

from hearthnet.errors import Replayed, Unavailable


class ReplayCache:
    """Bounded, time-ordered memory of seen request ids."""

    def __init__(self, window_ms: int = 120_000, max_entries: int = 1_000_000) -> None:
        self.window_ms = window_ms
        self.max_entries = max_entries
        # key -> expiry (ms). Insertion order is time order because now_ms only grows
        # for a given process clock; pruning pops from the front.
        self._seen: OrderedDict[tuple[str, str], int] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def _prune(self, now_ms: int) -> None:
        seen = self._seen
        while seen:
            key, expiry = next(iter(seen.items()))
            if expiry > now_ms:
                break
            del seen[key]

    def check_and_add(self, sender: str, request_id: str, now_ms: int) -> None:
        """Record the pair, or raise if it was seen inside the window.

        Raises:
            Replayed: the pair was seen in the last ``window_ms``.
            Unavailable: the cache is full of live pairs (``retry_after_ms`` set).
        """
        self._prune(now_ms)
        key = (sender, request_id)
        if key in self._seen:
            raise Replayed(f"request id {request_id} already seen")
        if len(self._seen) >= self.max_entries:
            oldest = next(iter(self._seen.values()))
            raise Unavailable("replay cache full", retry_after_ms=max(1, oldest - now_ms))
        self._seen[key] = now_ms + self.window_ms
