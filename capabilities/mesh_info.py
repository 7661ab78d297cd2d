"""``mesh.peers@1.0`` and ``mesh.topics@1.0`` (spec §2.1): what ``hearthnet peers`` and
``hearthnet topics`` show, as capabilities, so that scripts, other nodes and a model's
tool calls can read them over the bus.

Both are read-only. ``mesh.topics`` lists only topics the caller may read (the pub/sub
access rules of spec §6.9, as ``GET /pubsub/v1/topics`` does); ``mesh.peers`` is open
to every member, and to a token with the ``call:mesh.peers`` scope, as
``GET /mesh/v1/peers`` is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hearthnet.bus.capability import CallContext
from hearthnet.bus.descriptor import CapabilityDescriptor
from hearthnet.pubsub.service import PubSub

DEFAULT_TOPICS = 100
MAX_TOPICS = 1000

PEER_ROW_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["node", "linked", "url"],
    "properties": {
        "node": {"type": ["string", "null"]},
        "name": {"type": ["string", "null"]},
        "linked": {"type": "boolean"},
        "url": {"type": ["string", "null"]},
        "urls": {"type": "array", "items": {"type": "string"}},
        "direction": {"enum": ["inbound", "outbound"]},
        "protocol": {"type": ["string", "null"]},
        "rtt_ms_p50": {"type": ["number", "null"]},
        "loss_pct": {"type": ["number", "null"]},
        "path": {"type": ["string", "null"]},
        "via": {"type": ["string", "null"]},
        "source": {"type": "string"},
        "failures": {"type": "integer"},
        "last_ok_ms": {"type": ["integer", "null"]},
    },
}

TOPIC_ROW_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["topic", "messages", "head_seq", "last_ts", "subscribers", "presence"],
    "properties": {
        "topic": {"type": "string"},
        "messages": {"type": "integer"},
        "head_seq": {"type": "integer"},
        "last_ts": {"type": ["integer", "null"]},
        "subscribers": {"type": "integer"},
        "presence": {"type": "integer"},
    },
}

PeersSnapshot = Callable[[], dict[str, Any]]


class MeshPeers:
    """``mesh.peers@1.0``: input ``{}`` -> ``{"node", "url", "peers": [...]}``: this node,
    its linked peers (direction, round-trip time, loss, direct or relayed path) and the
    peers it knows addresses of, one row per peer."""

    descriptor = CapabilityDescriptor(
        name="mesh.peers",
        version="1.0",
        request_schema={"type": "object", "properties": {}, "additionalProperties": False},
        response_schema={
            "type": "object",
            "required": ["node", "url", "peers"],
            "properties": {
                "node": {"type": "string"},
                "url": {"type": "string"},
                "peers": {"type": "array", "items": PEER_ROW_SCHEMA},
            },
        },
        max_concurrent=16,
        timeout_s=5.0,
        idempotent=True,
        description="This node's linked peers and the peers it knows addresses of.",
        check_on_first_call=True,  # a constant: checked by the tests
    )

    def __init__(self, snapshot: PeersSnapshot) -> None:
        self._snapshot = snapshot

    async def call(self, ctx: CallContext, value: Any) -> dict[str, Any]:
        """The node's view of the mesh, now."""
        return self._snapshot()


class MeshTopics:
    """``mesh.topics@1.0``: input ``{"prefix"?, "limit"?}`` -> ``{"topics": [...]}``: the
    topics of this node's log (the mesh gossips every topic to every node) that the
    caller may read, by name, with message counts, head seq and subscribers."""

    descriptor = CapabilityDescriptor(
        name="mesh.topics",
        version="1.0",
        request_schema={
            "type": "object",
            "properties": {
                "prefix": {"type": "string", "maxLength": 255},
                "limit": {"type": "integer", "minimum": 1, "maximum": MAX_TOPICS},
            },
            "additionalProperties": False,
        },
        response_schema={
            "type": "object",
            "required": ["topics"],
            "properties": {"topics": {"type": "array", "items": TOPIC_ROW_SCHEMA}},
        },
        max_concurrent=16,
        timeout_s=5.0,
        idempotent=True,
        description="Topics with messages on this node that the caller may read.",
        check_on_first_call=True,  # a constant: checked by the tests
    )

    def __init__(self, pubsub: PubSub) -> None:
        self._pubsub = pubsub

    async def call(self, ctx: CallContext, value: Any) -> dict[str, Any]:
        """Topics by name, after the caller's read check on each (spec §6.9)."""
        topics = self._pubsub.topics(
            ctx.caller, value.get("prefix", ""), value.get("limit", DEFAULT_TOPICS)
        )
        return {"topics": topics}
