"""Presence (spec §6.6): who is on a topic. Pure; events are returned, not sent.

A member is ``{client_id, identity, name?, status?, meta?, node, joined_ms, last_seen_ms}``.
Local members leave when they unsubscribe, disconnect, or stay silent for 30 s. Members
learnt from other nodes (the mesh gossips presence) carry a TTL: refreshed every 15 s by
their node, expired after 45 s without a refresh.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from hearthnet.errors import BadRequest

MAX_NAME = 128
MAX_STATUS = 64
MAX_META_BYTES = 4096
MAX_MEMBERS_PER_TOPIC = 10_000


@dataclass(slots=True)
class Member:
    """One member of one topic."""

    client_id: str
    identity: str
    node: str
    joined_ms: int
    last_seen_ms: int
    name: str | None = None
    status: str | None = None
    meta: dict[str, Any] | None = None
    local: bool = True

    def to_json(self) -> dict[str, Any]:
        """Wire form."""
        out: dict[str, Any] = {
            "client_id": self.client_id,
            "identity": self.identity,
            "node": self.node,
            "joined_ms": self.joined_ms,
            "last_seen_ms": self.last_seen_ms,
        }
        for key in ("name", "status", "meta"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


@dataclass(frozen=True, slots=True)
class PresenceEvent:
    """``{topic, kind: join|leave|update, member}``."""

    topic: str
    kind: str
    member: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The data of a ``presence`` frame."""
        return {"topic": self.topic, "kind": self.kind, "member": self.member}


def validate_presence_fields(obj: object) -> dict[str, Any]:
    """Check ``{"name"?, "status"?, "meta"?}`` and return the fields given."""
    if not isinstance(obj, dict):
        raise BadRequest("presence is an object {name?, status?, meta?}")
    extra = set(obj) - {"name", "status", "meta", "topic"}
    if extra:
        raise BadRequest(f"unknown presence fields {sorted(extra)}")
    out: dict[str, Any] = {}
    if "name" in obj:
        if not isinstance(obj["name"], str) or len(obj["name"]) > MAX_NAME:
            raise BadRequest(f"presence name is a string of at most {MAX_NAME} characters")
        out["name"] = obj["name"]
    if "status" in obj:
        if not isinstance(obj["status"], str) or len(obj["status"]) > MAX_STATUS:
            raise BadRequest(f"presence status is a string of at most {MAX_STATUS} characters")
        out["status"] = obj["status"]
    if "meta" in obj:
        if not isinstance(obj["meta"], dict) or len(orjson.dumps(obj["meta"])) > MAX_META_BYTES:
            raise BadRequest(f"presence meta is an object of at most {MAX_META_BYTES} bytes")
        out["meta"] = obj["meta"]
    return out


@dataclass
class PresenceTable:
    """Members per topic, and the topics of each client (so that hearing from a client,
    which happens on every frame it sends, costs its own topics, not every topic)."""

    silence_ms: int = 30_000
    remote_ttl_ms: int = 45_000
    topics: dict[str, dict[str, Member]] = field(default_factory=dict)
    by_client: dict[str, set[str]] = field(default_factory=dict)

    def _topics_of(self, client_id: str, topic: str | None) -> list[str]:
        """The client's topics (sorted: events come out in a stable order), or just
        ``topic`` if the client is on it."""
        names = self.by_client.get(client_id, ())
        if topic is None:
            return sorted(names)
        return [topic] if topic in names else []

    def members(self, topic: str) -> list[dict[str, Any]]:
        """The snapshot of one topic."""
        return [m.to_json() for m in self.topics.get(topic, {}).values()]

    def join(self, topic: str, member: Member) -> list[PresenceEvent]:
        """Add (or re-add) a member; a join event, or an update if it was there."""
        members = self.topics.setdefault(topic, {})
        if member.client_id not in members and len(members) >= MAX_MEMBERS_PER_TOPIC:
            raise BadRequest(f"{topic} has {MAX_MEMBERS_PER_TOPIC} members already")
        kind = "update" if member.client_id in members else "join"
        members[member.client_id] = member
        self.by_client.setdefault(member.client_id, set()).add(topic)
        return [PresenceEvent(topic, kind, member.to_json())]

    def update(
        self, client_id: str, fields: dict[str, Any], now_ms: int, topic: str | None = None
    ) -> list[PresenceEvent]:
        """Change name/status/meta of a client on one topic or all its topics."""
        events = []
        for name in self._topics_of(client_id, topic):
            member = self.topics[name][client_id]
            for key, value in fields.items():
                setattr(member, key, value)
            member.last_seen_ms = now_ms
            events.append(PresenceEvent(name, "update", member.to_json()))
        return events

    def touch(self, client_id: str, now_ms: int) -> None:
        """The client was heard from (any frame, or a pong)."""
        for name in self.by_client.get(client_id, ()):
            self.topics[name][client_id].last_seen_ms = now_ms

    def leave(self, client_id: str, topic: str | None = None) -> list[PresenceEvent]:
        """Remove a client from one topic or all of them."""
        events = []
        for name in self._topics_of(client_id, topic):
            members = self.topics[name]
            member = members.pop(client_id)
            events.append(PresenceEvent(name, "leave", member.to_json()))
            if not members:
                del self.topics[name]
            names = self.by_client[client_id]
            names.discard(name)
            if not names:
                del self.by_client[client_id]
        return events

    def expire(self, now_ms: int) -> list[PresenceEvent]:
        """Leave events for silent local members and unrefreshed remote ones."""
        stale = [
            (topic, m.client_id)
            for topic, members in self.topics.items()
            for m in members.values()
            if now_ms - m.last_seen_ms > (self.silence_ms if m.local else self.remote_ttl_ms)
        ]
        events: list[PresenceEvent] = []
        for topic, client_id in stale:
            events += self.leave(client_id, topic)
        return events
