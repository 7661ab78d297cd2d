"""A member's keepalive on the links to its relays (spec §8 failover, §11: traffic resumes
≤ 5 s after a relay dies). Pure.

A relay that dies without closing its connections (the process stopped, the route
blackholed: no RST, no FIN) would be noticed by the link's heartbeats only after three
missed pings (15 s by default). So every ``interval_s`` the member sends each attached
relay a ``ping`` (any frame back will do; the relay answers ``pong``), and a relay from
which no frame at all arrived for ``silence_s`` is lost: the member moves its relayed
peers to another attached relay at once, as when the link drops.

The glue counts the frames each relay's link delivered (:attr:`PeerLink.frames_in`) and
passes the counts to :meth:`RelayKeepalive.tick`; a count that moved is news from the relay.

Silence is measured on the member's own running time: when a tick comes more than
:data:`STALL_S` after the previous one, the member's event loop was stalled (a loaded
machine, a long synchronous step), the relay's answers may sit unread in the socket, and
the stall is not counted as the relay's silence. A relay that dies during such a stall is
noticed that much later. Why the defaults are what they are: docs/configuration.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KeepaliveConfig:
    """Times of the keepalive (``mesh.relay_keepalive_s``, ``mesh.relay_silence_s``)."""

    interval_s: float = 1.0
    silence_s: float = 3.0


# the glue ticks every 0.25 s; a tick this late means our own loop stood still
STALL_S = 1.0


@dataclass(slots=True)
class _Watched:
    frames: int  # the link's frame count when news last came
    heard: float  # when that was
    pinged: float  # when the last keepalive went out


@dataclass(frozen=True, slots=True)
class KeepaliveDue:
    """What one tick asks for: keepalives to send, relays gone silent (now unwatched)."""

    ping: tuple[str, ...] = ()
    silent: tuple[str, ...] = ()


class RelayKeepalive:
    """The relays a member is attached to, and when each was last heard from."""

    def __init__(self, config: KeepaliveConfig | None = None) -> None:
        self.config = config or KeepaliveConfig()
        self._relays: dict[str, _Watched] = {}
        self._last_tick: float | None = None
        self.stalls = 0  # ticks that came late: our loop stalled (not the relays' silence)

    def watch(self, relay: str, frames: int, now: float) -> None:
        """``relay`` attached us (its link has delivered ``frames`` so far)."""
        self._relays[relay] = _Watched(frames, now, now)

    def forget(self, relay: str) -> None:
        """``relay`` is no longer ours to watch (its link ended, or it detached us)."""
        self._relays.pop(relay, None)

    @property
    def watched(self) -> frozenset[str]:
        """The relays being watched."""
        return frozenset(self._relays)

    def tick(self, now: float, frames: Mapping[str, int]) -> KeepaliveDue:
        """Compare each watched relay's link frame count (``frames``; a relay missing
        from it has no link and is forgotten) with the last; return what is due."""
        cfg = self.config
        ping: list[str] = []
        silent: list[str] = []
        if self._last_tick is not None and now - self._last_tick > STALL_S:
            self.stalls += 1
            for w in self._relays.values():  # what they sent may not have been read yet
                w.heard += now - self._last_tick
        self._last_tick = now
        for relay, w in list(self._relays.items()):
            count = frames.get(relay)
            if count is None:
                del self._relays[relay]
                continue
            if count != w.frames:
                w.frames, w.heard = count, now
            elif now - w.heard >= cfg.silence_s:
                del self._relays[relay]
                silent.append(relay)
                continue
            if now - w.pinged >= cfg.interval_s:
                w.pinged = now
                ping.append(relay)
        return KeepaliveDue(tuple(ping), tuple(silent))
