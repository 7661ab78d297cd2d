"""Live client sessions by who they belong to, so a revocation can end them (spec §1.5:
revocation takes effect mesh-wide within 10 s, sessions included)."""

from __future__ import annotations

from collections.abc import Callable
from itertools import count

from hearthnet.caller import Caller
from hearthnet.errors import WireError

Closer = Callable[[WireError], None]


class SessionRegistry:
    """Streams and sockets that belong to an identity (or to tokens of an issuer)."""

    def __init__(self) -> None:
        self._sessions: dict[int, tuple[Caller, Closer]] = {}
        self._keys = count(1)

    def __len__(self) -> int:
        return len(self._sessions)

    def add(self, caller: Caller, close: Closer) -> int:
        """Register a session; keep the key to :meth:`remove` it when it ends."""
        key = next(self._keys)
        self._sessions[key] = (caller, close)
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
            close(error)
        return len(doomed)
