"""Frames of relayed paths leaving within the relays' budgets (spec §8). Pure.

:class:`PacedRelease` takes the frames waiting in each peer's sequence
(:mod:`hearthnet.mesh.pathseq`) while the budget of the relay they go through allows
(:class:`~hearthnet.mesh.pacing.Pacer`); what does not fit waits, and
:attr:`PacedRelease.release_at` names the moment the first of it fits, when the glue
calls :meth:`PacedRelease.release` (which, like ``PathCore.tick``, shares a relay's budget
out a frame per peer in turn, so one busy peer starves no other).
"""

from __future__ import annotations

from hearthnet.mesh.pacing import Pacer
from hearthnet.mesh.path_state import Action, PathState, PathStats, PeerState, Transmit


class PacedRelease:
    """The paced sending of :class:`~hearthnet.mesh.paths.PathCore`'s peers."""

    def __init__(self, peers: dict[str, PeerState], pacer: Pacer, stats: PathStats) -> None:
        self._peers = peers  # the path core's, by NodeID
        self.pacer = pacer
        self.stats = stats
        # the earliest moment a frame waiting for a relay's budget fits it: call
        # :meth:`release` then (None: nothing waits for the budget)
        self.release_at: float | None = None

    def flush(self, p: PeerState, now: float, *, one: bool = False) -> list[Action]:
        """Frames of ``p`` waiting to go, while its path's budget allows (``one``: at most
        one, for sharing a relay's budget in turn)."""
        actions: list[Action] = []
        if p.state is PathState.DOWN:
            return actions
        via = p.path
        while (size := p.out.next_size()) is not None:
            if via is not None and not self.pacer.admit(via, size, now):
                at = now + self.pacer.wait(via, size, now)  # when it fits: release it then
                self.release_at = at if self.release_at is None else min(self.release_at, at)
                break
            frame, resent = p.out.take(now)
            self.stats.resent += resent
            actions.append(Transmit(p.node, via, frame))
            if one:
                break
        return actions

    def release(self, now: float) -> list[Action]:
        """Frames waiting for a relay's budget that fit it now (at :attr:`release_at`, and
        on every tick); a relay's budget goes a frame per peer in turn, so one busy peer
        starves no other."""
        self.release_at = None
        actions: list[Action] = []
        waiting = [p for p in self._peers.values() if p.out.waiting]
        while waiting:
            sent = [(p, self.flush(p, now, one=True)) for p in waiting]
            waiting = [p for p, f in sent if f]
            for _, f in sent:
                actions += f
        return actions
