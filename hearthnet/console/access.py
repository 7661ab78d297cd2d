"""Console tokens: what ``hearthnet console`` prints in its login URL, and their refresh.

A console token is an ordinary capability token (spec §1.6), issued by the node's own
key, with the extra scope ``{"console": "node"}`` (read this node's console data) and the
scopes the console's pages use: subscribe to every topic (the live tail; the access rules
still apply), publish to ``chat.**`` (the chat room) and call ``llm.chat@2``.

The login token lives :data:`LOGIN_TTL_MS` (a link that leaks from a terminal's scroll-back
is soon worthless). The page trades it at once, and then before each expiry, for a token
with the same ``jti`` and ``sub`` that lives :data:`SESSION_TTL_MS`; keeping the ``jti``
makes one ``hearthnet token revoke`` end the whole console session, whichever token it
holds. A session ends :data:`SESSION_MAX_MS` after its login token was issued (the
``jti`` is a ULID and carries that time). Pure.
"""

from __future__ import annotations

from typing import Any

from hearthnet.errors import Expired, Forbidden
from hearthnet.identity import KeyPair
from hearthnet.ids import new_ulid, ulid_time_ms
from hearthnet.tokens import CapabilityToken, Scope

CONSOLE_SCOPE = Scope("console", "node")
CONSOLE_SCOPES = (
    CONSOLE_SCOPE,
    Scope("sub", "**"),
    Scope("pub", "chat.**"),
    Scope("call", "llm.chat@2"),
)
LOGIN_TTL_MS = 15 * 60_000
SESSION_TTL_MS = 60 * 60_000
SESSION_MAX_MS = 24 * 3600_000


def is_console_token(token: CapabilityToken) -> bool:
    """Whether ``token`` opens the console."""
    return CONSOLE_SCOPE in token.scopes


def login_token(keys: KeyPair, community: str, now_ms: int, ttl_ms: int = LOGIN_TTL_MS) -> str:
    """A fresh console login token (``hnt1:...``) signed by ``keys``."""
    token = CapabilityToken.issue(
        keys,
        community=community,
        scopes=list(CONSOLE_SCOPES),
        ttl_ms=ttl_ms,
        now_ms=now_ms,
        sub=f"console-{new_ulid(now_ms)[-8:].lower()}",
    )
    return token.encode()


def session_token(keys: KeyPair, current: CapabilityToken, now_ms: int) -> CapabilityToken:
    """The next token of a console session: same ``jti``, ``sub`` and scopes, valid for
    :data:`SESSION_TTL_MS` more, never past the session's end.

    Raises:
        Forbidden: not a console token, or not one this node issued.
        Expired: the session is over.
    """
    if not is_console_token(current):
        raise Forbidden("only console tokens are refreshed here")
    if current.iss != keys.node_id:
        raise Forbidden("this node refreshes only the console tokens it issued")
    try:
        session_end = ulid_time_ms(current.jti) + SESSION_MAX_MS
    except ValueError:
        raise Forbidden("a console token's jti is a ULID") from None
    if now_ms >= session_end:
        raise Expired("the console session is over; run `hearthnet console` again")
    body: dict[str, Any] = {
        "iss": keys.node_id,
        "sub": current.sub,
        "community": current.community,
        "scopes": [s.to_json() for s in current.scopes],
        "exp_ms": min(now_ms + SESSION_TTL_MS, session_end),
        "jti": current.jti,
        "iat_ms": now_ms,
    }
    body["sig"] = keys.sign_object(body)
    return CapabilityToken.from_json(body)
