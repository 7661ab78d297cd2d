"""The node's one statistics snapshot, behind ``/metrics``, ``/status``, the console and
``hearthnet node status``; :meth:`hearthnet.node.Node.statistics` fills it in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class NodeStatistics:
    """A frozen snapshot of the node, for people and for ``/metrics``."""

    node: str
    short_id: str
    community: str
    name: str
    version: str
    url: str
    pid: int
    started_ms: int
    uptime_s: float
    capabilities: tuple[str, ...]
    streams_active: int
    connections: int
    calls_total: int
    members: int
    log_epoch: str
    log_head: int
    topics: int
    subscribers: int
    published_total: int
    delivered_total: int
    mesh_url: str
    peers_linked: int
    relaying: Mapping[str, Any]  # spec §8: the relay's and the relayed paths' numbers
    signatures: Mapping[str, int]  # message signatures the process checked (spec §6.2)

    def to_json(self) -> dict[str, Any]:
        """JSON form (``GET /status``, ``hearthnet node status --json``)."""
        return {
            "node": self.node,
            "short_id": self.short_id,
            "community": self.community,
            "name": self.name,
            "version": self.version,
            "url": self.url,
            "pid": self.pid,
            "started_ms": self.started_ms,
            "uptime_s": round(self.uptime_s, 3),
            "capabilities": list(self.capabilities),
            "streams_active": self.streams_active,
            "connections": self.connections,
            "calls_total": self.calls_total,
            "members": self.members,
            "log_epoch": self.log_epoch,
            "log_head": self.log_head,
            "topics": self.topics,
            "subscribers": self.subscribers,
            "published_total": self.published_total,
            "delivered_total": self.delivered_total,
            "mesh_url": self.mesh_url,
            "peers_linked": self.peers_linked,
            "relaying": dict(self.relaying),
            "signatures": dict(self.signatures),
        }
