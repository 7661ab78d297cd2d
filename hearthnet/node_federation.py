"""Community federation's part of the composition root (hearthnet/node.py, spec §8):
agreements from SQLite, the other communities' members accepted by requests and gossip
for what the agreements grant, the bridge that pulls granted topics and the carrier
that reaches federated nodes through relays.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hearthnet.auth import Authenticator
from hearthnet.clock import now_ms
from hearthnet.federation.bridge import Bridge
from hearthnet.federation.carrier import Carrier, mesh_peer
from hearthnet.federation.service import Federation
from hearthnet.federation.store import FederationStore
from hearthnet.federation.view import FederationView
from hearthnet.identity import KeyPair
from hearthnet.membership import Membership
from hearthnet.mesh.service import Mesh
from hearthnet.metrics import MetricsRegistry
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.service import PubSub
from hearthnet.sessions import SessionRegistry


@dataclass(frozen=True, slots=True)
class FederationParts:
    """What :func:`build_federation` builds; the node keeps each part."""

    store: FederationStore
    service: Federation
    carrier: Carrier
    bridge: Bridge


def build_federation(
    *,
    keys: KeyPair,
    membership: Membership,
    data_dir: Path,
    peers: list[str],
    pubsub: PubSub,
    sessions: SessionRegistry,
    spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]],
    mesh: Mesh,
    message_log: MessageLog,
    authenticator: Authenticator,
    metrics: MetricsRegistry,
) -> FederationParts:
    """Community federation (spec §8): agreements from SQLite, the other communities'
    members accepted by requests and gossip for what the agreements grant."""
    view = FederationView(membership)
    store = FederationStore(data_dir)
    store.load(view)
    federation = Federation(
        keys=keys,
        view=view,
        store=store,
        pubsub=pubsub,
        sessions=sessions,
        spawn=spawn,
    )
    # spec §8: nodes of federated communities through relays (mesh/relay_federated.py)
    federated = mesh.relaying.federated
    federated.community_of = lambda node: view.in_force_community(node, now_ms())
    federated.bridge_of = lambda node: view.bridge_community(node, now_ms())
    federated.name_of = lambda node, community: _member_name(view, node, community)
    federated.targets = {n for n in map(mesh_peer, peers) if n is not None}
    carrier = Carrier(
        federated,
        spawn=spawn,
        keys=keys,
        offer=lambda community: federation.offer(community, members=False),
        community=membership.community_id,
    )
    bridge = Bridge(
        federation,
        peers=peers,
        message_log=message_log,
        spawn=spawn,
        carrier=carrier,
    )
    authenticator.federation = view
    fed, m = bridge, metrics
    m.gauge(
        "hearthnet_federation_agreements",
        "Federation agreements in force (spec §8).",
        lambda: float(view.in_force_count(now_ms())),
    )
    m.read_counter(
        "hearthnet_federation_pulled",
        "Messages a bridge pulled from other communities.",
        lambda: float(fed.pulled),
    )
    m.read_counter(
        "hearthnet_federation_pull_refused",
        "Pulled messages dropped (bad signature, origin, topic).",
        lambda: float(fed.refused),
    )
    mesh.traffic.gossip.foreign_origin = lambda origin, topic: view.accepts_origin(
        origin, topic, now_ms()
    )
    return FederationParts(store, federation, carrier, bridge)


def _member_name(view: FederationView, node: str, community: str) -> str | None:
    """``node``'s name in the membership records of ``community`` that we hold."""
    members = view.view_of(community)
    info = members.members.get(node) if members is not None else None
    return info.name if info is not None else None
