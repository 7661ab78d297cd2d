"""Built-in capabilities offered by every node (spec §2.1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from capabilities.echo import Echo, EchoStream
from capabilities.mesh_info import MeshPeers, MeshTopics, PeersSnapshot
from capabilities.pubsub_publish import PubSubPublish
from hearthnet.bus.capability import Capability

if TYPE_CHECKING:
    from hearthnet.pubsub.service import PubSub


def builtin_capabilities() -> list[Capability]:
    """The capabilities a node offers with no configuration."""
    return [Echo(), EchoStream()]


def node_capabilities(peers: PeersSnapshot, pubsub: PubSub) -> list[Capability]:
    """The capabilities that read or act on the node's own mesh and pub/sub:
    ``mesh.peers@1.0``, ``mesh.topics@1.0`` and ``pubsub.publish@1.0``."""
    return [MeshPeers(peers), MeshTopics(pubsub), PubSubPublish(pubsub)]
