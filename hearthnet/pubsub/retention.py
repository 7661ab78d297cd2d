"""Retention per topic pattern (spec §6.3). Pure.

Default 1,000 messages per topic and 24 h; rules per pattern override it (first match
wins), global caps on bytes and on messages evict oldest first, and a message's own
``ttl_s`` ends it early.
Durable consumers hold unacked messages past these limits, up to 10,000 messages or
7 days per consumer (spec §6.8).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from hearthnet.errors import ConfigError
from hearthnet.pubsub.topics import TopicPattern


@dataclass(frozen=True, slots=True)
class RetentionRule:
    """How much of a pattern's topics to keep."""

    pattern: str
    max_messages: int
    max_age_s: float

    @classmethod
    def from_config(cls, table: Mapping[str, Any]) -> RetentionRule:
        """Parse a ``[[pubsub.retention]]`` table."""
        extra = set(table) - {"pattern", "max_messages", "max_age_s"}
        if extra or "pattern" not in table:
            raise ConfigError("[[pubsub.retention]] takes pattern, max_messages, max_age_s")
        try:
            TopicPattern.parse(table["pattern"])
            rule = cls(
                str(table["pattern"]),
                int(table.get("max_messages", 1000)),
                float(table.get("max_age_s", 86400)),
            )
        except (ValueError, TypeError, Exception) as exc:
            raise ConfigError(f"bad [[pubsub.retention]] entry {dict(table)}: {exc}") from exc
        if rule.max_messages < 1 or rule.max_age_s <= 0:
            raise ConfigError("retention limits must be positive")
        return rule


class RetentionPolicy:
    """Resolves the limits that apply to a topic."""

    def __init__(
        self,
        rules: Iterable[RetentionRule] = (),
        *,
        max_messages: int = 1000,
        max_age_s: float = 86400.0,
        max_bytes: int = 1 << 30,
        max_log_messages: int = 1_000_000,
    ) -> None:
        if max_log_messages < 1 or max_bytes < 1:
            raise ConfigError("pubsub.max_messages and pubsub.max_bytes must be positive")
        self.rules = tuple(rules)
        self.default = (max_messages, max_age_s)
        self.max_bytes = max_bytes
        self.max_log_messages = max_log_messages  # pubsub.max_messages: the whole log
        self.limits_for = lru_cache(maxsize=8192)(self._limits_for)

    def _limits_for(self, topic: str) -> tuple[int, float]:
        for rule in self.rules:
            if TopicPattern.parse(rule.pattern).matches(topic):
                return rule.max_messages, rule.max_age_s
        return self.default
