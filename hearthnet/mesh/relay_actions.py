"""What the relay's pure core returns (spec §8; :mod:`hearthnet.mesh.relay_core`): the
actions for the glue to carry out, and a snapshot of its counters. Pure."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from hearthnet.mesh.relay_frames import RelayFrame

LinkId = Hashable


@dataclass(frozen=True, slots=True)
class Send:
    """Write ``frame`` on ``link``."""

    link: LinkId
    frame: RelayFrame


@dataclass(frozen=True, slots=True)
class Forward:
    """Pass the route frame just received on to ``link``, ``ttl_hops`` one less."""

    link: LinkId


@dataclass(frozen=True, slots=True)
class Refuse:
    """The attachment on ``link`` is refused or ended: send ``detach {code, retry_after_ms}``."""

    link: LinkId
    code: str
    retry_after_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Close:
    """The peer on ``link`` broke the relay protocol: close the link."""

    link: LinkId
    reason: str


Action = Send | Forward | Refuse | Close


@dataclass(frozen=True, slots=True)
class RelayStats:
    """A snapshot of the relay's counters (feeds ``/metrics``)."""

    members: int
    federated: int
    routes: int
    forwarded: int
    forwarded_bytes: int
    duplicates: int
    rate_limited: int
    unreachable: int
    ttl_expired: int
    spoofed: int
    foreign_tables: int = 0  # route tables from links that are not federated
    # spec §8 community federation: route frames between two nodes of other communities
    foreign_routes: int = 0
