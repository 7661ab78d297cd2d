"""Topic names and subscription patterns (spec §6.1).

A topic is dot-separated segments of ``[A-Za-z0-9_-]+``, at most 16 segments and
255 bytes. A pattern may also use ``*`` (exactly one segment) and ``**`` (one or
more segments). Capability names in token scopes use the same grammar.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from hearthnet.errors import BadRequest

MAX_SEGMENTS = 16
MAX_BYTES = 255
_SEGMENT_RE = re.compile(r"^[A-Za-z0-9_-]+\Z")
_TOPIC_RE = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+){0,15}\Z")


# Topics seen valid lately: every publish names one, and most publish to a few.
_VALID: dict[str, None] = {}
_VALID_MAX = 4096


def validate_topic(topic: object) -> str:
    """Return ``topic`` if it is a valid concrete topic name, else raise :class:`BadRequest`."""
    if not isinstance(topic, str):
        raise BadRequest("a topic is a string")
    if topic in _VALID:
        return topic
    if len(topic) > MAX_BYTES:  # the grammar is ASCII, so characters == bytes
        raise BadRequest(f"a topic has at most {MAX_BYTES} bytes")
    if not _TOPIC_RE.match(topic):
        raise BadRequest(
            f"invalid topic {topic[:64]!r}: dot-separated segments of [A-Za-z0-9_-], "
            f"at most {MAX_SEGMENTS}"
        )
    if len(_VALID) >= _VALID_MAX:
        _VALID.clear()
    _VALID[topic] = None
    return topic


@dataclass(frozen=True, slots=True)
class TopicPattern:
    """A parsed subscription pattern; ``matches`` is pure and cached per pattern."""

    text: str
    segments: tuple[str, ...]

    @classmethod
    def parse(cls, text: object) -> TopicPattern:
        """Parse and validate a pattern; :class:`BadRequest` when malformed."""
        if not isinstance(text, str):
            raise BadRequest("a topic pattern is a string")
        return _parse_pattern(text)

    @property
    def is_literal(self) -> bool:
        """True when the pattern has no wildcard (it names one topic)."""
        return "*" not in self.segments and "**" not in self.segments

    def matches(self, topic: str) -> bool:
        """Whether the concrete ``topic`` is matched by this pattern."""
        if self.is_literal:
            return topic == self.text
        return _match(self.segments, tuple(topic.split(".")))


@lru_cache(maxsize=4096)
def _parse_pattern(text: str) -> TopicPattern:
    if len(text) > MAX_BYTES:
        raise BadRequest(f"a topic pattern has at most {MAX_BYTES} bytes")
    segments = tuple(text.split("."))
    if len(segments) > MAX_SEGMENTS:
        raise BadRequest(f"a topic pattern has at most {MAX_SEGMENTS} segments")
    for seg in segments:
        if seg not in ("*", "**") and not _SEGMENT_RE.match(seg):
            raise BadRequest(
                f"invalid topic pattern {text[:64]!r}: dot-separated segments of"
                " [A-Za-z0-9_-], * (one segment) or ** (one or more), e.g. 'chat.room.*'"
            )
    return TopicPattern(text, segments)


@lru_cache(maxsize=65536)
def _match(pattern: tuple[str, ...], topic: tuple[str, ...]) -> bool:
    if not pattern:
        return not topic
    head = pattern[0]
    if head == "**":
        # one or more segments: try every non-empty prefix of the topic
        return any(_match(pattern[1:], topic[i:]) for i in range(1, len(topic) + 1))
    if not topic:
        return False
    if head in ("*", topic[0]):
        return _match(pattern[1:], topic[1:])
    return False


def pattern_covers(outer: str, inner: str) -> bool:
    """True when every topic matched by pattern ``inner`` is matched by ``outer``
    (``chat.**`` covers ``chat.*``; ``chat.*`` does not cover ``chat.**``)."""
    return _within(tuple(inner.split(".")), tuple(outer.split(".")))


@lru_cache(maxsize=16384)
def _within(sub: tuple[str, ...], scope: tuple[str, ...]) -> bool:
    if not scope:
        return not sub
    if scope[0] == "**":
        rest = scope[1:]
        return any(_within(sub[i:], rest) for i in range(1, len(sub) + 1)) if sub else False
    if not sub or sub[0] == "**":
        return False
    if scope[0] in ("*", sub[0]):
        return _within(sub[1:], scope[1:])
    return False


def patterns_overlap(a: str, b: str) -> bool:
    """True when some concrete topic is matched by both patterns."""
    return _overlap(tuple(a.split(".")), tuple(b.split(".")))


@lru_cache(maxsize=16384)
def _overlap(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    # Walk one topic segment at a time; a `**` may stay (consume more) or move on.
    if not a or not b:
        return not a and not b
    a0, b0 = a[0], b[0]
    if not (a0 in ("*", "**") or b0 in ("*", "**") or a0 == b0):
        return False
    next_a = (a, a[1:]) if a0 == "**" else (a[1:],)
    next_b = (b, b[1:]) if b0 == "**" else (b[1:],)
    return any(_overlap(na, nb) for na in next_a for nb in next_b if (na, nb) != (a, b))
