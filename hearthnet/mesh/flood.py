"""Flooding presence and membership through the mesh (spec §6.7, §1.5, §7.3). Pure.

Presence events travel in ``presence`` frames with an id; each node applies and forwards a
frame the first time it sees the id (a bounded seen-cache), so a flood reaches every node
once per link and stops. Membership records travel in ``membership`` frames; a node admits
the records it does not hold yet, and what admission adds is flooded on by the node (see
:meth:`MembershipFlood.broadcast`), so a record stops where it is known.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable
from typing import Any

from hearthnet.ids import new_ulid
from hearthnet.mesh.actions import Admit, ApplyPresence, Forward
from hearthnet.mesh.frames import MembershipBatch, Presence

SEEN_PRESENCE = 50_000  # presence flood ids remembered
MAX_EVENTS = 1000  # presence events applied per frame


class PresenceFlood:
    """Which presence floods this node has seen, and what to send on.

    Args:
        node_id: this node (the ``node`` of the floods it starts).
        seen_max: flood ids remembered (oldest forgotten first).
    """

    def __init__(self, node_id: str, seen_max: int = SEEN_PRESENCE) -> None:
        self.node_id = node_id
        self.seen_max = seen_max
        self._seen: OrderedDict[str, None] = OrderedDict()

    def _remember(self, presence_id: str) -> bool:
        if presence_id in self._seen:
            return False
        self._seen[presence_id] = None
        if len(self._seen) > self.seen_max:
            self._seen.popitem(last=False)
        return True

    def start(self, events: list[dict[str, Any]]) -> Presence:
        """A new flood of this node's ``events`` (remembered, so it is not taken back)."""
        frame = Presence(new_ulid(), self.node_id, tuple(events))
        self._remember(frame.id)
        return frame

    def announce(self, events: list[dict[str, Any]]) -> Forward:
        """A new flood of this node's ``events`` to every link."""
        return Forward(self.start(events).encode(), None)

    def receive(self, frame: Presence, source: str) -> tuple[ApplyPresence, Forward] | None:
        """A peer's flood: the events to apply and the frame to send on to every other link,
        or None when this flood was seen already."""
        if not self._remember(frame.id):
            return None
        return ApplyPresence(frame.events[:MAX_EVENTS]), Forward(frame.encode(), source)


class MembershipFlood:
    """Membership records between peers.

    Args:
        per_request: records per frame (spec §1.5's per-request cap).
    """

    def __init__(self, per_request: int) -> None:
        self.per_request = per_request

    def receive(self, frame: MembershipBatch, source: str, held: Container[Any]) -> Admit | None:
        """A peer's records: the ones not ``held`` yet, to verify and admit (at most the
        per-request cap of them), or None."""
        fresh = tuple(
            raw
            for raw in frame.records[: self.per_request]
            if isinstance(raw, dict) and raw.get("id") not in held
        )
        return Admit(source, fresh) if fresh else None

    def snapshot(self, records: Iterable[dict[str, Any]]) -> list[MembershipBatch]:
        """All ``records`` (their JSON forms), in frames of at most the per-request cap: what
        a new link gets."""
        batch = list(records)
        step = self.per_request
        return [
            MembershipBatch(tuple(batch[start : start + step]))
            for start in range(0, len(batch), step)
        ]

    @staticmethod
    def broadcast(records: Iterable[dict[str, Any]], skip: str | None) -> Forward:
        """New records (JSON forms) for every link but ``skip``."""
        return Forward(MembershipBatch(tuple(records)).encode(), skip)
