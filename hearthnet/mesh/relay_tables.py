"""Route tables between federated relays (spec §8): what each federated relay says it
reaches, the best route to every node behind them, and when ours is sent.

Part of the relay's pure core (:class:`hearthnet.mesh.relay_core.RelayCore` feeds it and
carries out the sends it returns). Each federated relay gets our ``route_table``
(attached members at hops 0, learnt routes at their hops, none back over the link it was
learnt from, none longer than ``max_route_hops`` relays after the receiver) every
``table_refresh_s`` and at most ``table_min_interval_s`` after a change; a table not
refreshed within ``table_expiry_s`` is forgotten.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hearthnet.mesh.relay_actions import Action, Close, LinkId, Send
from hearthnet.mesh.relay_frames import RouteTable

if TYPE_CHECKING:
    from hearthnet.mesh.relay_core import RelayConfig


@dataclass(slots=True)
class Federated:
    """A federated relay's link: its NodeID and the last table it sent."""

    relay: str
    version: int = -1
    routes: dict[str, int] = field(default_factory=dict)  # node -> hops beyond that relay
    refreshed: float = 0.0


class RouteTables:
    """The federated links' tables and the best route through them to each node.

    ``members`` is the relay's attached members (read, never changed here): a node
    attached to us is reached directly, never through a federated relay.
    """

    def __init__(
        self,
        node_id: str,
        config: RelayConfig,
        is_served: Callable[[str], bool],
        members: Mapping[str, object],
    ) -> None:
        self.node_id = node_id
        self.config = config
        self.is_served = is_served
        self._members = members
        self.links: dict[LinkId, Federated] = {}
        self.best: dict[str, tuple[int, str, LinkId]] = {}  # node -> (hops, relay, link)
        self._version = 0
        self._sent = float("-inf")
        self._dirty = False

    def receive(self, link: LinkId, table: RouteTable, now: float) -> list[Action] | None:
        """A ``route_table`` that arrived on ``link``; None when ``link`` is not federated
        (spec §8: a frame never makes a link federated; the caller counts it)."""
        fed = self.links.get(link)
        if fed is None:
            return None
        if table.relay != fed.relay:
            return [Close(link, "route_table from a link that is not its relay's")]
        if table.version < fed.version:
            return []  # an older table overtaken by a newer one
        fed.refreshed = now
        if table.version == fed.version:
            return []
        fed.version = table.version
        fed.routes = {
            n: h
            for n, h in table.nodes
            if n != self.node_id and h + 1 <= self.config.max_route_hops and self.is_served(n)
        }
        return self.changed(now, members_changed=False)

    def changed(self, now: float, *, members_changed: bool) -> list[Action]:
        """The members or a federated relay's routes changed: send our table when it
        changed and ``table_min_interval_s`` has passed since the last (else on a tick)."""
        if not self._recompute() and not members_changed:
            return []
        self._version += 1
        self._dirty = True
        if now - self._sent < self.config.table_min_interval_s:
            return []
        return self._send(now)

    def table_for(self, link: LinkId) -> RouteTable:
        """Our route table as the relay on ``link`` should get it."""
        nodes = [(n, 0) for n in self._members]
        limit = self.config.max_route_hops - 1  # what the receiver would keep
        nodes += [(n, h) for n, (h, _, via) in self.best.items() if via != link and h <= limit]
        return RouteTable(self.node_id, self._version, tuple(nodes))

    def refresh_due(self, now: float) -> bool:
        """Whether the periodic refresh (``table_refresh_s``) is due."""
        return now - self._sent >= self.config.table_refresh_s

    def tick(self, now: float, *, members_changed: bool) -> list[Action]:
        """Expire tables not refreshed within ``table_expiry_s``; send ours when due."""
        changed = members_changed
        for fed in self.links.values():
            if fed.routes and now - fed.refreshed > self.config.table_expiry_s:
                # forget the version too: the next table, even the same one, is taken whole
                fed.routes, fed.version, changed = {}, -1, True
        if changed:
            self._recompute()
            self._version += 1
            self._dirty = True
        if self.refresh_due(now) or (
            self._dirty and now - self._sent >= self.config.table_min_interval_s
        ):
            return self._send(now)
        return []

    def _recompute(self) -> bool:
        best: dict[str, tuple[int, str, LinkId]] = {}
        for link, fed in self.links.items():
            for node, hops in fed.routes.items():
                if node in self._members:
                    continue
                cand = (hops + 1, fed.relay, link)
                old = best.get(node)
                if old is None or cand[:2] < old[:2]:
                    best[node] = cand
        changed = best != self.best
        self.best = best
        return changed

    def _send(self, now: float) -> list[Action]:
        self._sent = now
        self._dirty = False
        return [Send(link, self.table_for(link)) for link in self.links]
