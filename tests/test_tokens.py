"""Capability tokens and scopes (spec §1.6)."""

from __future__ import annotations

import json

import pytest

from hearthnet.errors import BadRequest, InvalidSignature
from hearthnet.identity import KeyPair
from hearthnet.ids import b64url_decode, b64url_encode
from hearthnet.tokens import CapabilityToken, Scope

ISSUER = KeyPair.from_seed(bytes(range(32)))


def issue(*scopes: str, ttl_ms: int = 3_600_000) -> CapabilityToken:
    """A token from ISSUER for its own community."""
    return CapabilityToken.issue(
        ISSUER,
        community=ISSUER.node_id,
        scopes=[Scope.parse(s) for s in scopes],
        ttl_ms=ttl_ms,
        now_ms=1_000_000,
        sub="phone",
    )


def test_token_round_trips_through_its_text_form() -> None:
    """hnt1:... decodes to the same verified token."""
    token = issue("sub:chat.**", "call:llm.chat@2")
    text = token.encode()
    assert (True, token) == (text.startswith("hnt1:"), CapabilityToken.decode(text))


def test_tampered_token_does_not_verify() -> None:
    """Changing any field (here: the scopes) breaks the signature."""
    token = issue("sub:chat.*")
    obj = json.loads(b64url_decode(token.encode()[5:]))
    obj["scopes"] = [{"sub": "**"}]
    with pytest.raises(InvalidSignature):
        CapabilityToken.decode("hnt1:" + b64url_encode(json.dumps(obj).encode()))


DEEP = b"[" * 3000 + b"]" * 3000  # deeper than Python's recursion limit, under 8 KiB encoded


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hnt2:abc",
        "hnt1:!!!",
        "hnt1:" + "A" * 9000,
        5,
        "hnt1:" + b64url_encode(DEEP),
        "hnt1:" + b64url_encode(b'{"exp_ms": NaN}'),
    ],
)
def test_garbage_tokens_refused(text: object) -> None:
    """Malformed token strings are invalid_signature, never a crash."""
    with pytest.raises(InvalidSignature):
        CapabilityToken.decode(text)


def test_call_scopes_match_name_and_major() -> None:
    """call:llm.chat@2 allows llm.chat 2.x only; call:echo any version; call:llm.** any llm."""
    token = issue("call:llm.chat@2", "call:echo")
    assert [True, True, False, True, False] == [
        token.allows_call("llm.chat", "2.0"),
        token.allows_call("llm.chat", "2.3"),
        token.allows_call("llm.chat", "3.0"),
        token.allows_call("echo", "7.1"),
        token.allows_call("echo.stream", "1.0"),
    ]
    assert issue("call:llm.**").allows_call("llm.chat", "2.0")


def test_topic_scopes() -> None:
    """sub/pub scopes match concrete topics with * and ** patterns."""
    token = issue("sub:chat.session.*", "pub:agent.**")
    assert [True, False, True, False] == [
        token.allows_topic("sub", "chat.session.abc"),
        token.allows_topic("sub", "chat.session.a.b"),
        token.allows_topic("pub", "agent.bot.events"),
        token.allows_topic("pub", "chat.session.x"),
    ]


@pytest.mark.parametrize(
    ("scope", "pattern", "allowed"),
    [
        ("chat.**", "chat.*", True),
        ("chat.**", "chat.**", True),
        ("chat.*", "chat.**", False),
        ("chat.*", "chat.a", True),
        ("a.**", "a.*.c", True),
        ("a.**.b", "a.**", False),
        ("**", "anything.**", True),
        ("chat.*", "*.x", False),
    ],
)
def test_wildcard_subscriptions_must_stay_inside_the_scope(
    scope: str, pattern: str, allowed: bool
) -> None:
    """A wildcard subscription is allowed only if every topic it matches is in scope."""
    assert allowed == issue(f"sub:{scope}").allows_subscription(pattern)


@pytest.mark.parametrize("bad", ["chat", "read:chat", "sub:chat..x", "pub:a@1", "call:x@1.2.3"])
def test_bad_scopes_refused(bad: str) -> None:
    """Malformed scopes are refused when issuing."""
    with pytest.raises(BadRequest):
        Scope.parse(bad)
