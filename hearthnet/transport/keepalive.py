"""WebSocket liveness policy (spec §3.6): pings, missed pongs, idle close. Pure.

The glue calls :meth:`Keepalive.tick` at :meth:`Keepalive.next_deadline` and carries
out what it returns. Data frames in either direction reset the idle clock; pings and
pongs do not (a connection kept alive only by pings is idle).
"""

from __future__ import annotations

from dataclasses import dataclass

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_UNSUPPORTED_DATA = 1003
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_MISSED_PONGS = 4408
CLOSE_TOKEN_EXPIRED = 4401
CLOSE_TAKEN_OVER = 4409
# 4409's reasons: a newer connection took the durable consumer, or it was deleted
TAKEN_OVER_REASON, DELETED_REASON = "consumer taken over", "consumer deleted"
CLOSE_TRY_AGAIN = 1013


@dataclass(frozen=True, slots=True)
class SendPing:
    """Send a WebSocket ping now."""


@dataclass(frozen=True, slots=True)
class Close:
    """Close the socket with ``code``."""

    code: int
    reason: str


class Keepalive:
    """When to ping, and when a socket is dead or idle."""

    __slots__ = ("idle_s", "last_data", "missed_pongs", "next_ping", "ping_s", "unanswered")

    def __init__(self, *, now: float, ping_s: float, missed_pongs: int, idle_s: float) -> None:
        self.ping_s = ping_s
        self.missed_pongs = missed_pongs
        self.idle_s = idle_s
        self.last_data = now
        self.next_ping = now + ping_s
        self.unanswered = 0

    def ping_every(self, ping_s: float, now: float) -> None:
        """Ping every ``ping_s`` from now on; a ping due later than that comes sooner."""
        self.ping_s = ping_s
        self.next_ping = min(self.next_ping, now + ping_s)

    def data(self, now: float) -> None:
        """A data frame went either way."""
        self.last_data = now

    def pong(self) -> None:
        """The peer answered a ping."""
        self.unanswered = 0

    def next_deadline(self) -> float:
        """When :meth:`tick` next has something to do."""
        return min(self.next_ping, self.last_data + self.idle_s)

    def tick(self, now: float) -> SendPing | Close | None:
        """Decide what is due at ``now``."""
        if now >= self.last_data + self.idle_s:
            return Close(CLOSE_NORMAL, "idle")
        if now >= self.next_ping:
            if self.unanswered >= self.missed_pongs:
                return Close(CLOSE_MISSED_PONGS, "missed pongs")
            self.unanswered += 1
            self.next_ping = now + self.ping_s
            return SendPing()
        return None
