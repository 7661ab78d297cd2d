"""Live client sessions by who they belong to, so a revocation can end them (spec §1.5:
revocation takes effect mesh-wide within 10 s, sessions included), and a topic key
rotation can give their tokens a deadline."""

from __future__ import annotations

from collections.abc import Callable
from itertools import count

from hearthnet.caller import Caller
from hearthnet.errors import WireError
from hearthnet.tokens import CapabilityToken

Closer = Callable[[WireError], None]
# A session that can be told its token ends at a wall-clock ms, and why: it warns the
# client (``auth.expiring``) and closes as at token expiry, with that reason, unless a
# fresh token arrives.
Expirer = Callable[[int, str], None]
TokenTest = Callable[[CapabilityToken], bool]


class SessionRegistry:
    """Streams and sockets that belong to an identity (or to tokens of an issuer)."""

    def __init__(self) -> None:
        self._sessions: dict[int, tuple[Caller, Closer]] = {}
        self._expirers: dict[int, Expirer] = {}
        self._keys = count(1)

    def __len__(self) -> int:
        return len(self._sessions)

    def add(self, caller: Caller, close: Closer, expire: Expirer | None = None) -> int:
        """Register a session; keep the key to :meth:`remove` it when it ends. ``expire``:
        the session can take a new token deadline (pub/sub WebSocket and SSE)."""
        key = next(self._keys)
        self._sessions[key] = (caller, close)
        if expire is not None:
            self._expirers[key] = expire
        return key

    def update(self, key: int, caller: Caller) -> None:
        """A session now runs on new credentials (a refreshed token): revoking the new
        token ends it, revoking the old one no longer does."""
        entry = self._sessions.get(key)
        if entry is not None:
            self._sessions[key] = (caller, entry[1])

    def remove(self, key: int) -> None:
        """Forget a session that ended."""
        self._sessions.pop(key, None)
        self._expirers.pop(key, None)

    def expire_tokens(self, voided: TokenTest, deadline_ms: int, reason: str) -> int:
        """Give every session whose token ``voided`` says is void the deadline
        ``deadline_ms`` (ending then for ``reason``), where the session can take one;
        returns how many."""
        due = [
            expire
            for k, expire in self._expirers.items()
            if (token := self._sessions[k][0].token) is not None and voided(token)
        ]
        for expire in due:
            expire(deadline_ms, reason)
        return len(due)

    def close_voided(self, voided: TokenTest, error: WireError) -> int:
        """End sessions still on a void token that cannot take a deadline (long-polls and
        bus streams, at the end of a rotation's grace); returns how many."""
        doomed = [
            (k, close)
            for k, (caller, close) in self._sessions.items()
            if k not in self._expirers and caller.token is not None and voided(caller.token)
        ]
        return self._close(doomed, error)

    def close_identity(self, identity: str, error: WireError) -> int:
        """End every session of ``identity`` and of tokens it issued; returns how many."""
        doomed = [
            (k, close)
            for k, (caller, close) in self._sessions.items()
            if caller.identity == identity
            or (caller.token is not None and caller.token.iss == identity)
        ]
        return self._close(doomed, error)

    def close_token(self, iss: str, jti: str, error: WireError) -> int:
        """End every session using one revoked token."""
        doomed = [
            (k, close)
            for k, (caller, close) in self._sessions.items()
            if caller.token is not None and (caller.token.iss, caller.token.jti) == (iss, jti)
        ]
        return self._close(doomed, error)

    def _close(self, doomed: list[tuple[int, Closer]], error: WireError) -> int:
        for key, close in doomed:
            self._sessions.pop(key, None)
            self._expirers.pop(key, None)
            close(error)
        return len(doomed)
