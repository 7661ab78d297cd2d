"""The mesh on one node (spec §7): the facade the node, the HTTP routes and the CLI's
status go through, and the owner of the mesh's task group.

The parts, each in its own module:

- :mod:`~hearthnet.mesh.dialer`: accepting and dialling links (TLS, handshake, referrals);
- :mod:`~hearthnet.mesh.routing`: which path reaches which node (the seam for relays);
- :mod:`~hearthnet.mesh.traffic`: frames from links through the pure cores
  (:mod:`~hearthnet.mesh.gossip`, :mod:`~hearthnet.mesh.flood`,
  :mod:`~hearthnet.mesh.heartbeat`) and their actions carried out;
- :mod:`~hearthnet.mesh.health`: heartbeats, the heartbeat log and the beacon;
- :mod:`~hearthnet.mesh.remote`: capability calls across links.

Every background loop and every link task belongs to the task group of :meth:`Mesh.run`,
which the node runs in its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from hearthnet.auth import Authenticator
from hearthnet.bus.calls import Bus
from hearthnet.bus.routing import Router
from hearthnet.community import MembershipRecord
from hearthnet.config import MeshSection
from hearthnet.errors import HearthNetError
from hearthnet.identity import KeyPair
from hearthnet.membership import Membership
from hearthnet.mesh.addresses import PeerBook, normalize_url
from hearthnet.mesh.announce import Announcement
from hearthnet.mesh.dialer import Dialer
from hearthnet.mesh.gossip import OriginTracker
from hearthnet.mesh.health import LinkHealth
from hearthnet.mesh.links import LinkErrors, PeerLink
from hearthnet.mesh.protocol import link_subprotocol
from hearthnet.mesh.punching import Puncher
from hearthnet.mesh.relay_federated import federated_peer
from hearthnet.mesh.relayed_link import (
    REPLACED_BY_DIRECT,
    SHUTTING_DOWN,
    is_relayed,
    observed_address,
    path_fields,
)
from hearthnet.mesh.relaying import TICK_S as RELAY_TICK_S
from hearthnet.mesh.relaying import Relaying
from hearthnet.mesh.remote import RemoteCalls
from hearthnet.mesh.routing import Routes
from hearthnet.mesh.traffic import LinkTraffic, SubmitRecords
from hearthnet.metrics import MetricsRegistry
from hearthnet.pubsub.envelope import StoredMessage
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.presence import PresenceEvent
from hearthnet.pubsub.service import PubSub

if TYPE_CHECKING:  # zeroconf is loaded only when [mesh] zeroconf is on (spec §11)
    from hearthnet.mesh.discovery import Discovery

log = logging.getLogger("hearthnet.mesh")

HOUSEKEEPING_S = 1.0  # heartbeat-log flush and peer-book save


class Mesh:
    """This node's part of the community mesh."""

    def __init__(
        self,
        *,
        keys: KeyPair,
        membership: Membership,
        submit_records: SubmitRecords,
        config: MeshSection,
        name: str,
        data_dir: Path,
        tls_mode: str = "auto",
        message_log: MessageLog,
        pubsub: PubSub,
        authenticator: Authenticator,
        bus: Bus,
        router: Router,
        metrics: MetricsRegistry,
    ) -> None:
        self.keys = keys
        self.membership = membership
        self.config = config
        self.name = name
        self.tls_mode = tls_mode
        self.log = message_log
        self.url = ""
        self.book = PeerBook(data_dir / "mesh" / "peers.json")
        self.routes = Routes(keys.node_id)
        self.discovery: Discovery | None = None
        self._announce_at: tuple[str, int] | None = None  # zeroconf: where we listen
        self._group: asyncio.TaskGroup | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        m = metrics
        link_errors = LinkErrors.register(m)
        m.gauge("hearthnet_peers_linked", "Peer links up.", lambda: float(len(self.routes)))
        self.health = LinkHealth(
            keys=keys,
            name=name,
            community=membership.community_id,
            heartbeat_s=config.heartbeat_s,
            data_dir=data_dir,
            routes=self.routes,
            book=self.book,
            message_log=message_log,
            pubsub=pubsub,
            metrics=m,
        )
        self.refused = m.counter(
            "hearthnet_mesh_refused_total", "Peer links refused, by reason.", ("reason",)
        )
        self.link_events = m.counter(
            "hearthnet_mesh_link_events_total", "Links up and down.", ("event",)
        )
        self.repaired = m.counter(
            "hearthnet_gossip_repaired_total", "Messages sent to peers by anti-entropy repair."
        )
        sig_failures = m.counter(
            "hearthnet_signature_failures_total",
            "Signatures, tokens and credentials refused, by reason.",
            ("reason",),
        )
        self.remote = RemoteCalls(
            node_id=keys.node_id,
            authenticator=authenticator,
            bus=bus,
            router=router,
            # a call's frames go on the peer's link, or while its sequence is held (spec
            # §8) on the dead link, whose frames wait in it for the next link
            link_to=lambda node: self.routes.path_to(node) or self.relaying.held_link(node),
            spawn=self.spawn,
        )
        self.traffic = LinkTraffic(
            node_id=keys.node_id,
            membership=membership,
            submit_records=submit_records,
            repair_per_round=config.repair_per_round,
            message_log=message_log,
            pubsub=pubsub,
            routes=self.routes,
            remote=self.remote,
            health=self.health,
            book=self.book,
            spawn=self.spawn,
            repaired=self.repaired,
            sig_failures=sig_failures,
        )
        # relays (spec §8): the relay role and relayed paths live in mesh/relaying.py
        self.relaying = Relaying(
            keys=keys,
            membership=membership,
            config=config,
            links=self.routes.links,
            book=self.book,
            dispatch=self.traffic.receive,
            admit=self._link_up,
            on_down=self._link_down,
            errors=link_errors,
            metrics=m,
            dial=lambda url: self.spawn(self.dial(url), f"dial-{url}"),
        )
        # spec §8: calls tied to a held sequence wait for the next link, or end with it
        self.remote.is_held = lambda node: self.relaying.held_link(node) is not None
        self.remote.counts.register(m)  # what the calls sent again (call_hold.py)
        self.relaying.calls_ended = self.traffic.forget  # no link in time: calls, routes
        self.dialer = Dialer(
            keys=keys,
            membership=membership,
            config=config,
            name=name,
            tls_mode=tls_mode,
            book=self.book,
            routes=self.routes,
            refused=self.refused,
            link_errors=link_errors,
            spawn=self.spawn,
            admit=self._link_up,
            on_frame=self._on_frame,
            on_down=self._link_down,
            on_binary=self.relaying.on_binary,
            on_routes=self.relaying.on_routes,
            federated=self.relaying.federated.allows,  # spec §8: their nodes, via relays
        )
        self.dialer.federated_links = self.relaying.federated.links
        self.dialer.bridge = self.relaying.federated.admits  # spec §8: named bridges only
        self.dialer.relay_urls = lambda: self.relaying.relay_urls  # spec §8: in v4 hellos

        # the direct upgrade (spec §8): StartPunch from the path core, carried out here
        self.puncher = Puncher(
            node_id=keys.node_id,
            linked_direct=self._linked_direct,
            dial=self.dialer.dial_punched,
            serve=None,
            spawn=self.spawn,
            report=self.relaying.punched,
        )
        self.puncher.register(m)
        if config.direct_upgrade:
            self.relaying.puncher = self.puncher

    def _linked_direct(self, node: str) -> bool:
        link = self.routes.links.get(node)
        return link is not None and not is_relayed(link)

    @property
    def links(self) -> dict[str, PeerLink]:
        """The direct links up, by the peer's NodeID."""
        return self.routes.links

    @property
    def tracker(self) -> OriginTracker:
        """Which messages of each origin this node holds."""
        return self.traffic.gossip.tracker

    # --- life -------------------------------------------------------------------------

    async def start(
        self,
        url: str,
        *,
        host: str,
        port: int,
        serve_socket: Callable[[socket.socket, str], bool] | None = None,
    ) -> None:
        """Load what survives restarts (peer addresses, which messages we hold); LAN
        discovery starts with :meth:`run`."""
        self.url = self.dialer.url = self.config.advertise_url or url
        self.book.own_urls.add(normalize_url(self.url))
        self.book.load()
        for peer in self.config.peers:
            self.book.add(peer, source="bootstrap")
        self.relaying.start()  # relays: their URLs are dialled like peers
        # the direct upgrade punches from the port we listen on; the server takes the socket
        self.puncher.listening(host, port)
        self.puncher.serve = serve_socket
        for origin, floor, head, above, done in await self.log.reader.origin_heads():
            self.tracker.load(origin, head, floor, above, done)
        if self.config.zeroconf:
            self._announce_at = (host, port)

    async def _start_discovery(self, host: str, port: int) -> None:
        from hearthnet.mesh.discovery import Discovery  # noqa: PLC0415 - see TYPE_CHECKING

        everywhere = host in ("0.0.0.0", "", "::")  # noqa: S104 - comparing, not binding

        def found(announcement: Announcement) -> None:
            for url in announcement.urls:
                self.book.add(url, node=announcement.node, source="zeroconf")

        try:
            announcement = Announcement.local(
                node=self.keys.node_id,
                community=self.membership.community_id,
                name=self.name,
                port=port,
                tls=self.tls_mode != "off",
                addresses=() if everywhere else (host,),
            )
            self.discovery = Discovery(
                announcement,
                on_found=found,
                on_lost=lambda node: None,
                interfaces=None if everywhere else [host],
            )
            await self.discovery.start()
        except (HearthNetError, OSError) as exc:
            # No multicast here (a container, a host with no LAN): links still come from
            # --peer, invites and peer exchange.
            log.warning("zeroconf discovery is off: %s", exc)
            self.discovery = None

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """A task owned by the mesh's task group; its failure is logged, not fatal."""

        async def guarded() -> None:
            try:
                await coro
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("mesh task %s failed", name)

        if self._group is None:
            raise RuntimeError("the mesh is not running")
        task = self._group.create_task(guarded(), name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # a task cancelled before its first step (the mesh stopping) never awaits ``coro``
        task.add_done_callback(lambda _t: coro.close())
        return task

    async def run(self) -> None:
        """All mesh loops; returns only when cancelled (the node stops it)."""
        try:
            async with self.dialer.session(), asyncio.TaskGroup() as group:
                self._group = group
                cfg = self.config
                traffic, health = self.traffic, self.health
                for period_s, tick, name in (
                    (cfg.dial_interval_s, self.dialer.dial_tick, "mesh-dial"),
                    (cfg.anti_entropy_s, traffic.messages.repair_tick, "mesh-repair"),
                    (max(0.01, cfg.heartbeat_s / 5), health.tick, "mesh-heartbeat"),
                    (cfg.caps_s, traffic.announce_caps, "mesh-caps"),
                    (cfg.presence_refresh_s, traffic.presence_tick, "mesh-presence"),
                    (cfg.beacon_s, health.beacon_tick, "mesh-beacon"),
                    (HOUSEKEEPING_S, health.housekeeping_tick, "mesh-housekeeping"),
                    (RELAY_TICK_S, self.relaying.tick, "mesh-relaying"),
                ):
                    group.create_task(_every(period_s, tick, name), name=name)
                if self._announce_at is not None:
                    # after the node's ready line: LAN discovery is a hint of where peers
                    # are, not part of being ready (spec §9), and zeroconf takes ~50 ms
                    # to import, in a worker thread while the node serves
                    await asyncio.to_thread(importlib.import_module, "hearthnet.mesh.discovery")
                    await self._start_discovery(*self._announce_at)
                if self.discovery is not None:
                    # a zeroconf failure ends LAN discovery, not the node
                    self.spawn(self.discovery.run(), "mesh-zeroconf")
        finally:
            self._group = None
            if self.discovery is not None:
                with contextlib.suppress(Exception):
                    await self.discovery.stop()
            self.health.hlog.flush()
            self.book.save()

    def stop(self) -> None:
        """Say bye on every link (the task group is cancelled by the node right after)."""
        self.routes.close_all(SHUTTING_DOWN)
        self.relaying.federated.close_all(SHUTTING_DOWN)

    # --- links --------------------------------------------------------------------------

    async def accept(self, request: web.Request) -> web.StreamResponse:
        """``GET /mesh/v1/peer``: a peer dials us (see :meth:`Dialer.accept`)."""
        return await self.dialer.accept(request)

    async def dial(self, url: str) -> None:
        """Dial one address and run the link while it is up (see :meth:`Dialer.dial`)."""
        await self.dialer.dial(url)

    def _link_up(self, link: PeerLink) -> bool:
        """Admit an established link; simultaneous dials keep one (spec §7.2)."""
        if federated_peer(link):  # spec §8: relaying and the bridge's requests only
            return self.relaying.federated_up(link)
        self.relaying.link_established(link)  # relays: which node a peer relay's URL is
        if not self.routes.admit(link):
            return False
        self.health.link_up(link.node)
        self.link_events.inc("up")
        log.info(
            "link up with %s (%s)",
            link.node,
            "outbound" if link.outbound else "inbound",
            extra={"peer": link.node},
        )
        self.traffic.greet(link)
        self.traffic.share_address(link, link.address)
        self.relaying.link_up(link)  # relays: attach when it is one of ours
        return True

    def _link_down(self, link: PeerLink, reason: str) -> None:
        if federated_peer(link):
            self.relaying.federated_down(link, reason)
            if link.address is not None:  # their relay: dialled again when due
                self.book.hold(link.address, time.monotonic(), 0)
            return
        if not self.routes.remove(link):
            self.relaying.replaced_link_down(link)  # relays: the core forgets it too
            return  # a duplicate that lost
        self.health.link_down(link)
        self.link_events.inc("down")
        log.info("link down with %s: %s", link.node, reason, extra={"peer": link.node})
        # relays: detach, move relayed peers; True when a direct link fell back to its relay
        fell_back = self.relaying.link_down(link)
        if link.address is not None:
            self.book.hold(link.address, time.monotonic(), 0)
        # spec §8: calls and routes go on over the link that replaced this one, or wait
        # in the peer's held sequence for the next link (path_hold.py)
        if reason == REPLACED_BY_DIRECT:
            return
        if fell_back or self.relaying.held_link(link.node) is link:
            # what the dead link lost of the calls (call_hold.py; openings only to a peer
            # that drops one it took), then what it never wrote (presence above all:
            # unsent.py); its sequencer hands each frame to the link in its place, or
            # the held sequence
            unsent = link.take_unsent()
            self.remote.resend(link.node, openings=link.peer.takes_call_resends, handed=set(unsent))
            for data in unsent:
                link.send_raw(data)
        else:
            self.traffic.forget(link.node)

    def _on_frame(self, link: PeerLink, frame: dict[str, Any]) -> None:
        """A frame off a direct link: relay frames (spec §8) to the relaying glue, the
        rest through the cores."""
        if federated_peer(link):  # never the mesh's cores (relay_federated.py)
            self.relaying.federated_frame(link, frame)
        elif not self.relaying.on_frame(link, frame):
            self.traffic.receive(link, frame)

    def close_links_of(self, node: str, reason: str) -> None:
        """End the link to ``node`` (revocation)."""
        self.routes.close(node, reason)

    # --- what the node feeds in -----------------------------------------------------------

    def on_commit(self, batch: list[StoredMessage]) -> None:
        """The log committed ``batch``: gossip it on (after local fan-out; see node.py)."""
        self.traffic.messages.committed(batch)

    def on_local_presence(self, events: list[PresenceEvent]) -> None:
        """Local members joined, changed or left: tell the mesh."""
        self.traffic.local_presence([e.to_json() for e in events])

    def broadcast_records(self, records: list[MembershipRecord], skip: str | None = None) -> None:
        """Flood new membership records to every other link."""
        self.traffic.broadcast_records(records, skip)

    # --- status -----------------------------------------------------------------------

    def beacon(self) -> dict[str, Any]:
        """This node's beacon (spec §7.5)."""
        return self.health.beacon()

    def peers_status(self) -> list[dict[str, Any]]:
        """Linked peers and known addresses, for ``hearthnet peers``."""
        out = []
        for node, link in self.links.items():
            tracker = self.health.heartbeats.get(node)
            member = self.membership.members.get(node)
            out.append(
                {
                    "node": node,
                    "name": link.peer.name or (member.name if member else None),
                    "linked": True,
                    "direction": "outbound" if link.outbound else "inbound",
                    "url": link.address or link.peer.url,
                    "rtt_ms_p50": tracker.rtt_p50_ms if tracker else None,
                    "loss_pct": tracker.loss_pct if tracker else None,
                    "queued": link.queued,
                    # older links get no batch frames and no data_enc messages (v3)
                    "protocol": link_subprotocol(link.peer.link),
                    **path_fields(link),  # relays: direct or relayed, and via
                    # the address a direct link's socket uses (a punched link's public
                    # one, where ``url`` is what the peer claims); null when relayed
                    "remote": observed_address(link),
                    "community": None,  # ours (a federated community's id below)
                    "bridge": False,
                    "relay": link.peer.relay,
                    "relays": list(link.peer.relays),  # its hello's (v4, spec §8)
                }
            )
        federated = self.relaying.federated.rows()  # spec §8: other communities' nodes
        out += federated
        linked = set(self.links) | {row["node"] for row in federated}
        # the address a linked peer's hello gives is that peer's, even when our dial of
        # it never got through (a LAN address behind NAT, learnt by peer exchange)
        claimed = {link.peer.url: node for node, link in self.links.items() if link.peer.url}
        for row in self.book.known_peers(linked, claimed):
            member = self.membership.members.get(row["node"]) if row["node"] else None
            out.append({"name": member.name if member else None, **row})
        return out


async def _every(period_s: float, tick: Callable[[], Awaitable[None] | None], name: str) -> None:
    """Run ``tick`` every ``period_s`` seconds until cancelled.

    A failing tick (a full disk under ``book.save()``, a bug) is logged and the loop goes
    on: one bad round must not end the mesh's task group, and with it the node.
    """
    while True:
        await asyncio.sleep(period_s)
        try:
            result = tick()
            if result is not None:
                await result
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("mesh loop %s: a round failed; the next runs as usual", name)


def advertised_url(host: str, port: int, local_url: str) -> str:
    """The URL peers should dial: for a node listening on every interface, the first
    non-loopback IPv4 address of this host (via ifaddr, which zeroconf uses too)."""
    if host not in ("0.0.0.0", "", "::"):  # noqa: S104 - comparing, not binding
        return local_url
    import ifaddr  # noqa: PLC0415 - only for a node listening on every interface

    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str) and not ip.ip.startswith("127."):
                return f"http://{ip.ip}:{port}"
    return local_url
