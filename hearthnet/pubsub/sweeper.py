"""One task for every pub/sub session's timers (spec §3.6, §2.2, §6.6): pings, missed
pongs, idle close, token expiry and SSE keepalives for all sessions, instead of a timer
task per socket; presence expiry rides on the same tick.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from hearthnet.clock import now_ms
from hearthnet.pubsub.service import PubSub
from hearthnet.transport.keepalive import CLOSE_TOKEN_EXPIRED

TOKEN_WARNING_MS = 60_000
# Why a token session ends at its deadline: its own expiry, unless a key rotation set an
# earlier deadline (then ``token_end`` says so; the close code is 4401 either way).
EXPIRY_REASON = "token expired"


class SweptSession(Protocol):
    """What the sweeper asks of a session (WebSocket or SSE)."""

    def sweep(self, now: float, wall_ms: int) -> None:
        """Do whatever is due: pings, closes, token warnings, keepalive comments."""


def sweep_token(session: Any, wall_ms: int) -> bool:
    """Token expiry for any session with ``token_exp_ms``/``token_end``/``warned``/``sub``/
    ``hard_close`` (spec §2.2: ``auth.expiring`` 60 s before, close 4401 at expiry, the
    reason ``token_end``). True if it closed."""
    if session.token_exp_ms is None:
        return False
    if wall_ms >= session.token_exp_ms:
        session.hard_close(CLOSE_TOKEN_EXPIRED, session.token_end)
        return True
    sub = session.sub
    if (
        not session.warned
        and wall_ms >= session.token_exp_ms - TOKEN_WARNING_MS
        and sub is not None
    ):
        session.warned = True
        sub.send_control("auth.expiring", {"expires_ms": session.token_exp_ms})
        sub.wake()
    return False


class SessionSweeper:
    """One task for every pub/sub session's timers (pings, pongs, idle, tokens, presence)."""

    def __init__(self, service: PubSub, *, tick_s: float) -> None:
        self.service = service
        self.tick_s = tick_s
        self.sessions: set[SweptSession] = set()

    def add(self, session: SweptSession) -> None:
        """Start looking after a session."""
        self.sessions.add(session)

    def remove(self, session: SweptSession) -> None:
        """Stop looking after a session."""
        self.sessions.discard(session)

    async def run(self) -> None:
        """The sweep loop (owned by the node's task group)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.tick_s)
            now, wall = loop.time(), now_ms()
            for session in list(self.sessions):
                session.sweep(now, wall)
            self.service.presence_hub.expire()
