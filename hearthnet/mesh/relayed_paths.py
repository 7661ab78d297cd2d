"""The member role's relayed paths (spec §8): the traffic of the links this node has
through its attached relays, under :class:`~hearthnet.mesh.relaying.Relaying`.

A community member this node has no direct link to and cannot dial (no address, or every
address failed) is reached through an attached relay: a
:class:`~hearthnet.mesh.relayed_link.RelayedLink` that the mesh uses like any link, whose
frames :class:`~hearthnet.mesh.paths.PathCore` numbers and
:class:`~hearthnet.mesh.relay_member.RelayEndpoint` seals end to end into ``route``
frames (:meth:`RelayedPaths.route_out`); the ``route`` frames addressed to us are opened
(:meth:`RelayedPaths.unwrap`) and their frames delivered in order, once. The path core's
actions are carried out here: transmissions, deliveries, attaching to and detaching from
relays (:class:`~hearthnet.mesh.relay_attach.RelayAttachments`), path changes, and punches
(:class:`~hearthnet.mesh.punching.Puncher`); frames waiting for a relay's budget are
released the moment the first fits (:mod:`hearthnet.mesh.pacing`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any

from hearthnet.clock import now_ms
from hearthnet.errors import HearthNetError, WireError
from hearthnet.mesh import route_header as wire
from hearthnet.mesh.links import PeerLink
from hearthnet.mesh.member_wiring import MemberHooks, MemberSettings, MemberShared
from hearthnet.mesh.path_switch import PathSwitch, register_switch_metrics, switch_counts
from hearthnet.mesh.paths import (
    Deliver,
    PathChanged,
    PathCore,
    PathState,
    StartPunch,
    Transmit,
    describe,
)
from hearthnet.mesh.pathseq import is_gossip, is_heartbeat
from hearthnet.mesh.protocol import PeerInfo, decode_frame, encode_frame
from hearthnet.mesh.relay_attach import RelayAttachments
from hearthnet.mesh.relay_choice import AttachRelay, DetachRelay, RelayChoiceConfig
from hearthnet.mesh.relay_federated import federated_peer
from hearthnet.mesh.relay_frames import Route
from hearthnet.mesh.relay_member import EndpointConfig, RelayEndpoint, register_member_metrics
from hearthnet.mesh.relayed_link import RelayedLink, is_relayed

log = logging.getLogger("hearthnet.mesh.relaying")

RELEASE_SLACK_S = 0.001  # a paced frame is released this long after it fits the budget
SCAN_S = 1.0  # how often members without a path are looked for
PROBE_TIMEOUT_S = 30.0  # a relayed path whose probe got no answer is dropped and retried
HELLO_RETRY_MS = 1000  # an unanswered e2e hello is sent again this often
ATTACH_TARGET = 2  # relays a member stays attached to, of those it knows (failover)


class RelayedPaths:
    """The member role: a path core, end-to-end sessions and relay attachments, and the
    relayed links they carry; :class:`~hearthnet.mesh.relaying.Relaying` feeds it."""

    def __init__(self, shared: MemberShared, hooks: MemberHooks, settings: MemberSettings) -> None:
        keys, counts = shared.keys, shared.counts
        self.node_id = keys.node_id
        self.membership = shared.membership
        self.federated = shared.federated
        self.links = shared.links
        self.reach = shared.reach  # relays of ours and of theirs
        self.book = shared.book
        self.dispatch = hooks.dispatch
        self.admit = hooks.admit
        self.on_down = hooks.on_down
        self.federated_down = hooks.federated_down
        self.errors = shared.errors
        self.counts = counts  # relayed frames and bytes, refusals
        self.max_links = settings.max_links
        self.puncher = shared.puncher  # the direct upgrade, once the node listens
        self._next_scan = 0.0
        # peers we opened a relayed path to, until it is up: when the probe went out
        self._probing: dict[str, float] = {}
        self._release: asyncio.TimerHandle | None = None  # frames waiting for a budget
        self._release_at = 0.0  # when (time.monotonic) the armed release fires
        # relays join the path core as they are linked (their NodeIDs are not known yet)
        # spec §8 failover: a second relay stays attached, so when one dies its peers move
        # to the other at once (no re-attach, and the other side's relay already has us)
        choice = RelayChoiceConfig(attach_target=ATTACH_TARGET)
        self.paths = PathCore(
            self.node_id, (), config=settings.path_config, epoch=now_ms(), relay_config=choice
        )
        # relayed links turning direct, in order
        self.switch = PathSwitch(self.paths, self.links, self.path_actions, self.forget)
        # a hello lost to a relay that did not yet have the peer is retried in 1 s
        self.endpoint = RelayEndpoint(
            keys, shared.is_member, EndpointConfig(handshake_timeout_ms=HELLO_RETRY_MS)
        )
        self.attachments = RelayAttachments(  # attach, keepalive, failover
            links=self.reach,
            paths=self.paths,
            keepalive=settings.keepalive,
            counts=counts,
            carry=self.path_actions,
            candidate=lambda a: p.candidate(a) if (p := self.puncher()) is not None else None,
            book=self.book,
        )
        register_member_metrics(shared.metrics, self.endpoint, counts, self.paths)
        register_switch_metrics(shared.metrics, self.switch)

    def tick(self, now: float) -> None:
        """Resends, acks, hellos, relay attachments, switches, and new paths."""
        self.path_actions(self.paths.tick(now))
        for route in self.endpoint.tick(now_ms()):
            self.route_out(route)
        self.attachments.tick(now)
        self.switch.tick(now)
        if now >= self._next_scan:
            self._next_scan = now + SCAN_S
            self.scan(now)

    def punched(self, peer: str, nonce: str, ok: bool) -> None:
        """A punch ended: a punched link replaced the relayed one (the switch is carried
        out when the relayed link closes, see
        :meth:`~hearthnet.mesh.relaying.Relaying.link_down`), or the peer stays
        relayed and the path core retries later."""
        link = self.links.get(peer)
        if not ok or link is None or is_relayed(link):
            self.path_actions(self.paths.punch_failed(peer, nonce, time.monotonic()))

    def scan(self, now: float) -> None:
        """Members we have no direct link to and cannot dial get a relayed path, while
        this node has room for links (spec §7.2's D; the others are reached through the
        relay's own links, like any peer we are not linked to)."""
        for node, sent in list(self._probing.items()):
            if now - sent > PROBE_TIMEOUT_S:  # offline, or not attached to our relay
                self.forget(node)
        room = self.max_links - len(self.links) - len(self._probing)
        if self.paths.relays.primary is None or room <= 0:
            return
        dialable = {
            a.node for a in self.book.addresses.values() if a.node is not None and a.failures == 0
        }
        for node in [*self.membership.members, *self.federated.targets]:
            if (
                node == self.node_id
                or node in self.reach
                or node in self.attachments.relays
                or node in dialable
                or self.paths.path(node)[0] is not PathState.DOWN
            ):
                continue
            if room <= 0:
                return
            room -= 1
            self.path_actions(self.paths.connect(node, now))
            # a probe opens the end-to-end session; the link comes up with the first frame
            # back, so a peer shows as relayed only once frames flow both ways
            self._probing[node] = now
            self._transmit(node, encode_frame("ping", seq=0, ts=now_ms()))

    def open(self, node: str, *, outbound: bool) -> PeerLink | None:
        """The link to ``node``: the one up, else a new relayed link (None while a relayed
        path has no relay yet)."""
        existing = self.reach.get(node)
        if existing is not None:
            return existing
        if len(self.links) >= 2 * self.max_links:
            return None  # as full as accept() takes; the peer reaches us through the relay
        state, via = self.paths.path(node)
        if state is PathState.DOWN or via is None:
            return None
        member = self.membership.members.get(node)
        foreign = None if member is not None else self.federated.bridge_of(node)
        if member is None and foreign is None:
            if self.federated.community_of(node) is not None:
                self.federated.count("not_a_bridge")  # spec §8: named bridges only
            return None  # neither ours nor a federated bridge (any more): no link
        info = PeerInfo(node, (member.name if member is not None else None) or "", None, "")
        link = RelayedLink(
            replace(info, community=foreign),
            via,
            outbound=outbound,
            transmit=self._transmit,
            on_frame=self.dispatch if foreign is None else self.federated.frame,
            on_down=self.on_down if foreign is None else self.federated_down,
            errors=self.errors,
            successor=self.reach.get,
        )
        if foreign is not None:  # spec §8: a bridge's requests only, never the mesh's
            return link if self.federated.up(link) else None
        if not self.admit(link):
            return self.links.get(node)
        log.info("relayed link up with %s via %s", node, via, extra={"peer": node})
        return link

    def _transmit(self, peer: str, data: bytes) -> bool:
        """A relayed link's frame into the path core; False when the peer is stuck."""
        try:
            if is_heartbeat(data):  # never behind frames a relay refused (pathseq.py)
                actions = self.paths.send_unsequenced(peer, data, time.monotonic())
            else:  # gossip may be shed when the relay's budget is far behind (paths.py)
                actions = self.paths.send(peer, data, time.monotonic(), sheddable=is_gossip(data))
        except WireError as exc:  # Unavailable: too much unacknowledged; CapacityExceeded
            log.info("relayed path to %s: %s", peer, exc, extra={"peer": peer})
            return False
        self.path_actions(actions)
        return True

    def path_actions(self, actions: list[Any]) -> None:
        self._carry(actions)
        at = self.paths.paced.release_at
        if at is not None and (self._release is None or at < self._release_at):
            # frames wait for a relay's budget: release them the moment the first fits
            # (a millisecond later: the loop's clock is coarser than time.monotonic)
            if self._release is not None:
                self._release.cancel()
            delay = at - time.monotonic() + RELEASE_SLACK_S
            self._release = asyncio.get_running_loop().call_later(delay, self._released)
            self._release_at = at

    def _released(self) -> None:
        """The moment a frame waiting for a relay's budget fits it (pacing.py)."""
        self._release = None
        self.path_actions(self.paths.paced.release(time.monotonic()))

    def _carry(self, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, Transmit):
                if action.via is None:
                    self.switch.transmit(action)  # a relayed sequence on the direct link
                    continue
                for route in self.endpoint.wrap(action.peer, action.frame, now_ms()):
                    self.route_out(route, action.via)
            elif isinstance(action, Deliver):
                self._deliver(action.peer, action.frame)
            elif isinstance(action, (AttachRelay, DetachRelay)):
                self.attachments.act(action)
            elif isinstance(action, PathChanged):
                link = self.links.get(action.peer)
                if isinstance(link, RelayedLink) and action.via is not None:
                    link.via = action.via
                    link.upgrading = action.state is PathState.UPGRADING
            elif isinstance(action, StartPunch):
                puncher = self.puncher()
                if puncher is not None:
                    puncher.start(action)  # it reports to punched()
                else:
                    self.path_actions(
                        self.paths.punch_failed(action.peer, action.nonce, time.monotonic())
                    )

    def route_out(self, route: Route, via: str | None = None) -> None:
        relay = via if via is not None else self.paths.path(route.to)[1]
        link = self.reach.get(relay) if relay is not None else None
        if link is None or is_relayed(link):
            self.counts["dropped_no_relay"] += 1  # resent by the path sequence or hello timer
            return
        self.counts["frames_out"] += 1
        self.counts["bytes_out"] += len(route.inner)
        # enqueue: a route is a third node's, never in this link's sequence (path_switch.py)
        link.enqueue(wire.encode_route(route) if link.v2 else wire.v1_bytes(route))

    def unwrap(self, link: PeerLink, route: Route) -> None:
        opened = self.endpoint.unwrap(route, now_ms())
        if opened.refused is not None:
            # spec §8: altered, replayed or forged on the way; refused and counted
            log.info(
                "refused a relayed frame from %s via %s: %s",
                route.from_,
                link.node,
                opened.refused,
                extra={"peer": route.from_},
            )
        else:
            self.counts["frames_in"] += 1
            self.counts["bytes_in"] += len(route.inner)
        for reply in opened.routes:
            self.route_out(reply, link.node)
        now = time.monotonic()
        if opened.renewed:  # after the hello's answer: resent under the new session
            self.switch.renewed(route.from_, now)
        for frame in opened.frames:
            self.switch.opened(route.from_, frame)
            self.path_actions(self.paths.receive(route.from_, frame, now))
        if opened.frames:
            self.switch.came_via[route.from_] = link.node  # where unreachable moves it
            # relayed frames after a direct link came up: it takes the path
            self.switch.direct_serves(route.from_, now)

    def _deliver(self, peer: str, data: bytes) -> None:
        """A peer-link frame from ``peer`` through a relay, in order, once."""
        try:
            frame = decode_frame(data)
            link = self.open(peer, outbound=peer in self._probing)
            self._probing.pop(peer, None)
            if link is None:
                log.debug("a %s frame from %s through a relay: no link for it", frame["t"], peer)
                return
            if frame["t"] == "bye":
                if is_relayed(link):
                    link.close(f"peer said bye: {frame.get('reason', '')}", send_bye=False)
                return
            (self.federated.frame if federated_peer(link) else self.dispatch)(link, frame)
        except HearthNetError as exc:
            log.warning("relayed frame from %s refused: %s", peer, exc, extra={"peer": peer})

    def forget(self, peer: str) -> None:
        """A relayed link ended: its sequence and session start afresh next time (a new
        epoch, so the peer does not take the new frames for old ones)."""
        if log.isEnabledFor(logging.DEBUG):  # what the sequence held is gone with it
            log.debug("forgetting the path to %s: %s", peer, describe(self.paths, peer))
        self.paths.epoch = max(self.paths.epoch + 1, now_ms())
        self.paths.forget(peer)
        self.endpoint.forget(peer)
        self._probing.pop(peer, None)
        self.switch.forgotten(peer)

    def statistics(self) -> dict[str, Any]:
        """The member's numbers, for ``/status``."""
        p = self.paths.statistics()
        return {
            "relays": sorted(self.attachments.relays),  # ours, once linked (attached or not)
            "attached": list(self.paths.relays.attached_relays),  # now, the primary first
            "primary": self.paths.relays.primary,
            # the peers linked through a relay now, as ``hearthnet peers`` shows them: the
            # path core also keeps a path to a peer a direct link serves (a probe it sent
            # before the direct link came, a relayed sequence kept for a fall-back)
            "relayed": sum(1 for link in self.links.values() if is_relayed(link)),
            "resent": p.resent,
            # spec §8 budgets: pacing to the relays' grants, and back-pressure
            "paced_bytes": p.paced_bytes,
            "queued_frames": p.queued_frames,
            "queued_bytes": p.queued_bytes,
            "shed": p.shed,
            "pace_refusals": p.pace_refusals,
            "switched_in_order": self.switch.sequenced,
            "switch": switch_counts(self.switch),  # fall-backs, moves, held sequences
            "refused": dict(self.endpoint.refused),
            "gaps": self.endpoint.gaps,
            **dict(self.counts),
        }
