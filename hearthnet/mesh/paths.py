"""A member's paths to its peers (spec §8): relayed, upgrading, direct. Pure.

Feed :class:`PathCore` what happens (relays attached or lost, direct links up or down,
frames from peers, punch results) and the clock (:meth:`PathCore.tick`, every ~0.5 s);
carry out what it returns:

- :class:`Transmit` ``(peer, via, frame)``: send ``frame`` to ``peer`` on the direct link
  (``via`` None), or sealed in the peer's relay session inside a ``route`` through the
  attached relay ``via``;
- :class:`Deliver` ``(peer, frame)``: a peer-link frame from ``peer``, in order, once;
- :class:`StartPunch` ``(peer, nonce, addrs, at)``: at time ``at``, open TCP to ``addrs``
  from the local port the node listens on (simultaneous open); then report
  :meth:`~PathCore.direct_up` or :meth:`~PathCore.punch_failed`;
- :class:`AttachRelay` / :class:`DetachRelay` ``(relay)``: open or end an attachment;
  report :meth:`~PathCore.relay_attached` or :meth:`~PathCore.relay_lost`;
- :class:`PathChanged` ``(peer, state, via)``: for ``hearthnet peers``, heartbeats, metrics.

Per peer the path is data (:class:`PathState`, :data:`TRANSITIONS`):

- ``DOWN -> RELAYED(via)`` when a relay is attached, ``DOWN -> DIRECT`` when a direct
  link comes up;
- ``RELAYED -> UPGRADING -> DIRECT`` when a punch succeeds (the relay kept as fallback),
  ``UPGRADING -> RELAYED`` when it fails;
- ``DIRECT -> RELAYED(fallback)`` when the direct link dies; ``RELAYED -> RELAYED`` when
  the relay changes; any state ``-> DOWN`` when no path is left.

Direct upgrade (the lower NodeID leads; like DCUtR): ``candidates {nonce, addrs}`` through
the relay, the answer's arrival measures the RTT, then ``punch {nonce, in_ms}`` and both
ends start the simultaneous open at the same moment (:class:`UpgradeStep`, kept by
:class:`DirectUpgrade`). A failure or no direct link within ``upgrade_timeout_s`` leaves
the peer relayed and retries after an exponential backoff with jitter (symmetric NATs keep
failing, so they are tried rarely).
Frames for a peer are numbered across paths (:mod:`hearthnet.mesh.pathseq`), so a switch
loses and duplicates nothing.

Pacing (spec §8 budgets, :mod:`hearthnet.mesh.pacing`): what goes through a relay that
granted a budget (fed to ``PathCore.pacer``) leaves at that rate; frames beyond it wait
in the peer's sequence and go as the budget refills (:attr:`PathCore.paced`,
:mod:`hearthnet.mesh.path_release`): ``paced.release_at`` is the
moment the first of them fits, when the glue calls ``paced.release`` (which, like
:meth:`PathCore.tick`, shares the budget out a frame per peer in turn). Back-pressure:
a frame :meth:`PathCore.send` may shed (a gossip message: anti-entropy brings it later)
is dropped and counted while the peer's held frames are over ``shed_bytes``, so a member
publishing far over its budget keeps its link; anything else waits, up to the
sequence's bound.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from hearthnet.errors import CapacityExceeded
from hearthnet.mesh.pacing import Pacer
from hearthnet.mesh.path_frames import Candidates, Drain, PAck, PathFrame, PFrame, Punch, Upgrade
from hearthnet.mesh.path_release import PacedRelease
from hearthnet.mesh.path_state import (
    TRANSITIONS,
    UPGRADE_TRANSITIONS,
    Action,
    Deliver,
    PathChanged,
    PathConfig,
    PathSnapshot,
    PathState,
    PathStats,
    PeerState,
    StartPunch,
    Transmit,
    UpgradeStep,
)
from hearthnet.mesh.pathseq import Outbound
from hearthnet.mesh.relay_choice import (
    AttachRelay,
    DetachRelay,
    RelayChoice,
    RelayChoiceConfig,
)
from hearthnet.mesh.upgrade import DirectUpgrade

__all__ = [
    "TRANSITIONS",
    "UPGRADE_TRANSITIONS",
    "Action",
    "AttachRelay",
    "Deliver",
    "DetachRelay",
    "DirectUpgrade",
    "PathChanged",
    "PathConfig",
    "PathCore",
    "PathSnapshot",
    "PathState",
    "StartPunch",
    "Transmit",
    "UpgradeStep",
    "describe",
]


class PathCore:
    """This node's paths to the peers it reaches through relays. Pure: time is ``now``."""

    def __init__(
        self,
        node_id: str,
        relays: Sequence[str],
        *,
        config: PathConfig | None = None,
        rng: random.Random | None = None,
        relay_config: RelayChoiceConfig | None = None,
        epoch: int = 0,
    ) -> None:
        self.node_id = node_id
        self.epoch = epoch  # this process's start (ms): our sequences restart with it
        self.config = config or PathConfig()
        self.rng = rng or random.Random()
        self.relays = RelayChoice(relays, relay_config or RelayChoiceConfig(), self.rng)
        self.stats = PathStats()
        self.upgrade = DirectUpgrade(node_id, self.config, self.rng, self.relays, self.stats)
        self.pacer = Pacer()
        self._peers: dict[str, PeerState] = {}
        # frames leave within the relays' budgets; the rest wait for ``paced.release_at``
        self.paced = PacedRelease(self._peers, self.pacer, self.stats)

    # -- views ---------------------------------------------------------------------------

    def statistics(self) -> PathSnapshot:
        """A frozen snapshot of the counters and of how many peers are on each path."""
        on: dict[PathState, int] = dict.fromkeys(PathState, 0)
        for p in self._peers.values():
            on[p.state] += 1
        st = self.stats
        pace = self.pacer.snapshot()
        return PathSnapshot(
            direct=on[PathState.DIRECT],
            relayed=on[PathState.RELAYED],
            upgrading=on[PathState.UPGRADING],
            down=on[PathState.DOWN],
            upgrades_tried=st.upgrades_tried,
            upgrades_succeeded=st.upgrades_succeeded,
            resent=st.resent,
            duplicates=sum(p.inb.duplicates for p in self._peers.values()),
            stale_upgrade_frames=st.stale_upgrade_frames,
            queued_frames=sum(p.out.waiting for p in self._peers.values()),
            queued_bytes=sum(p.out.held_bytes for p in self._peers.values()),
            paced_bytes=pace.paced_bytes,
            shed=st.shed,
            pace_refusals=pace.refusals,
        )

    def path(self, peer: str) -> tuple[PathState, str | None]:
        """``(state, via)`` for ``peer`` (``via`` is the fallback relay while direct)."""
        p = self._peers.get(peer)
        if p is None:
            return (PathState.DOWN, None)
        return (p.state, p.fallback if p.state is PathState.DIRECT else p.via)

    def settled(self, peer: str, upto: int | None = None) -> bool:
        """Whether ``peer`` acknowledged every frame sent to it (with ``upto``: every
        frame up to that number) and none of them waits to go (again), so frames sent
        outside the sequence now arrive after all of them."""
        p = self._peers.get(peer)
        if p is None:
            return True
        if upto is not None:
            return p.out.acked >= upto and not p.out.waiting
        return p.out.unacked == 0 and p.out.waiting == 0

    def numbers(self, peer: str) -> tuple[int, int | None]:
        """The last number of our sequence to ``peer`` handed out (0 for none), and the
        epoch of ``peer``'s sequence we follow (None before its first numbered frame: a
        later one means the peer started its sequence afresh)."""
        p = self._peers.get(peer)
        return (0, None) if p is None else (p.out.last, p.inb.epoch)

    def forget(self, peer: str) -> None:
        """Drop everything about ``peer`` (it left the community, or is no longer wanted)."""
        self._peers.pop(peer, None)

    def _peer(self, peer: str) -> PeerState:
        p = self._peers.get(peer)
        if p is None:
            if len(self._peers) >= self.config.max_peers:
                raise CapacityExceeded(f"paths to {self.config.max_peers} peers already kept")
            p = self._peers[peer] = PeerState(peer, out=Outbound(epoch=self.epoch))
        return p

    # -- the path state machine ----------------------------------------------------------

    def _switch(
        self, p: PeerState, to: PathState, via: str | None, now: float, *, old_alive: bool
    ) -> list[Action]:
        """Move ``p`` to a new path; spec §8: nothing lost or duplicated on the way."""
        was_down = p.state is PathState.DOWN
        old_path = p.path
        actions = p.move(to, via)
        if to is PathState.DOWN:
            return actions  # frames wait in the sequence for the next path
        if not was_down and old_alive and old_path != p.path:
            # what the old path carries arrives before the drain; its ack tells what it lost
            actions.append(Transmit(p.node, old_path, p.out.drain()))
        elif was_down or not old_alive:
            p.out.resend_all(now, later=True)
        return actions + self.paced.flush(p, now)

    def connect(self, peer: str, now: float) -> list[Action]:
        """Start keeping a path to ``peer`` (through the primary relay until direct)."""
        p = self._peer(peer)
        if p.state is PathState.DOWN and self.relays.primary is not None:
            p.next_upgrade = now
            return self._switch(p, PathState.RELAYED, self.relays.primary, now, old_alive=False)
        return []

    def relay_attached(
        self, relay: str, observed_addr: str | None, rtt: float, now: float
    ) -> list[Action]:
        """``relay`` answered ``attached``: peers without a path start relayed through it."""
        self.relays.attached(relay, observed_addr, rtt, now)
        actions: list[Action] = []
        for p in self._peers.values():
            if p.state is PathState.DOWN:
                p.next_upgrade = now
                actions += self._switch(p, PathState.RELAYED, relay, now, old_alive=False)
            elif p.state is PathState.DIRECT and p.fallback is None:
                p.fallback = relay
        return actions

    def relay_lost(self, relay: str, now: float) -> list[Action]:
        """The link to ``relay`` died or it detached us: its peers move to another relay
        (everything unacknowledged resent), or down."""
        self.relays.lost(relay, now)
        self.pacer.forget(relay)
        return self.leave_relay(relay, now, alive=False)

    def leave_relay(
        self,
        relay: str,
        now: float,
        *,
        alive: bool,
        peer: str | None = None,
        to: str | None = None,
    ) -> list[Action]:
        """The peers on ``relay`` (only ``peer``, if given) move to relay ``to`` (by
        default the primary), or down with none: through a relay still ``alive`` the old
        path is drained, else everything unacknowledged is resent on the new one."""
        nxt = to if to is not None else self.relays.primary
        actions: list[Action] = []
        for p in self._peers.values():
            if peer is not None and p.node != peer:
                continue
            if p.state is PathState.DIRECT:
                if p.fallback == relay:
                    p.fallback = nxt
                continue
            if p.via != relay:
                continue
            if p.attempt is not None and p.state is PathState.UPGRADING:
                actions += self.upgrade.fail(p, now, move=False)
            target = PathState.RELAYED if nxt is not None else PathState.DOWN
            actions += self._switch(p, target, nxt, now, old_alive=alive)
        return actions

    def direct_up(self, peer: str, now: float) -> list[Action]:
        """A direct link to ``peer`` finished its handshake (dialled, accepted or punched):
        frames move to it, the relay stays as fallback."""
        p = self._peer(peer)
        if p.state is PathState.DIRECT:
            return []
        actions: list[Action] = []
        fallback = p.via if p.via is not None else self.relays.primary
        actions += self._switch(p, PathState.DIRECT, None, now, old_alive=p.via is not None)
        p.fallback = fallback
        actions += self.upgrade.ended(p)
        return actions

    def direct_down(self, peer: str, now: float) -> list[Action]:
        """The direct link to ``peer`` died: back to the relay, unacknowledged frames resent."""
        p = self._peers.get(peer)
        if p is None or p.state is not PathState.DIRECT:
            return []
        via = p.fallback if p.fallback is not None else self.relays.primary
        p.fallback = None
        p.next_upgrade = now + self.config.upgrade_retry_s
        target = PathState.RELAYED if via is not None else PathState.DOWN
        return self._switch(p, target, via, now, old_alive=False)

    def renewed(self, peer: str, now: float) -> list[Action]:
        """``peer`` opened a new relayed session in place of ours (it forgot the old one:
        it restarted, or ended its relayed path): every frame it has not acknowledged may
        have been sealed under keys it no longer holds and refused, so all of them go
        again now, in order, rather than ``retransmit_s`` after they were sent. The peer
        skips those it had acknowledged (``pframe.a``); as with any resend to a peer that
        forgot its side, one it handed on but had not yet acknowledged comes twice."""
        p = self._peers.get(peer)
        if p is None or p.state is PathState.DOWN:
            return []
        p.out.resend_all(now, later=True)
        return self.paced.flush(p, now)

    # -- frames ----------------------------------------------------------------------------

    def send(self, peer: str, frame: bytes, now: float, *, sheddable: bool = False) -> list[Action]:
        """Send a peer-link frame to ``peer`` on its current path (kept for resending; while
        the peer is down, or its relay's budget is spent, it waits). A ``sheddable`` frame
        (gossip) is dropped instead while the peer's waiting frames are over the bounds
        (``shed_bytes``, ``shed_frames``).

        Raises:
            Unavailable: the peer has not acknowledged ``MAX_UNACKED`` frames.
            CapacityExceeded: a new peer while paths to ``max_peers`` are kept.
        """
        p = self._peer(peer)
        out = p.out
        if sheddable and (
            out.held_bytes >= self.config.shed_bytes
            or out.waiting + out.unacked >= self.config.shed_frames
        ):
            self.stats.shed += 1
            return []
        if not out.waiting and p.state is not PathState.DOWN:  # nothing ahead of it
            via = p.path
            if via is None or self.pacer.admit(via, len(frame), now):
                return [Transmit(peer, via, out.send(frame, now))]
        out.hold(frame)
        if p.state is PathState.DOWN:
            return self.connect(peer, now)  # sends it, and all before it, once a relay is up
        return self.paced.flush(p, now)

    def send_unsequenced(self, peer: str, frame: bytes, now: float) -> list[Action]:
        """Send ``frame`` to ``peer`` outside the sequence (a heartbeat: lost if the path
        loses it); to a peer without a path it goes in the sequence, which opens one."""
        p = self._peers.get(peer)
        if p is None or p.state is PathState.DOWN:
            return self.send(peer, frame, now)
        return [Transmit(peer, p.path, p.out.unsequenced(frame))]

    def receive(self, peer: str, frame: PathFrame, now: float) -> list[Action]:
        """A path frame from ``peer`` (opened from its relay session, or off the direct link).

        Raises:
            CapacityExceeded: a new peer while paths to ``max_peers`` are kept.
        """
        p = self._peer(peer)
        # it reached us while down: keep a path back for its acks
        early = self.connect(peer, now) if p.state is PathState.DOWN else []
        if isinstance(frame, PFrame):
            frames, ack = p.inb.receive(frame)
            actions: list[Action] = [Deliver(peer, f) for f in frames]
            if ack is not None and p.state is not PathState.DOWN:
                actions.append(Transmit(peer, p.path, ack))
            return early + actions
        if isinstance(frame, PAck):
            p.out.ack(frame, now, later=True)
            return early + self.paced.flush(p, now)
        if isinstance(frame, Drain):
            ack = p.inb.drain(frame)
            return early + ([] if p.state is PathState.DOWN else [Transmit(peer, p.path, ack)])
        if isinstance(frame, Candidates):
            return early + self.upgrade.candidates(p, frame, now)
        if isinstance(frame, Punch):
            return early + self.upgrade.punch(p, frame, now)
        if isinstance(frame, Upgrade):
            return early  # the punched link's first frame: direct_up already moved the path
        raise ValueError(f"{frame.KIND} is not a path frame")

    def punch_failed(self, peer: str, nonce: str, now: float) -> list[Action]:
        """The simultaneous open of attempt ``nonce`` failed: stay relayed, retry later."""
        p = self._peers.get(peer)
        if p is None or p.attempt is None or p.attempt.nonce != nonce:
            return []
        return self.upgrade.fail(p, now, move=True)

    # -- time --------------------------------------------------------------------------------

    def tick(self, now: float) -> list[Action]:
        """Relay attachments, upgrade timeouts and starts, resends and owed acks."""
        actions: list[Action] = []
        for change in self.relays.tick(now):
            if isinstance(change, DetachRelay):  # drain through it before it goes
                actions += self.leave_relay(change.relay, now, alive=True)
            actions.append(change)
        for p in self._peers.values():
            actions += self.upgrade.due(p, now)
            if p.state is PathState.DOWN:
                continue
            p.out.due(now, later=True)
            if p.inb.owed:
                actions.append(Transmit(p.node, p.path, p.inb.ack()))
        return actions + self.paced.release(now)


def describe(core: PathCore, peer: str) -> str:
    """Where ``peer``'s path and sequences stand, for debug logs (path_switch.py): the
    path, our sequence (last number sent, acknowledged, unacknowledged, waiting to go,
    the drain awaiting its answer) and the peer's (epoch followed, handed on, held ahead)."""
    p = core._peers.get(peer)  # the module's own class
    if p is None:
        return "no path kept"
    out, inb = p.out, p.inb
    where = p.fallback if p.state is PathState.DIRECT else p.via
    return (
        f"{p.state.value} via {where}; sent {out.last} acked {out.acked} unacked {out.unacked}"
        f" waiting {out.waiting} drained {out.drained} (epoch {out.epoch}); followed"
        f" {inb.epoch} delivered {inb.delivered} ahead {inb.ahead}"
    )
