"""What the member role's :class:`~hearthnet.mesh.relayed_paths.RelayedPaths` is given
(spec §8), in three parts like a pure core's: its settings, the mesh state it shares, and
the hooks through which its relayed links join the mesh.
:class:`~hearthnet.mesh.relaying.Relaying` builds all three.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hearthnet.identity import KeyPair
from hearthnet.membership import Membership
from hearthnet.mesh.addresses import PeerBook
from hearthnet.mesh.links import LinkErrors, PeerLink
from hearthnet.mesh.paths import PathConfig
from hearthnet.mesh.punching import Puncher
from hearthnet.mesh.relay_federated import FederatedLinks
from hearthnet.mesh.relay_keepalive import KeepaliveConfig
from hearthnet.metrics import MetricsRegistry

Dispatch = Callable[[PeerLink, dict[str, Any]], None]


@dataclass(frozen=True, slots=True)
class MemberSettings:
    """The member role's bounds and timers, from [mesh]."""

    max_links: int  # spec §7.2's D: relayed paths are opened while links are fewer
    path_config: PathConfig  # pacing and back-pressure of a relayed path
    keepalive: KeepaliveConfig  # relay pings and the silence that fails a relay over


@dataclass(frozen=True, slots=True)
class MemberShared:
    """The mesh's state the member role reads and adds to; its owners keep it."""

    keys: KeyPair
    membership: Membership
    is_member: Callable[[str], bool]  # served end to end: ours, or federated in force
    federated: FederatedLinks
    links: dict[str, PeerLink]  # the mesh's links, relayed ones included
    reach: Mapping[str, PeerLink]  # relays of ours and of theirs
    book: PeerBook
    errors: LinkErrors
    metrics: MetricsRegistry
    counts: Tally[str]  # relayed frames and bytes, refusals
    puncher: Callable[[], Puncher | None]  # the direct upgrade, once the node listens


@dataclass(frozen=True, slots=True)
class MemberHooks:
    """How relayed links join the mesh: their frames, admission and loss."""

    dispatch: Dispatch
    admit: Callable[[PeerLink], bool]
    on_down: Callable[[PeerLink, str], None]
    federated_down: Callable[[PeerLink, str], None]
