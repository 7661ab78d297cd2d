"""Console tokens (hearthnet.console.access): pure, no sockets."""

from __future__ import annotations

import pytest

from hearthnet.console.access import (
    SESSION_MAX_MS,
    SESSION_TTL_MS,
    is_console_token,
    login_token,
    session_token,
)
from hearthnet.errors import Expired, Forbidden
from hearthnet.identity import KeyPair
from hearthnet.tokens import CapabilityToken, Scope

T0 = 1_800_000_000_000


def test_session_token_keeps_jti_and_sub() -> None:
    """The next token of a session keeps jti, sub and scopes and lives an hour."""
    keys = KeyPair.generate()
    login = CapabilityToken.decode(login_token(keys, keys.node_id, T0))
    fresh = session_token(keys, login, T0 + 1000)
    assert (login.jti, login.sub, login.scopes, T0 + 1000 + SESSION_TTL_MS, True) == (
        fresh.jti,
        fresh.sub,
        fresh.scopes,
        fresh.exp_ms,
        is_console_token(fresh),
    )


def test_session_ends_a_day_after_login() -> None:
    """No refresh past the session's end, and the last token stops at it."""
    keys = KeyPair.generate()
    login = CapabilityToken.decode(login_token(keys, keys.node_id, T0))
    last = session_token(keys, login, T0 + SESSION_MAX_MS - 10)
    with pytest.raises(Expired):
        session_token(keys, last, T0 + SESSION_MAX_MS)
    assert T0 + SESSION_MAX_MS == last.exp_ms


def test_only_own_console_tokens_are_refreshed() -> None:
    """A token without the console scope, or issued by another key, is refused."""
    keys, other = KeyPair.generate(), KeyPair.generate()
    plain = CapabilityToken.issue(
        keys, community=keys.node_id, scopes=[Scope("sub", "**")], ttl_ms=60_000, now_ms=T0
    )
    foreign = CapabilityToken.decode(login_token(other, keys.node_id, T0))
    refused = []
    for token in (plain, foreign):
        with pytest.raises(Forbidden):
            session_token(keys, token, T0)
        refused.append(token.jti)
    assert 2 == len(refused)
