"""Links with nodes of federated communities (spec §8): what they may carry, and ending
them when the agreement does.

A node of a community we hold a federation agreement in force with gets a link in two
cases only:

- a peer link where one end is a relay: the node dialled our relay to attach, or we
  dialled a relay of theirs (its hello says ``relay: true``) to attach to it
  (:class:`~hearthnet.mesh.protocol.Handshake`, ``federated`` and ``bridge``);
- a relayed link (its end-to-end hello is signed by a member of that community).

Only the nodes an agreement in force names among their community's bridges
(``bridges_a``/``bridges_b``, :mod:`hearthnet.federation.agreement`) are taken on our
relay or in a relayed session, and routed by our relay (:meth:`FederatedLinks.serves`);
any other member of that community is refused ``forbidden`` and counted
(``hearthnet_federated_refused{reason="not_a_bridge"}``). A relay of theirs that we
dialled ourselves (a configured ``--relay-url``) need only be a member
(:meth:`FederatedLinks.allows`).

Such a link is never one of the mesh's links: it gets no gossip, presence, membership,
capabilities or heartbeats, and nothing it sends reaches the cores of the mesh. It
carries relay frames (``attach`` and its answers, ``route`` frames, which the relay core
passes only between a federated node and a member of ours), ``ping``/``pong`` (a relay's
keepalive), ``bye``, and the bridge's requests (``fed_req``/``fed_res``,
:mod:`hearthnet.federation.carrier`), whose signed headers each node checks as it checks
a request over HTTP, under the grant. Any other frame is dropped and counted
(``hearthnet_federated_refused{reason}``). At most :data:`MAX_FEDERATED_LINKS` such
links.

Every check reads the current federation view: when the agreement is revoked or expires,
or the node leaves its community, :meth:`FederatedLinks.ended` names the link, and the
relaying glue ends it at its next tick (every 0.25 s) with :meth:`FederatedLinks.end`:
the carrier's farewell hands the other side the revocation, then closes it (2 s at most).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from hearthnet.clock import now_ms
from hearthnet.mesh.frames import Ping, Pong
from hearthnet.mesh.links import PeerLink
from hearthnet.mesh.protocol import CARRIED_FRAME_KINDS, link_subprotocol
from hearthnet.mesh.relayed_link import is_relayed, observed_address, path_fields
from hearthnet.metrics import MetricsRegistry

log = logging.getLogger("hearthnet.mesh.relaying")

MAX_FEDERATED_LINKS = 64  # links with nodes of federated communities, at most
# relay frames a federated link may send: a member attaching to our relay, or our relay
# (of the other community) answering us; join_via and the path frames stay in a community
RELAY_KINDS = frozenset({"attach", "attached", "detach", "budget", "route", "route_error"})

Carry = Callable[[PeerLink, dict[str, Any]], None]


def federated_peer(link: PeerLink) -> bool:
    """Whether ``link`` goes to a node of another community."""
    return link.peer.community is not None


class FederatedLinks:
    """The links with nodes of federated communities, by NodeID."""

    def __init__(self, metrics: MetricsRegistry | None = None) -> None:
        self.links: dict[str, PeerLink] = {}
        # node -> its federated community, when an agreement with it is in force (the
        # composition root sets it from the federation view; none without federation)
        self.community_of: Callable[[str], str | None] = lambda node: None
        # node -> its federated community, when an agreement in force names it among that
        # community's bridges (the composition root sets it from the federation view)
        self.bridge_of: Callable[[str], str | None] = lambda node: None
        # (node, its community) -> its name in that community's membership records, for
        # ``hearthnet peers`` (a relayed session's hello names no node)
        self.name_of: Callable[[str, str], str | None] = lambda node, community: None
        self.targets: set[str] = set()  # bridge peers reached through relays (mesh:NodeID)
        self.carry: Carry | None = None  # fed_req/fed_res go here (federation/carrier.py)
        self.lost: Callable[[str], None] | None = None  # a link ended: its requests fail
        # an agreement ended: hand the other side what ended it, then close (carrier.py)
        self.farewell: Callable[[PeerLink], None] | None = None
        self._leaving: set[PeerLink] = set()
        self.refused: dict[str, int] = {}
        if metrics is not None:
            metrics.gauge(
                "hearthnet_federated_refused",
                "Frames, links and relayed sessions of federated communities' nodes refused"
                " (spec §8), by reason.",
                lambda: {(r,): float(n) for r, n in self.refused.items()},
                ("reason",),
            )

    def count(self, reason: str) -> None:
        """One refusal more."""
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def allows(self, node: str, community: str | None = None) -> bool:
        """Whether ``node`` is a current member of a federated community under an
        agreement in force (of ``community``, when given)."""
        found = self.community_of(node)
        return found is not None and (community is None or found == community)

    def serves(self, node: str, community: str | None = None) -> bool:
        """Whether ``node`` is named among the bridges of a federated community (of
        ``community``, when given) by an agreement in force: our relay takes and routes
        it, our relayed sessions accept it."""
        found = self.bridge_of(node)
        return found is not None and (community is None or found == community)

    def admits(self, node: str, community: str) -> bool:
        """:meth:`serves`, counting a member of that community that is not a named bridge
        (``not_a_bridge``); the caller refuses it."""
        if self.serves(node, community):
            return True
        if self.allows(node, community):
            self.count("not_a_bridge")
        return False

    def entitled(self, link: PeerLink) -> bool:
        """Whether ``link``'s node may hold it: a relay of theirs we dialled need only be
        a member under an agreement in force; anyone else must be a named bridge."""
        if link.outbound and link.peer.relay and not is_relayed(link):
            return self.allows(link.node, link.peer.community)
        return self.serves(link.node, link.peer.community)

    def up(self, link: PeerLink) -> bool:
        """Take an established link with a federated node; False when refused (no
        agreement in force any more, not a named bridge, or too many such links)."""
        current = self.links.get(link.node)
        if not self.entitled(link):
            if not self.allows(link.node, link.peer.community):
                self.count("no_agreement")
            else:
                self.count("not_a_bridge")
            return False
        if current is None and len(self.links) >= MAX_FEDERATED_LINKS:
            self.count("too_many_links")
            return False
        if current is not None and current is not link:
            current.close("replaced by a newer link")
        self.links[link.node] = link
        log.info(
            "federated link up with %s of %s",
            link.node,
            link.peer.community,
            extra={"peer": link.node},
        )
        return True

    def down(self, link: PeerLink) -> bool:
        """A federated link ended; False when it was not the one held."""
        self._leaving.discard(link)
        if self.links.get(link.node) is not link:
            return False
        del self.links[link.node]
        if self.lost is not None:
            self.lost(link.node)
        return True

    def frame(self, link: PeerLink, frame: dict[str, Any]) -> None:
        """A frame that is not a relay frame, off a federated link: the bridge's requests
        go to the carrier, a ping is answered, a bye ends the link; anything else is
        dropped and counted."""
        kind = frame.get("t")
        if kind in CARRIED_FRAME_KINDS and self.carry is not None:
            self.carry(link, frame)
        elif kind == "ping":
            link.send_raw(Pong(Ping.parse(frame).seq, frame.get("ts"), now_ms()).encode())
        elif kind == "pong":
            return
        elif kind == "bye":
            link.close(f"peer said bye: {str(frame.get('reason', ''))[:200]}", send_bye=False)
        else:
            self.count(f"frame_{str(kind)[:16]}")

    def relay_frame_allowed(self, frame: dict[str, Any]) -> bool:
        """Whether a relay frame may come off a federated link (counted when not)."""
        if frame.get("t") in RELAY_KINDS:
            return True
        self.count(f"frame_{str(frame.get('t'))[:16]}")
        return False

    def ended(self) -> list[PeerLink]:
        """The links whose node is no longer served: its agreement was revoked or
        expired (or no longer names it a bridge), or it left its community."""
        return [link for link in self.links.values() if not self.entitled(link)]

    def end(self, link: PeerLink) -> None:
        """End a link :meth:`ended` named: through :attr:`farewell` (which closes it
        within seconds, after handing over the revocation), else at once."""
        if link in self._leaving:
            return
        self.count("agreement_ended")
        if self.farewell is None:
            link.close("the federation agreement is no longer in force")
            return
        self._leaving.add(link)
        self.farewell(link)

    def rows(self) -> list[dict[str, Any]]:
        """The links as ``hearthnet peers`` rows (the fields of a mesh peer's row, no
        heartbeats on such links: ``rtt_ms_p50`` and ``loss_pct`` are null), with
        ``community`` (theirs), ``bridge`` (named a bridge by an agreement in force) and
        ``relay`` (the peer relays: a relay of theirs that we attached to)."""
        return [
            {
                "node": node,
                "name": link.peer.name or self._name(node, link.peer.community),
                "linked": True,
                "direction": "outbound" if link.outbound else "inbound",
                "url": link.address or link.peer.url,
                "rtt_ms_p50": None,
                "loss_pct": None,
                "queued": link.queued,
                "protocol": link_subprotocol(link.peer.link),
                **path_fields(link),
                "remote": observed_address(link),
                "community": link.peer.community,
                "bridge": self.serves(node, link.peer.community),
                "relay": link.peer.relay,
                "relays": list(link.peer.relays),
            }
            for node, link in self.links.items()
        ]

    def _name(self, node: str, community: str | None) -> str | None:
        return self.name_of(node, community) if community is not None else None

    def close_all(self, reason: str) -> None:
        """Close every federated link (the node stops)."""
        for link in list(self.links.values()):
            link.close(reason)
