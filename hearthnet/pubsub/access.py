"""Per-topic access rules (spec §6.9) and the reserved prefixes (spec §6.1). Pure.

Rules are evaluated top to bottom; the first rule whose pattern matches decides. Levels:

- ``self``: a member whose own short id stands where the rule has ``{self}`` (which
  matches any one segment), or, in a rule without ``{self}``, only this node itself;
- ``anchor`` / ``trusted`` / ``member``: members (not token clients) of at least that level;
- ``token``: members, or token clients whose scopes allow the topic;
- ``any``: any authenticated caller.

Reserved prefixes are enforced before the rules: ``node.<short-id>.inbox`` may be
subscribed to only by that node, and ``mesh.**`` is written only by this node itself.

For a wildcard subscription the deciding rule is the first one that *covers* it (every
topic it can match is inside the rule's pattern). Earlier rules that only *overlap* it,
and the reserved prefixes, are then enforced message by message:
:meth:`AccessPolicy.check_subscribe` returns ``True`` when such per-topic filtering is
needed, and :meth:`AccessPolicy.may_receive` does it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hearthnet.caller import Caller
from hearthnet.community import RULE_LEVELS, Level, check_rule
from hearthnet.errors import BadRequest, ConfigError, Forbidden
from hearthnet.ids import short_id
from hearthnet.membership import Membership
from hearthnet.pubsub.topics import TopicPattern, pattern_covers, patterns_overlap

LEVELS = RULE_LEVELS
INBOX_PATTERN = "node.*.inbox"
MESH_PATTERN = "mesh.**"


@dataclass(frozen=True, slots=True)
class AccessRule:
    """One rule: who may subscribe to (and read history of), and publish to, a pattern."""

    pattern: str
    subscribe: str
    publish: str

    @classmethod
    def from_config(cls, table: Mapping[str, Any]) -> AccessRule:
        """Parse a ``[[pubsub.rules]]`` table."""
        try:
            rule = cls(
                str(table["pattern"]),
                str(table.get("subscribe", "member")),
                str(table.get("publish", "member")),
            )
        except KeyError as exc:
            raise ConfigError("a [[pubsub.rules]] entry needs a pattern") from exc
        extra = set(table) - {"pattern", "subscribe", "publish"}
        if extra:
            raise ConfigError(f"unknown keys in [[pubsub.rules]]: {sorted(extra)}")
        try:
            check_rule(rule.pattern, rule.subscribe, rule.publish)
        except BadRequest as exc:
            raise ConfigError(str(exc)) from exc
        return rule

    @property
    def match_pattern(self) -> str:
        """The pattern used for matching: ``{self}`` matches any one segment."""
        return self.pattern.replace("{self}", "*")

    def is_own(self, caller: Caller, topic: str) -> bool:
        """Whether the segment at ``{self}`` is the caller's own short id."""
        if caller.token is not None or "{self}" not in self.pattern:
            return False
        index = self.pattern.split(".").index("{self}")
        parts = topic.split(".")
        return index < len(parts) and parts[index] == short_id(caller.identity)


DEFAULT_RULES = (
    AccessRule("node.{self}.inbox", "self", "member"),
    AccessRule("**", "token", "token"),
)


def _satisfies(caller: Caller, level: str, *, own: bool, scope_ok: bool) -> bool:
    if level == "any":
        return True
    if level == "token":
        return caller.token is None or scope_ok
    if caller.token is not None:
        return False
    if level == "self":
        return own or caller.is_self
    return caller.level >= Level[level.upper()]


def _rule_refusal(caller: Caller, rule: AccessRule, action: str) -> str:
    """Why ``rule`` refuses ``caller`` to ``action`` (``publish``/``subscribe``), in words."""
    level = rule.subscribe if action == "subscribe" else rule.publish
    token = caller.token
    if token is not None and level == "token":
        kind = "sub" if action == "subscribe" else "pub"
        scopes = ", ".join(s.pattern for s in token.scopes if s.kind == kind) or "none"
        return f"the token's {kind} scopes ({scopes}) do not cover it"
    if token is not None:
        needed = "this node" if level == "self" else f"members of level {level} or above"
        return f"access rule {rule.pattern!r} lets {needed} {action}, not token clients"
    if level == "self":
        whose = "the node whose short id is at {self}" if "{self}" in rule.pattern else "this node"
        return f"access rule {rule.pattern!r} lets only {whose} {action}"
    return (
        f"access rule {rule.pattern!r} needs level {level} to {action}; "
        f"this caller is {caller.level.name.lower()}"
    )


def inbox_owner(topic: str) -> str | None:
    """The short id in ``node.<short-id>.inbox``, or None for other topics."""
    parts = topic.split(".")
    if len(parts) == 3 and parts[0] == "node" and parts[2] == "inbox":
        return parts[1]
    return None


def effective_rules(
    membership: Membership, configured: tuple[AccessRule, ...]
) -> tuple[AccessRule, ...]:
    """The rules a node enforces (spec §6.9): the community's signed ones when an anchor
    has set them, else the node's own ``[[pubsub.rules]]``, else :data:`DEFAULT_RULES`."""
    if membership.pubsub_rules is not None:
        return tuple(AccessRule(*rule) for rule in membership.pubsub_rules)
    return configured or DEFAULT_RULES


class AccessPolicy:
    """The community's rules plus the reserved prefixes."""

    def __init__(self, rules: Iterable[AccessRule] = DEFAULT_RULES) -> None:
        self.rules = tuple(rules)

    @staticmethod
    def _caller_short(caller: Caller) -> str | None:
        return None if caller.token is not None else short_id(caller.identity)

    def _reserved(self, caller: Caller, action: str, topic: str) -> bool | None:
        owner = inbox_owner(topic)
        if owner is not None and action == "subscribe":
            return owner == self._caller_short(caller)
        if topic.startswith("mesh.") and action == "publish":
            return caller.is_self
        return None

    def _decide(self, caller: Caller, action: str, topic: str) -> bool:
        reserved = self._reserved(caller, action, topic)
        if reserved is not None:
            return reserved
        for rule in self.rules:
            if not TopicPattern.parse(rule.match_pattern).matches(topic):
                continue
            level = rule.subscribe if action == "subscribe" else rule.publish
            scope_ok = caller.token is not None and caller.token.allows_topic(
                "sub" if action == "subscribe" else "pub", topic
            )
            return _satisfies(caller, level, own=rule.is_own(caller, topic), scope_ok=scope_ok)
        return False

    def refusal(self, caller: Caller, action: str, topic: str) -> str:
        """Why ``caller`` may not ``action`` (``publish``/``subscribe``) on ``topic``, for
        the message of the :class:`Forbidden` that says so."""
        owner = inbox_owner(topic)
        if owner is not None and action == "subscribe":
            return f"only the node {owner} subscribes to its inbox"
        if topic.startswith("mesh.") and action == "publish":
            return "mesh.* topics are written by the node itself"
        for rule in self.rules:
            if TopicPattern.parse(rule.match_pattern).matches(topic):
                return _rule_refusal(caller, rule, action)
        return "no access rule covers it"

    def check_publish(self, caller: Caller, topic: str) -> None:
        """Raise :class:`Forbidden` unless ``caller`` may publish to ``topic``."""
        if not self.may_publish(caller, topic):
            reason = self.refusal(caller, "publish", topic)
            raise Forbidden(f"publishing to {topic} is not allowed: {reason}")

    def may_publish(self, caller: Caller, topic: str) -> bool:
        """Whether ``caller`` may publish to ``topic``."""
        return self._decide(caller, "publish", topic)

    def check_read(self, caller: Caller, topic: str) -> None:
        """History and presence of a topic need subscribe rights to it."""
        if not self._decide(caller, "subscribe", topic):
            reason = self.refusal(caller, "subscribe", topic)
            raise Forbidden(f"reading {topic} is not allowed: {reason}")

    def may_receive(self, caller: Caller, topic: str) -> bool:
        """Whether a message on ``topic`` may be delivered to ``caller`` (per-topic filter)."""
        return self._decide(caller, "subscribe", topic)

    def check_subscribe(self, caller: Caller, pattern: str) -> bool:
        """Check a subscription; return True when deliveries need per-topic filtering.

        Raises:
            Forbidden: the deciding rule refuses it, or no rule covers it.
        """
        parsed = TopicPattern.parse(pattern)
        if parsed.is_literal:
            if not self._decide(caller, "subscribe", pattern):
                reason = self.refusal(caller, "subscribe", pattern)
                raise Forbidden(f"subscribing to {pattern} is not allowed: {reason}")
            return False
        needs_filter = patterns_overlap(pattern, INBOX_PATTERN)
        for rule in self.rules:
            rule_pattern = rule.match_pattern
            if not patterns_overlap(rule_pattern, pattern):
                continue
            if not pattern_covers(rule_pattern, pattern):
                needs_filter = True  # an earlier, narrower rule governs part of it
                continue
            scope_ok = caller.token is not None and caller.token.allows_subscription(pattern)
            own = rule.is_own(caller, pattern)
            if not _satisfies(caller, rule.subscribe, own=own, scope_ok=scope_ok):
                reason = _rule_refusal(caller, rule, "subscribe")
                raise Forbidden(f"subscribing to {pattern} is not allowed: {reason}")
            return needs_filter
        raise Forbidden(f"no access rule covers {pattern}")
