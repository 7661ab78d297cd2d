"""A peer's sequence held after its direct link died with no relay to fall back to (spec
§8: the link moves "without losing or duplicating a frame"). Pure.

Within a switch, or while the relayed sequence is kept (:mod:`hearthnet.mesh.path_switch`),
a dying direct link falls back to the relay. An end with no relay attached at that moment
(every relay lost since the switch) cannot fall back; forgetting the sequence then would
drop the frames it sent and the peer did not acknowledge, and the receiving side's count
(so a resend from the peer would be handed on twice). Instead the sequence is **held**:

- the path core moves the peer ``DOWN`` (:meth:`PathCore.direct_down` with no relay),
  which keeps both sides of the sequence (frames unacknowledged, the count of frames
  delivered), and what is sent to the peer meanwhile waits in it;
- the next link with the peer within :data:`HOLD_S` takes it up: a re-dialled direct
  link continues the sequence like a switch (everything unacknowledged resent on it
  first, in order; :meth:`PathSwitch.direct_serves`), a relay attached later carries it
  as any relayed path (:meth:`PathCore.relay_attached` resends it all);
- after :data:`HOLD_S` with no link, or past :data:`MAX_HELD` peers held (the longest
  held goes first), the sequence is forgotten as before.

Calls on the dead link end with it (no link took its place); what the sequence carries
besides (gossip, membership, presence) arrives once, in order, if the peer comes back in
time. The peer is not asked whether it restarted meanwhile: a peer that did takes the
resent frames as a new sequence (:class:`~hearthnet.mesh.pathseq.Inbound`), as it takes a
relayed sequence resent after a restart.
"""

from __future__ import annotations

from collections.abc import Callable

from hearthnet.mesh.path_state import Action, PathState
from hearthnet.mesh.paths import PathCore

HOLD_S = 10.0  # as long as a switch takes to retire (path_switch.RETIRE_S)
MAX_HELD = 256  # peers whose sequence is held at once


class HeldSequences:
    """The peers whose sequence waits for the next link; ``forget`` ends one (the
    relaying glue's: sequence and relay session)."""

    def __init__(self, paths: PathCore, forget: Callable[[str], None]) -> None:
        self.paths = paths
        self.forget = forget
        self._until: dict[str, float] = {}  # peer -> when its held sequence is forgotten
        self.held = 0  # sequences held when a direct link died with no relay
        self.resumed = 0  # of them, taken up by a re-dialled link or a relay attached later
        self.expired = 0  # of them, forgotten with no link in time

    def __contains__(self, peer: object) -> bool:
        return peer in self._until

    def hold(self, peer: str, now: float) -> list[Action]:
        """``peer``'s direct link died with no relay to fall back to: keep its sequence
        for :data:`HOLD_S` (the path core's actions to carry out)."""
        if peer not in self._until and len(self._until) >= MAX_HELD:
            oldest = min(self._until, key=self._until.__getitem__)
            self._end(oldest)
        self._until[peer] = now + HOLD_S
        self.held += 1
        return self.paths.direct_down(peer, now)

    def resume(self, peer: str) -> bool:
        """A link with ``peer`` takes its sequence up; False when none was held."""
        if self._until.pop(peer, None) is None:
            return False
        self.resumed += 1
        return True

    def tick(self, now: float) -> None:
        """Held sequences whose time is up: forgotten if no path took them, else resumed
        (a relay attached meanwhile carries them)."""
        for peer, at in list(self._until.items()):
            if now < at:
                continue
            if self.paths.path(peer)[0] is PathState.DOWN:
                self._end(peer)
            else:
                self.resume(peer)

    def _end(self, peer: str) -> None:
        del self._until[peer]
        self.expired += 1
        self.forget(peer)

    def forgotten(self, peer: str) -> None:
        """The peer's sequence ended otherwise (it left, or a relayed link of it ended)."""
        self._until.pop(peer, None)
