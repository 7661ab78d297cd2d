"""The direct upgrade's bookkeeping (spec §8, hole punching; DCUtR is the model): who
leads, when both ends punch, and the backoff after a failure. Pure; part of
:class:`~hearthnet.mesh.paths.PathCore`."""

from __future__ import annotations

import random

from hearthnet.mesh.path_frames import Candidates, Punch, Upgrade
from hearthnet.mesh.path_state import (
    Action,
    Attempt,
    PathConfig,
    PathState,
    PathStats,
    PeerState,
    StartPunch,
    Transmit,
    UpgradeStep,
)
from hearthnet.mesh.relay_choice import RelayChoice, backoff


class DirectUpgrade:
    """The direct-upgrade bookkeeping of a :class:`PathCore` (spec §8): one attempt per
    peer (:class:`UpgradeStep`), who leads, when both ends punch, and the backoff after a
    failure. Pure; it moves a peer only between RELAYED and UPGRADING, and the path core
    makes every other switch."""

    def __init__(
        self,
        node_id: str,
        config: PathConfig,
        rng: random.Random,
        relays: RelayChoice,
        stats: PathStats,
    ) -> None:
        self.node_id = node_id
        self.config = config
        self.rng = rng
        self.relays = relays  # our candidates: the addresses the attached relays observed
        self.stats = stats  # shared with the path core

    def due(self, p: PeerState, now: float) -> list[Action]:
        """The clock for ``p``: an attempt past ``upgrade_timeout_s`` fails, and a relayed
        peer whose backoff is over gets a new one."""
        a = p.attempt
        if a is not None and now - a.started > self.config.upgrade_timeout_s:
            return self.fail(p, now, move=True)
        if a is None and p.state is PathState.RELAYED and now >= p.next_upgrade:
            return self.start(p, now)
        return []

    def punch(self, p: PeerState, frame: Punch, now: float) -> list[Action]:
        """The leader's ``punch``: the follower starts its simultaneous open in ``in_ms``."""
        a = p.attempt
        if a is None or a.nonce != frame.nonce or a.step is not UpgradeStep.ANSWERED:
            self.stats.stale_upgrade_frames += 1
            return []
        a.move(UpgradeStep.SCHEDULED)
        return [StartPunch(p.node, a.nonce, a.theirs, now + frame.in_ms / 1000)]

    def ended(self, p: PeerState) -> list[Action]:
        """A direct link to ``p`` is up: a punch that was scheduled succeeded (its first
        frame tells the peer), and any attempt ends."""
        attempt, p.attempt = p.attempt, None
        if attempt is None or attempt.step is not UpgradeStep.SCHEDULED:
            return []
        attempt.move(UpgradeStep.SUCCEEDED)
        self.stats.upgrades_succeeded += 1
        p.upgrade_failures = 0
        return [Transmit(p.node, None, Upgrade(attempt.nonce))]

    def candidates(self, p: PeerState, frame: Candidates, now: float) -> list[Action]:
        """The peer's ``candidates``: the leader schedules the punch, the follower answers
        with its own (a frame of no current attempt is stale and counted)."""
        a = p.attempt
        ours = self.relays.observed_addrs()
        if a is not None and a.leader and a.nonce == frame.nonce and a.step is UpgradeStep.OFFERED:
            a.move(UpgradeStep.SCHEDULED)
            rtt = now - a.started
            delay = self.config.punch_delay_ms
            at = now + rtt / 2 + delay / 1000
            return [
                Transmit(p.node, p.via, Punch(a.nonce, delay)),
                StartPunch(p.node, a.nonce, frame.addrs, at),
            ]
        actions: list[Action] = []
        if a is not None and not a.leader and a.nonce != frame.nonce:
            # the leader gave up on that attempt and started another: follow the new one
            actions += self.fail(p, now, move=True)
        if p.state is not PathState.RELAYED or not ours or self.node_id < p.node:
            self.stats.stale_upgrade_frames += 1
            return actions
        p.attempt = Attempt(frame.nonce, False, now, UpgradeStep.ANSWERED, frame.addrs)
        self.stats.upgrades_tried += 1
        actions += p.move(PathState.UPGRADING, p.via)
        actions.append(Transmit(p.node, p.via, Candidates(frame.nonce, ours)))
        return actions

    def fail(self, p: PeerState, now: float, *, move: bool) -> list[Action]:
        """The attempt to ``p`` failed: retry after an exponential backoff with jitter (and
        back to RELAYED when ``move``)."""
        assert p.attempt is not None
        p.attempt.move(UpgradeStep.FAILED)
        p.attempt = None
        p.upgrade_failures += 1
        cfg = self.config
        wait = backoff(
            p.upgrade_failures, cfg.upgrade_retry_s, cfg.upgrade_retry_max_s, cfg.jitter, self.rng
        )
        p.next_upgrade = now + wait
        if move and p.state is PathState.UPGRADING:
            return p.move(PathState.RELAYED, p.via)
        return []

    def start(self, p: PeerState, now: float) -> list[Action]:
        """Offer our candidates to ``p`` when we lead (the lower NodeID) and have one."""
        ours = self.relays.observed_addrs()
        if not ours or self.node_id > p.node:
            return []  # the lower NodeID leads; without an observed address there is no punch
        nonce = f"{self.rng.getrandbits(64):016x}"
        p.attempt = Attempt(nonce, True, now, UpgradeStep.OFFERED)
        self.stats.upgrades_tried += 1
        actions = p.move(PathState.UPGRADING, p.via)
        actions.append(Transmit(p.node, p.via, Candidates(nonce, ours)))
        return actions
