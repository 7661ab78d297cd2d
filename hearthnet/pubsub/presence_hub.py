"""Presence on one node (spec §6.6): the pure :class:`~hearthnet.pubsub.presence.PresenceTable`
wired to this node's subscribers and, through ``on_local``, to the mesh.

Local members join with a subscribe, leave with an unsubscribe, a disconnect or silence;
their events go to local subscribers of the topic and to the mesh, which gossips them.
Members of other nodes arrive as gossiped events (:meth:`PresenceHub.apply_remote`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hearthnet.clock import now_ms
from hearthnet.errors import BadRequest
from hearthnet.pubsub.access import AccessPolicy
from hearthnet.pubsub.index import SubscriptionIndex
from hearthnet.pubsub.presence import (
    Member,
    PresenceEvent,
    PresenceTable,
    validate_presence_fields,
)
from hearthnet.pubsub.subscriber import Subscriber
from hearthnet.pubsub.topics import TopicPattern

REMOTE_KINDS = ("join", "update", "leave", "refresh")


class PresenceHub:
    """Presence events between the table, local subscribers and the mesh."""

    def __init__(
        self,
        *,
        node_id: str,
        table: PresenceTable,
        index: SubscriptionIndex[Subscriber],
        policy: AccessPolicy,
        subscribers: set[Subscriber],
    ) -> None:
        self.node_id = node_id
        self.table = table
        self.index = index
        self.policy = policy
        self.subscribers = subscribers
        # The node wires this to the mesh, which gossips local members' presence events.
        self.on_local: Callable[[list[PresenceEvent]], None] = lambda events: None

    def join(self, sub: Subscriber, topics: list[str], fields: dict[str, Any]) -> None:
        """Join: others get a ``join`` event; the joiner gets a snapshot that includes itself."""
        now = now_ms()
        for topic in topics:
            member = Member(
                sub.client_id,
                sub.caller.owner,
                self.node_id,
                now,
                now,
                fields.get("name"),
                fields.get("status"),
                fields.get("meta"),
            )
            events = self.table.join(topic, member)
            sub.join_presence(topic)
            self.broadcast(events, skip=sub)
            sub.send_control(
                "presence",
                {"topic": topic, "kind": "snapshot", "members": self.table.members(topic)},
            )

    def snapshots(
        self, sub: Subscriber, patterns: tuple[TopicPattern, ...], joined: list[str]
    ) -> None:
        """spec §6.6: a new subscriber gets a snapshot of every present topic it matches
        (literal topics looked up; only wildcards go through the present topics); the
        topics it ``joined`` had theirs."""
        present = self.table.topics
        wildcards = [p for p in patterns if not p.is_literal]
        matched = {p.text for p in patterns if p.is_literal and p.text in present}
        if wildcards:
            matched.update(t for t in present if any(p.matches(t) for p in wildcards))
        for topic in sorted(matched):
            if topic not in joined and (
                not sub.filtered or self.policy.may_receive(sub.caller, topic)
            ):
                sub.send_control(
                    "presence",
                    {"topic": topic, "kind": "snapshot", "members": self.table.members(topic)},
                )

    def leave(self, sub: Subscriber, topic: str | None = None) -> None:
        """``sub`` leaves ``topic`` (None: every topic it is present on)."""
        if topic is None:
            if sub.presence_topics:
                self.broadcast(self.table.leave(sub.client_id))
        elif topic in sub.presence_topics:
            sub.leave_presence(topic)
            self.broadcast(self.table.leave(sub.client_id, topic))

    def update(self, sub: Subscriber, fields: dict[str, Any], topic: str | None) -> None:
        """``presence.update`` from a client."""
        if not sub.presence_topics:
            raise BadRequest("no presence: subscribe with presence first")
        if topic is not None and topic not in sub.presence_topics:
            raise BadRequest(f"no presence on {topic}")
        self.broadcast(self.table.update(sub.client_id, fields, now_ms(), topic))

    def heard(self, sub: Subscriber) -> None:
        """The client sent a frame or a pong (spec §6.6: silence means leave)."""
        if sub.presence_topics:
            self.table.touch(sub.client_id, now_ms())

    def expire(self) -> None:
        """Leave events for silent members (run by the sweeper)."""
        events = self.table.expire(now_ms())
        for event in events:
            for sub in self.subscribers:
                if sub.client_id == event.member["client_id"]:
                    sub.leave_presence(event.topic)
        self.broadcast(events)

    def broadcast(
        self, events: list[PresenceEvent], skip: Subscriber | None = None, *, local: bool = True
    ) -> None:
        """Deliver presence events to local subscribers; local members' events also go to
        the mesh (``on_local``), which gossips them to other nodes (spec §6.6)."""
        for event in events:
            for sub in self.index.match(event.topic):
                if sub is skip:
                    continue
                if not sub.filtered or self.policy.may_receive(sub.caller, event.topic):
                    sub.send_control("presence", event.to_json())
                    sub.wake()
        if local:
            mine = [e for e in events if e.member.get("node") == self.node_id]
            if mine:
                self.on_local(mine)

    def local_events(self, kind: str) -> list[dict[str, Any]]:
        """Every local member as presence event data (for refreshing peers)."""
        return [
            {"topic": topic, "kind": kind, "member": member.to_json()}
            for topic, members in self.table.topics.items()
            for member in members.values()
            if member.local
        ]

    def apply_remote(self, event: object) -> None:
        """A presence event gossiped from another node: update the table (remote members
        expire 45 s after their last refresh) and tell local subscribers of changes."""
        if not isinstance(event, dict):
            return
        topic, kind, raw = event.get("topic"), event.get("kind"), event.get("member")
        if not isinstance(topic, str) or not isinstance(raw, dict) or kind not in REMOTE_KINDS:
            return
        client_id, node = raw.get("client_id"), raw.get("node")
        if not isinstance(client_id, str) or not isinstance(node, str) or node == self.node_id:
            return
        if kind == "leave":
            self.broadcast(self.table.leave(client_id, topic), local=False)
            return
        try:
            fields = validate_presence_fields(
                {k: raw[k] for k in ("name", "status", "meta") if k in raw}
            )
        except BadRequest:
            return
        now = now_ms()
        known = self.table.topics.get(topic, {}).get(client_id)
        member = Member(
            client_id,
            str(raw.get("identity", "")),
            node,
            int(raw.get("joined_ms") or now),
            now,
            fields.get("name"),
            fields.get("status"),
            fields.get("meta"),
            local=False,
        )
        unchanged = known is not None and (known.name, known.status, known.meta) == (
            member.name,
            member.status,
            member.meta,
        )
        try:
            events = self.table.join(topic, member)
        except BadRequest:
            return
        if not unchanged:
            self.broadcast(events, local=False)
