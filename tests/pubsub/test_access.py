"""Access rules at every level, and the reserved prefixes (spec §6.1, §6.9). Pure."""

from __future__ import annotations

import pytest

from hearthnet.caller import Caller
from hearthnet.community import Level
from hearthnet.errors import ConfigError, Forbidden
from hearthnet.identity import KeyPair
from hearthnet.ids import short_id
from hearthnet.pubsub.access import AccessPolicy, AccessRule
from hearthnet.tokens import CapabilityToken, Scope

NODE = KeyPair.from_seed(b"\x30" * 32)
ANCHOR = Caller(NODE.node_id, "node", Level.ANCHOR, None, True)
TRUSTED = Caller(KeyPair.from_seed(b"\x31" * 32).node_id, "node", Level.TRUSTED)
MEMBER = Caller(KeyPair.from_seed(b"\x32" * 32).node_id, "device", Level.MEMBER)


def token_caller(*scopes: str) -> Caller:
    """A token client issued by the node."""
    token = CapabilityToken.issue(
        NODE,
        community=NODE.node_id,
        scopes=[Scope.parse(s) for s in scopes],
        ttl_ms=60_000,
        now_ms=0,
    )
    return Caller(token.identity, "token", Level.ANCHOR, token)


SPEC_RULES = AccessPolicy(
    [
        AccessRule("node.{self}.inbox", "self", "member"),
        AccessRule("chat.**", "member", "member"),
        AccessRule("ops.**", "trusted", "anchor"),
        AccessRule("public.**", "any", "token"),
        AccessRule("**", "member", "trusted"),
    ]
)


def allowed(policy: AccessPolicy, caller: Caller, action: str, topic: str) -> bool:
    """Whether the action passes."""
    try:
        if action == "sub":
            policy.check_subscribe(caller, topic)
        else:
            policy.check_publish(caller, topic)
    except Forbidden:
        return False
    return True


@pytest.mark.parametrize(
    ("caller", "expected"),
    [
        (ANCHOR, [True, True, True, True, True, True, True, True]),
        (TRUSTED, [True, True, True, False, True, True, True, True]),
        (MEMBER, [True, True, False, False, True, True, True, False]),
        (
            token_caller("sub:public.**", "pub:public.**"),
            [False, False, False, False, True, True, False, False],
        ),
    ],
)
def test_levels(caller: Caller, expected: list[bool]) -> None:
    """anchor > trusted > member; tokens pass only `token`/`any` rules, and only in scope."""
    checks = [
        ("sub", "chat.a"),
        ("pub", "chat.a"),
        ("sub", "ops.x"),
        ("pub", "ops.x"),
        ("sub", "public.news"),
        ("pub", "public.news"),
        ("sub", "other.t"),
        ("pub", "other.t"),
    ]
    assert expected == [allowed(SPEC_RULES, caller, a, t) for a, t in checks]


def test_token_scope_is_checked_for_token_level() -> None:
    """A token may publish to public.** only with a pub scope covering the topic."""
    reader = token_caller("sub:public.**")
    assert (True, False) == (
        allowed(SPEC_RULES, reader, "sub", "public.x"),
        allowed(SPEC_RULES, reader, "pub", "public.x"),
    )


def test_inbox_is_only_for_its_node() -> None:
    """node.<short>.inbox: only that identity may subscribe; members may publish to it."""
    mine = f"node.{short_id(MEMBER.identity)}.inbox"
    theirs = f"node.{short_id(TRUSTED.identity)}.inbox"
    assert [True, False, True] == [
        allowed(SPEC_RULES, MEMBER, "sub", mine),
        allowed(SPEC_RULES, MEMBER, "sub", theirs),
        allowed(SPEC_RULES, MEMBER, "pub", theirs),
    ]


def test_mesh_prefix_written_only_by_the_node() -> None:
    """mesh.** is writable only by this node itself, even for anchors of other nodes."""
    other_anchor = Caller(TRUSTED.identity, "node", Level.ANCHOR)
    assert (True, False) == (
        allowed(SPEC_RULES, ANCHOR, "pub", "mesh.beacon"),
        allowed(SPEC_RULES, other_anchor, "pub", "mesh.beacon"),
    )


def test_wildcards_need_a_covering_rule_and_get_filtered() -> None:
    """`**` is decided by the catch-all rule but filtered per topic (inboxes, ops.**)."""
    needs_filter = SPEC_RULES.check_subscribe(MEMBER, "**")
    theirs = f"node.{short_id(TRUSTED.identity)}.inbox"
    assert (True, False, False, True) == (
        needs_filter,
        SPEC_RULES.may_receive(MEMBER, theirs),
        SPEC_RULES.may_receive(MEMBER, "ops.x"),
        SPEC_RULES.may_receive(MEMBER, "chat.x"),
    )
    assert not SPEC_RULES.check_subscribe(MEMBER, "chat.*")
    with pytest.raises(Forbidden):
        SPEC_RULES.check_subscribe(MEMBER, "ops.*")


def test_default_rules_let_scoped_tokens_subscribe() -> None:
    """With no rules configured, `hearthnet token issue --scope sub:chat.**` works."""
    token = token_caller("sub:chat.**")
    policy = AccessPolicy()
    assert (True, False) == (
        allowed(policy, token, "sub", "chat.x"),
        allowed(policy, token, "sub", "x.y"),
    )


@pytest.mark.parametrize(
    "table",
    [
        {"subscribe": "member"},
        {"pattern": "a", "subscribe": "admin"},
        {"pattern": "a..b"},
        {"pattern": "a", "read": "any"},
    ],
)
def test_bad_rules_are_config_errors(table: dict[str, str]) -> None:
    """Rules without a pattern, with unknown levels or keys, are refused at start-up."""
    with pytest.raises(ConfigError):
        AccessRule.from_config(table)
