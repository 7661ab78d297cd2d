"""Relays on a node (spec §8): asyncio glue around the pure relay and path cores.

Two roles, either or both:

- **relay** (``mesh.relay``, ``--relay``): :class:`~hearthnet.mesh.relay_role.RelayRole`,
  the relay side (forwarding, federation, relayed joins); its frames come in here.
- **member** (``mesh.relay_urls``, ``--relay-url``, or relays an invite brought; never
  the relays this node federates with, :func:`member_urls`;
  :class:`Relaying`, which also routes relay frames to the role they belong to): the
  relays are dialled as ordinary peers (their URLs go into the address book) and sent
  ``attach`` (:class:`~hearthnet.mesh.relay_attach.RelayAttachments`: attach, keepalive,
  failover); a community member this node has no direct link to and cannot dial (no
  address, or every address failed) is reached through the attached relay
  (:class:`~hearthnet.mesh.relayed_paths.RelayedPaths`, the member role's traffic): a
  :class:`~hearthnet.mesh.relayed_link.RelayedLink` that the mesh uses like any link,
  whose frames :class:`~hearthnet.mesh.paths.PathCore` numbers and
  :class:`~hearthnet.mesh.relay_member.RelayEndpoint` seals end to end into ``route``
  frames. The peer is who its signed ``e2e_hello`` says, and a member; a frame a
  relay altered, replayed or forged is refused and counted, never delivered.

Budgets: each relay's grant (``attached``, then ``budget``) goes to the path core, which
paces the relayed paths to it (:mod:`hearthnet.mesh.pacing`); gossip to a relayed peer
whose queue is full is shed for anti-entropy to repair.

The direct upgrade: the relay's ``observed_addr`` goes to the path core as our candidate
(with our listening port, :func:`~hearthnet.mesh.punching.candidate`), and its
``StartPunch`` to :class:`~hearthnet.mesh.punching.Puncher`; a punched link replaces the
relayed one like any direct link, in order (:mod:`hearthnet.mesh.path_switch`), and a
failed punch leaves the peer relayed. A join a relay carried to us, the inviter, is
answered by :class:`RelayedJoins`.

Community federation (spec §8): nodes of federated communities attach and route to and
from our members only, on links kept apart from the mesh's
(:mod:`hearthnet.mesh.relay_federated`).
"""

from __future__ import annotations

import logging
import time
from collections import ChainMap
from collections import Counter as Tally
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from hearthnet.config import MeshSection
from hearthnet.errors import HearthNetError
from hearthnet.identity import KeyPair
from hearthnet.ids import public_key_from_node_id
from hearthnet.membership import Membership
from hearthnet.mesh import route_header as wire
from hearthnet.mesh.addresses import PeerBook, normalize_url
from hearthnet.mesh.links import LinkErrors, PeerLink
from hearthnet.mesh.member_wiring import Dispatch, MemberHooks, MemberSettings, MemberShared
from hearthnet.mesh.pacing import Budget
from hearthnet.mesh.path_frames import Drain, PAck, PFrame
from hearthnet.mesh.paths import (
    PathConfig,
    PathCore,
)
from hearthnet.mesh.punching import Puncher
from hearthnet.mesh.relay_core import RelayConfig, RelayCore
from hearthnet.mesh.relay_federated import FederatedLinks
from hearthnet.mesh.relay_frames import (
    RELAY_FRAME_KINDS,
    Attach,
    Attached,
    Detach,
    JoinAnswer,
    JoinVia,
    Route,
    RouteError,
    parse_frame,
)
from hearthnet.mesh.relay_keepalive import KeepaliveConfig
from hearthnet.mesh.relay_role import JoinHandler, RelayedJoins, RelayRole
from hearthnet.mesh.relayed_link import (
    PEER_RENEWED,
    REPLACED_BY_DIRECT,
    SHUTTING_DOWN,
    RelayedLink,
    is_relayed,
)
from hearthnet.mesh.route_batch import (
    BATCH_PREFIX,
    RouteRun,
    batch_frames,
    join_routes,
    joined_runs,
    single_runs,
)
from hearthnet.metrics import MetricsRegistry

if TYPE_CHECKING:
    # the member role's modules, imported when it starts (a node with no relay does not
    # load them, spec §11: idle RSS)
    from hearthnet.mesh.path_switch import PathSwitch
    from hearthnet.mesh.relay_attach import RelayAttachments
    from hearthnet.mesh.relay_member import RelayEndpoint
    from hearthnet.mesh.relayed_paths import RelayedPaths

log = logging.getLogger("hearthnet.mesh.relaying")

TICK_S = 0.25  # the path core wants ~0.5 s; the relay core ~1 s


def member_urls(urls: Iterable[str], relay: RelayRole | None, book: PeerBook) -> tuple[str, ...]:
    """The relays a node attaches to as a member, and tells peers it is reached through:
    ``urls`` but those of relays it federates with (spec §8: a relay refuses ``attach``
    on a federated link), named with ``--relay-peer`` or found by our own dial at such a
    URL (a second relay joined with an invite made on the first has the first's URL
    among its relays, maybe as a name where ``--relay-peer`` gives an IP address)."""
    given = tuple(dict.fromkeys(urls))
    if relay is None:
        return given
    peers = set(relay.verified.values())
    ours = tuple(
        url for url in given if url not in relay.peer_urls and book.verified_node(url) not in peers
    )
    for url in given:
        if url not in ours:
            log.info("relay %s is a relay peer: federating with it, not attaching", url)
    return ours


class Relaying:
    """This node's relay role and relayed paths; the mesh feeds it relay frames, link
    changes and the clock (:meth:`tick` every :data:`TICK_S`)."""

    def __init__(
        self,
        *,
        keys: KeyPair,
        membership: Membership,
        config: MeshSection,
        links: dict[str, PeerLink],
        book: PeerBook,
        dispatch: Dispatch,
        admit: Callable[[PeerLink], bool],
        on_down: Callable[[PeerLink, str], None],
        errors: LinkErrors,
        metrics: MetricsRegistry,
        dial: Callable[[str], object] | None = None,
    ) -> None:
        self.keys = keys
        self.node_id = keys.node_id
        self._own_key = public_key_from_node_id(keys.node_id)
        self.membership = membership
        # served by the relay, accepted end to end: a live member of this community, or
        # of a federated one under an agreement in force (spec §8, relay_federated.py)
        self.federated = FederatedLinks(metrics)
        self.is_own: Callable[[str], bool] = lambda node: membership.level_of(node) is not None
        self.is_member: Callable[[str], bool] = lambda node: (
            self.is_own(node) or self.federated.serves(node)  # their named bridges only
        )
        self.links = links
        self.reach = ChainMap(links, self.federated.links)  # relays of ours and of theirs
        self.book = book
        self.dispatch = dispatch
        self.admit = admit
        self.on_down = on_down
        self.errors = errors
        self.relay: RelayRole | None = None
        # spec §8: admits a join a relay carried to us (the composition root sets it)
        self.join_handler: JoinHandler | None = None
        self.joins = RelayedJoins()
        if config.relay:
            budgets = RelayConfig(
                member_bytes_per_s=config.relay_member_bytes_per_s,
                member_streams=config.relay_member_streams,
                capacity_bytes_per_s=config.relay_capacity_bytes_per_s,
                control_bytes_per_s=config.relay_member_control_bytes_per_s,
            )
            peers = tuple(dict.fromkeys(normalize_url(u) for u in config.relay_peers))
            core = RelayCore(self.node_id, self.is_member, budgets, is_own=self.is_own)
            self.relay = RelayRole(core, metrics, peers, book=book, dial=dial)
        if config.relay_peers and not config.relay:
            log.warning("mesh.relay_peers (--relay-peer) is ignored: this node is not a relay")
        self.relay_urls = member_urls(
            (normalize_url(u) for u in config.relay_urls), self.relay, book
        )
        self.paths: PathCore | None = None
        self.attachments: RelayAttachments | None = None  # member role: attach, keepalive
        self.endpoint: RelayEndpoint | None = None
        self.puncher: Puncher | None = None  # the direct upgrade, once the node listens
        self.metrics = metrics
        self.max_links = config.max_links
        self.member: RelayedPaths | None = None  # the member role's relayed paths
        # a held sequence was forgotten: the calls tied to it end (peer, why; the mesh's)
        self.calls_ended: Callable[[str, str], None] = lambda peer, why: None
        self.switch: PathSwitch | None = None  # relayed links turning direct, in order
        self.counts: Tally[str] = Tally()  # member side: relayed frames and bytes, refusals
        self._keepalive = KeepaliveConfig(config.relay_keepalive_s, config.relay_silence_s)
        # back-pressure on a paced relayed path: gossip past this is shed (paths.py)
        self._path_config = PathConfig(shed_bytes=config.relay_pace_queue_bytes)
        if self.relay_urls:
            self._become_member()

    def _become_member(self) -> None:
        """Start the member role: a path core and end-to-end sessions."""
        from hearthnet.mesh.relayed_paths import RelayedPaths  # noqa: PLC0415 - see TYPE_CHECKING

        shared = MemberShared(
            keys=self.keys,
            membership=self.membership,
            is_member=self.is_member,
            federated=self.federated,
            links=self.links,
            reach=self.reach,
            book=self.book,
            errors=self.errors,
            metrics=self.metrics,
            counts=self.counts,
            puncher=lambda: self.puncher,
        )
        hooks = MemberHooks(self.dispatch, self.admit, self.on_down, self.federated_down)
        settings = MemberSettings(self.max_links, self._path_config, self._keepalive)
        self.member = RelayedPaths(shared, hooks, settings)
        self.paths = self.member.paths
        self.switch = self.member.switch
        # read when called: the mesh sets ``calls_ended`` after this may have run
        self.switch.held.ended = lambda peer, why: self.calls_ended(peer, why)  # noqa: PLW0108
        self.endpoint = self.member.endpoint
        self.attachments = self.member.attachments
        relay = self.relay
        if relay is not None:  # a relay peer is federated with, not attached to
            self.attachments.federates = lambda node: node in relay.verified.values()

    def start(self) -> None:
        """Put the configured relays' URLs in the address book, so the mesh dials them like
        peers, and take the relays an invite brought (kept in the book, spec §8)."""
        for url in self.relay_urls:  # configured: dialled, not remembered as relays
            self.book.add(url, source="bootstrap")
        if self.relay is not None:  # relays we federate with are dialled the same way
            for url in self.relay.peer_urls:
                self.book.add(url, source="bootstrap")
        saved = [a.url for a in self.book.addresses.values() if a.source == "relay"]
        self.relay_urls = member_urls((*self.relay_urls, *saved), self.relay, self.book)
        if self.relay_urls and self.paths is None:
            self._become_member()

    # --- hooks the mesh calls -------------------------------------------------------------

    def link_established(self, link: PeerLink) -> None:
        """A direct link finished its handshake, before the mesh decides whether it is
        kept: our own dial of a peer relay's URL tells which node that relay is, and an
        inbound link already up with that node federates now (spec §8)."""
        if self.switch is not None:
            self.switch.established(link)  # replacing a relayed link: frames stay in order
        if self.relay is None or is_relayed(link):
            return
        self.relay.dialled(link)
        current = self.links.get(link.node)
        if current is not None and current is not link and not is_relayed(current):
            self.relay.link_up(current, time.monotonic())

    def link_up(self, link: PeerLink) -> None:
        """A link was admitted: attach when it is one of our relays, federate when it is
        a relay we federate with (spec §8)."""
        if self.relay is not None and not is_relayed(link):
            self.relay.link_up(link, time.monotonic())
        if self.attachments is not None and not is_relayed(link):
            self.attachments.linked(link, ours=link.address in self.relay_urls)
        if self.switch is not None and not is_relayed(link):
            # a path relayed with no relayed link to replace (a probe still out) goes direct
            self.switch.direct_serves(link.node, time.monotonic())

    def link_down(self, link: PeerLink) -> bool:
        """A link ended: the relay core forgets it; our relay's loss moves its peers. True:
        a direct link died within a switch and a relayed one took its place (calls go on)."""
        now = time.monotonic()
        if self.relay is not None:
            self.relay.link_down(link, now)
        if isinstance(link, RelayedLink):
            # replaced by a direct link: frames already on the relayed path still arrive
            # (in order, once, resent if lost) before the direct link's (path_switch.py)
            if link.down_reason == REPLACED_BY_DIRECT and self.switch is not None:
                self.switch.replaced(link.node, now)
            elif link.down_reason != PEER_RENEWED and self.member is not None:
                self.member.forget(link.node)
            return False
        if self.attachments is not None:
            self.attachments.unlinked(link, now)
        # no falling back when either end shuts down (a bye), or the peer left the community
        reason = link.down_reason
        gone = reason.startswith("peer said bye") or reason == SHUTTING_DOWN
        gone = gone or not self.is_member(link.node)
        if self.member is not None and self.member.switch.direct_down(link, now, gone=gone):
            return self.member.open(link.node, outbound=link.outbound) is not None
        return False

    def held_link(self, node: str) -> PeerLink | None:
        """While ``node``'s sequence is held (its direct link died with no relay, spec §8):
        the dead link, whose frames wait in the sequence for the next link."""
        if self.switch is None:
            return None
        link = self.switch.held.link(node)
        return link if isinstance(link, PeerLink) else None

    def replaced_link_down(self, link: PeerLink) -> None:
        """A link that another link to the same peer replaced has ended: the relay core
        forgets it (else a federated relay's routes would point at a closed link)."""
        if self.relay is not None and not is_relayed(link):
            self.relay.link_down(link, time.monotonic())

    def on_binary(self, link: PeerLink, data: bytes) -> None:
        """A binary route frame off a direct link (spec §8, §11): ours is opened, any
        other a relay passes on from its header alone; a node that does not relay drops
        it.

        Raises:
            BadRequest: malformed (the link logs it and goes on).
        """
        if data[:4] == BATCH_PREFIX:  # many route frames in one message (a v4 link)
            self._batch_in(link, data)
        elif data[wire.TO_AT : wire.FROM_AT] == self._own_key:
            self._route_in(link, wire.parse_route(data))
        elif self.relay is not None and not is_relayed(link):
            self.relay.forward(link, data, time.monotonic())
        else:
            wire.read_header(data)  # a malformed frame raises; a well-formed one is counted
            self.counts["misdelivered"] += 1

    def on_routes(self, link: PeerLink, frames: list[bytes]) -> bool:
        """Binary messages of one socket read off a direct link, in order (spec §11): a
        relay joins the route frames and route batches among them into route batches
        and takes them as it takes one batch, each frame decided as alone. False, and
        nothing taken, where this node does not relay, the link is relayed, or a message
        is not a well-formed route frame or batch: the link then hands each message to
        :meth:`on_binary`, which refuses or takes it alone."""
        relay = self.relay
        if relay is None or is_relayed(link):
            return False
        singles = single_runs(frames)  # each message one route frame: read at once
        if singles is not None:
            self._batch_in(link, singles[0], singles[1], len(frames))
            return True
        batches = join_routes(frames)
        if batches is None:
            return False
        try:
            read = [(joined, joined_runs(joined)) for joined in batches]
        except HearthNetError:  # a field out of range: each message refused alone
            return False
        for joined, runs in read:
            self._batch_in(link, joined.data, runs, joined.messages)
        return True

    def _batch_in(
        self, link: PeerLink, data: bytes, runs: list[RouteRun] | None = None, messages: int = 1
    ) -> None:
        """A route batch (spec §11): a relay passes on the frames not addressed to us;
        ours are opened in order; a node that does not relay drops the others."""
        if self.relay is not None and not is_relayed(link):
            spans = self.relay.forward_batch(link, data, time.monotonic(), runs, messages)
        else:
            spans = batch_frames(data)
        own = self.node_id
        for head, start, end in spans:
            if head.to == own:
                inner = data[start + wire.HEADER_BYTES : end]
                route = Route(head.to, head.from_, head.ttl_hops, head.id, inner, head.control)
                self._route_in(link, route)
            else:
                self.counts["misdelivered"] += 1

    def on_frame(self, link: PeerLink, raw: dict[str, Any]) -> bool:
        """Take a relay frame off ``link``; False when ``raw`` is not one."""
        if raw.get("t") not in RELAY_FRAME_KINDS:
            return False
        frame = parse_frame(raw)  # a malformed frame raises; the link logs and goes on
        now = time.monotonic()
        ours = self.attachments
        if isinstance(frame, Route) and frame.to == self.node_id:
            self.counts["v1_routes_in"] += 1  # the CBOR map form: a hearthnet-peer.v1 relay
            self._route_in(link, frame)
        elif isinstance(frame, (PFrame, PAck, Drain)) and not is_relayed(link):
            if self.switch is not None:  # a relayed sequence continued on a direct link
                self.switch.path_frame(link, frame, now)
        elif isinstance(frame, Attached):
            if ours is not None:
                ours.attached(link, frame, now)
        elif isinstance(frame, Budget):
            if ours is not None:
                ours.budget(link, frame, now)
        elif isinstance(frame, Detach) and ours is not None and link.node in ours.relays:
            ours.detached(link, frame, now)
        elif isinstance(frame, JoinVia) and not is_relayed(link):
            self.joins.answer(link, frame, self.join_handler)
        elif isinstance(frame, JoinAnswer) and self.relay is not None:
            self.relay.join_answered(link, frame)
        elif isinstance(frame, RouteError) and frame.origin == self.node_id:
            # the path sequence resends what did not arrive; rate_limited waits its turn
            self.counts[f"route_error_{frame.code}"] += 1
            if frame.code == "rate_limited" and self.paths is not None:
                # a refusal all the same: pause that relay as it asks (pacing.py)
                self.paths.pacer.refused(link.node, frame.retry_after_ms, now)
            elif frame.code == "unreachable" and self.switch is not None:
                # a fall-back to a peer not there: another relay, or the link closes
                self.switch.unreachable(frame.to, link.node, now)
        elif self.relay is not None and not is_relayed(link):
            self.relay.receive(link, frame, now)
        elif isinstance(frame, Attach):
            link.send_raw(Detach("unauthorized", "this node is not a relay").encode())
        # else: path frames come sealed through a relay; a punched link carries peer
        # frames, not path frames
        return True

    def tick(self) -> None:
        """Relay tables and budgets, relay attachments, resends, acks, and new paths."""
        now = time.monotonic()
        for ended in self.federated.ended():  # revoked or expired: within a tick (spec §8)
            self.federated.end(ended)
        if self.relay is not None:
            self.relay.tick(now)
            if self.relay_urls:  # a peer relay found at another of its URLs
                self.relay_urls = member_urls(self.relay_urls, self.relay, self.book)
        if self.member is not None:
            self.member.attachments.found(self.relay_urls)
            self.member.tick(now)

    # --- federated communities (spec §8, relay_federated.py) -------------------------------

    def federated_up(self, link: PeerLink) -> bool:
        """A direct link with a federated community's node is established: it attaches
        to our relay, or it is a relay of theirs we attach to; never a mesh link."""
        if not self.federated.up(link):
            return False
        if self.attachments is not None:
            self.attachments.linked(link, ours=link.address in self.relay_urls)
        return True

    def federated_frame(self, link: PeerLink, raw: dict[str, Any]) -> None:
        """A frame off a direct federated link: relay frames it may send, then the rest
        (:meth:`FederatedLinks.frame`)."""
        if raw.get("t") not in RELAY_FRAME_KINDS:
            self.federated.frame(link, raw)
        elif self.federated.relay_frame_allowed(raw):
            self.on_frame(link, raw)

    def federated_down(self, link: PeerLink, reason: str) -> None:
        """A federated link ended (direct or relayed)."""
        if not self.federated.down(link):
            return
        log.info("federated link down with %s: %s", link.node, reason, extra={"peer": link.node})
        if is_relayed(link):
            if self.member is not None:
                self.member.forget(link.node)
            return
        now = time.monotonic()
        if self.relay is not None:
            self.relay.link_down(link, now)
        if self.attachments is not None:
            self.attachments.unlinked(link, now)
        for other in list(self.federated.links.values()):  # their relay ended us: so
            if isinstance(other, RelayedLink) and other.via == link.node:  # do its paths
                other.close("the other community's relay ended our link", send_bye=False)

    # --- member role (relayed_paths.py) ---------------------------------------------------

    def punched(self, peer: str, nonce: str, ok: bool) -> None:
        """A punch ended (:meth:`RelayedPaths.punched`)."""
        if self.member is not None:
            self.member.punched(peer, nonce, ok)

    def _route_in(self, link: PeerLink, route: Route) -> None:
        """A route frame addressed to us: opened by the member role (spec §8)."""
        if self.member is None:
            self.counts["refused_not_attached"] += 1
        else:
            self.member.unwrap(link, route)

    # --- status ---------------------------------------------------------------------------

    def statistics(self) -> dict[str, Any]:
        """The relay's and the member's numbers, for ``/status``."""
        out: dict[str, Any] = {}
        if self.federated.links or self.federated.refused:  # spec §8 community federation
            out["federated"] = {
                "links": sorted(self.federated.links),
                "refused": dict(self.federated.refused),
            }
        if self.relay is not None:
            out["relay"] = self.relay.statistics()
        if self.member is not None:
            out["paths"] = self.member.statistics()
        return out
