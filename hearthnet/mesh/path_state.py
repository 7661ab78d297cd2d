"""The vocabulary of a member's paths to its peers (spec §8): path states and their
transitions, direct-upgrade steps, the path core's actions, its configuration and
counters, and what it keeps per peer. Pure; :mod:`hearthnet.mesh.paths` drives it."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from hearthnet.mesh.path_frames import PathFrame
from hearthnet.mesh.pathseq import MAX_UNACKED, Inbound, Outbound
from hearthnet.mesh.relay_choice import AttachRelay, DetachRelay


class PathState(enum.Enum):
    """How frames reach one peer."""

    DOWN = "down"
    RELAYED = "relayed"
    UPGRADING = "upgrading"
    DIRECT = "direct"


TRANSITIONS: dict[PathState, frozenset[PathState]] = {
    PathState.DOWN: frozenset({PathState.RELAYED, PathState.DIRECT}),
    PathState.RELAYED: frozenset(
        {PathState.RELAYED, PathState.UPGRADING, PathState.DIRECT, PathState.DOWN}
    ),
    PathState.UPGRADING: frozenset({PathState.DIRECT, PathState.RELAYED, PathState.DOWN}),
    PathState.DIRECT: frozenset({PathState.RELAYED, PathState.DOWN}),
}


class UpgradeStep(enum.Enum):
    """Where one direct-upgrade attempt is."""

    OFFERED = "offered"  # leader: our candidates sent, waiting for theirs
    ANSWERED = "answered"  # follower: their candidates answered, waiting for punch
    SCHEDULED = "scheduled"  # StartPunch issued
    SUCCEEDED = "succeeded"
    FAILED = "failed"


UPGRADE_TRANSITIONS: dict[UpgradeStep, frozenset[UpgradeStep]] = {
    UpgradeStep.OFFERED: frozenset({UpgradeStep.SCHEDULED, UpgradeStep.FAILED}),
    UpgradeStep.ANSWERED: frozenset({UpgradeStep.SCHEDULED, UpgradeStep.FAILED}),
    UpgradeStep.SCHEDULED: frozenset({UpgradeStep.SUCCEEDED, UpgradeStep.FAILED}),
    UpgradeStep.SUCCEEDED: frozenset(),
    UpgradeStep.FAILED: frozenset(),
}


@dataclass(frozen=True, slots=True)
class PathConfig:
    """Times and bounds of the direct upgrade (spec §8)."""

    upgrade_timeout_s: float = 10.0
    upgrade_retry_s: float = 30.0
    upgrade_retry_max_s: float = 1800.0
    jitter: float = 0.2  # every backoff is multiplied by 1 ± jitter
    punch_delay_ms: int = 100
    max_peers: int = 4096  # peers with a path kept; forget() the ones that left
    # back-pressure on a paced path: frames that may be shed (gossip) are dropped while a
    # peer holds this many bytes, or half its sequence's bound in frames, waiting to go
    shed_bytes: int = 1024 * 1024
    shed_frames: int = MAX_UNACKED // 2


@dataclass(frozen=True, slots=True)
class Transmit:
    """Send ``frame`` to ``peer``: on the direct link when ``via`` is None, else through
    relay ``via``."""

    peer: str
    via: str | None
    frame: PathFrame


@dataclass(frozen=True, slots=True)
class Deliver:
    """A peer-link frame from ``peer``, in order and once."""

    peer: str
    frame: bytes


@dataclass(frozen=True, slots=True)
class StartPunch:
    """At ``at`` (seconds, the caller's clock) open TCP to ``addrs`` from our listening port."""

    peer: str
    nonce: str
    addrs: tuple[str, ...]
    at: float


@dataclass(frozen=True, slots=True)
class PathChanged:
    """``peer`` is now reached by ``state`` (through ``via`` when relayed or upgrading)."""

    peer: str
    state: PathState
    via: str | None


Action = Transmit | Deliver | StartPunch | AttachRelay | DetachRelay | PathChanged


@dataclass(slots=True)
class Attempt:
    nonce: str
    leader: bool
    started: float
    step: UpgradeStep
    theirs: tuple[str, ...] = ()  # the peer's candidates, for the follower's punch

    def move(self, to: UpgradeStep) -> None:
        if to not in UPGRADE_TRANSITIONS[self.step]:
            raise RuntimeError(f"upgrade cannot go {self.step.value} -> {to.value}")
        self.step = to


@dataclass(slots=True)
class PeerState:
    node: str
    state: PathState = PathState.DOWN
    via: str | None = None
    fallback: str | None = None  # while direct: the relay kept for falling back
    attempt: Attempt | None = None
    upgrade_failures: int = 0
    next_upgrade: float = 0.0
    out: Outbound = field(default_factory=Outbound)
    inb: Inbound = field(default_factory=Inbound)

    @property
    def path(self) -> str | None:
        return None if self.state is PathState.DIRECT else self.via

    def move(self, to: PathState, via: str | None) -> list[Action]:
        if to not in TRANSITIONS[self.state]:
            raise RuntimeError(f"path cannot go {self.state.value} -> {to.value}")
        self.state, self.via = to, via
        return [PathChanged(self.node, to, via)]


@dataclass(slots=True)
class PathStats:
    """Counters of the path core (feed ``/metrics``)."""

    upgrades_tried: int = 0
    upgrades_succeeded: int = 0
    stale_upgrade_frames: int = 0
    resent: int = 0
    shed: int = 0  # frames dropped under back-pressure (gossip; anti-entropy repairs)


@dataclass(frozen=True, slots=True)
class PathSnapshot:
    """The path core's numbers at one moment (``/metrics``, ``hearthnet peers``)."""

    direct: int
    relayed: int
    upgrading: int
    down: int
    upgrades_tried: int
    upgrades_succeeded: int
    resent: int
    duplicates: int
    stale_upgrade_frames: int
    queued_frames: int = 0  # waiting for a relay's budget (held or to resend)
    queued_bytes: int = 0  # held, not yet sent
    paced_bytes: int = 0  # sent through paced relays
    shed: int = 0
    pace_refusals: int = 0  # rate_limited refusals that came all the same
