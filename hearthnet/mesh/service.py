"""The mesh on one node (spec §7): links, dialling, gossip with anti-entropy, membership and
presence flooding, heartbeats, capability routes.

Asyncio glue around the pure cores of this package. Every background loop and every link
task belongs to the task group of :meth:`Mesh.run`, which the node runs in its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import resource
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import aiohttp
import ifaddr
from aiohttp import web

from hearthnet import __version__
from hearthnet.auth import Authenticator
from hearthnet.bus.calls import Bus
from hearthnet.bus.routing import Router
from hearthnet.caller import Caller
from hearthnet.clock import now_ms
from hearthnet.community import Level, MembershipRecord
from hearthnet.config import MeshSection
from hearthnet.errors import (
    ConfigError,
    HearthNetError,
    InvalidSignature,
    Revoked,
    Unauthorized,
    Unavailable,
    UpgradeRequired,
    WireError,
)
from hearthnet.identity import KeyPair
from hearthnet.membership import Admission, Membership, Source
from hearthnet.mesh.actions import CloseLink, Deliver, Duplicate, Forward, Record, Repair
from hearthnet.mesh.addresses import PeerBook, normalize_url
from hearthnet.mesh.announce import Announcement
from hearthnet.mesh.discovery import Discovery
from hearthnet.mesh.flood import MembershipFlood, PresenceFlood
from hearthnet.mesh.frames import (
    Ack,
    Bye,
    Call,
    Cancel,
    Caps,
    IHave,
    IWant,
    MembershipBatch,
    Msg,
    Peers,
    Ping,
    Pong,
    Presence,
    StreamFrame,
    ToolResult,
    parse_frame,
)
from hearthnet.mesh.gossip import Gossip, OriginTracker
from hearthnet.mesh.heartbeat import Heartbeats
from hearthnet.mesh.heartlog import HeartbeatLog
from hearthnet.mesh.links import (
    HANDSHAKE_TIMEOUT_S,
    LinkErrors,
    PeerLink,
    receive_referral,
    run_handshake,
    send_referral,
)
from hearthnet.mesh.protocol import (
    MAX_FRAME_BYTES,
    SUBPROTOCOL,
    Handshake,
    LinkToSelf,
    PeerInfo,
    winning_direction,
)
from hearthnet.mesh.remote import RemoteCalls
from hearthnet.mesh.tls import client_context, peer_node_id
from hearthnet.metrics import MetricsRegistry
from hearthnet.pubsub.envelope import StoredMessage
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.presence import PresenceEvent
from hearthnet.pubsub.service import PubSub
from hearthnet.sessions import SessionRegistry
from hearthnet.transport.server import error_response

log = logging.getLogger("hearthnet.mesh")

MAX_REFERRALS = 16  # handshakes at once with members a full node only sends elsewhere
FULL_HOLD_S = 60.0  # a node that was full is not dialled again for this long
HOUSEKEEPING_S = 1.0  # heartbeat-log flush and peer-book save
PRUNE_EVERY_S = 3600.0  # heartbeat-log day files past retention are removed this often


def _parse_records(raw: list[dict[str, Any]]) -> tuple[list[MembershipRecord], list[str]]:
    """Verify records (a thread's work: a signature check each); errors as messages."""
    parsed, errors = [], []
    for item in raw:
        try:
            parsed.append(MembershipRecord.parse(item))
        except HearthNetError as exc:
            errors.append(str(exc))
    return parsed, errors


class Mesh:
    """This node's part of the community mesh."""

    def __init__(
        self,
        *,
        keys: KeyPair,
        membership: Membership,
        submit_records: Callable[
            [list[MembershipRecord], Source, str | None], Awaitable[Admission]
        ],
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
        sessions: SessionRegistry,
    ) -> None:
        self.keys = keys
        self.membership = membership
        self.submit_records = submit_records
        self._membership_frames = asyncio.Lock()
        self.config = config
        if tls_mode not in ("auto", "on", "off"):
            raise ConfigError("node.tls is auto, on or off")
        self.tls_mode = tls_mode
        self._tls_client = client_context() if tls_mode != "off" else None
        self.name = name
        self.data_dir = data_dir
        self.log = message_log
        self.pubsub = pubsub
        self.authenticator = authenticator
        self.sessions = sessions
        self.links: dict[str, PeerLink] = {}
        self.book = PeerBook(data_dir / "mesh" / "peers.json")
        self.gossip = Gossip(message_log.knows, config.repair_per_round)
        self.heartbeats = Heartbeats(config.heartbeat_s)
        self.presence = PresenceFlood(keys.node_id)
        self.membership_flood = MembershipFlood(membership.caps.per_request)
        self.hlog = HeartbeatLog(
            data_dir, node=keys.node_id, community=membership.community_id, version=__version__
        )
        self.remote = RemoteCalls(
            node_id=keys.node_id,
            authenticator=authenticator,
            bus=bus,
            router=router,
            link_to=self._link_to,
            spawn=self.spawn,
        )
        self.url = ""
        self.dial_timeout_s = HANDSHAKE_TIMEOUT_S  # connect, upgrade and handshake, in all
        self._dialing: set[str] = set()
        self._referrals = 0  # handshakes in flight with members we are too full to link
        self._group: asyncio.TaskGroup | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._http: aiohttp.ClientSession | None = None
        self.discovery: Discovery | None = None
        self._started = time.monotonic()
        self._next_prune = self._started  # the first housekeeping tick prunes
        self._cpu = (time.monotonic(), time.process_time())
        m = metrics
        self.link_errors = LinkErrors.register(m)
        m.gauge("hearthnet_peers_linked", "Peer links up.", lambda: float(len(self.links)))
        self.rtt = m.histogram(
            "hearthnet_link_rtt_seconds",
            "Round-trip time of link pings.",
            (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
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
        self.sig_failures = m.counter(
            "hearthnet_signature_failures_total",
            "Signatures, tokens and credentials refused, by reason.",
            ("reason",),
        )
        message_log.listeners.append(self.on_commit)
        pubsub.on_local_presence = self.on_local_presence

    @property
    def tracker(self) -> OriginTracker:
        """Which messages of each origin this node holds."""
        return self.gossip.tracker

    # --- life -------------------------------------------------------------------------

    async def start(self, url: str, *, host: str, port: int) -> None:
        """Load what survives restarts (peer addresses, which messages we hold) and start
        announcing on the LAN."""
        self.url = self.config.advertise_url or url
        self.book.own_urls.add(normalize_url(self.url))
        self.book.load()
        for peer in self.config.peers:
            self.book.add(peer, source="bootstrap")
        for origin, floor, head, above in await self.log.origin_heads():
            self.gossip.tracker.load(origin, head, floor, above)
        if self.config.zeroconf:
            await self._start_discovery(host, port)

    async def _start_discovery(self, host: str, port: int) -> None:
        everywhere = host in ("0.0.0.0", "", "::")  # noqa: S104 - comparing, not binding
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
                on_found=self._found_by_zeroconf,
                on_lost=lambda node: None,
                interfaces=None if everywhere else [host],
            )
            await self.discovery.start()
        except (HearthNetError, OSError) as exc:
            # No multicast here (a container, a host with no LAN): links still come from
            # --peer, invites and peer exchange.
            log.warning("zeroconf discovery is off: %s", exc)
            self.discovery = None

    def _found_by_zeroconf(self, announcement: Announcement) -> None:
        for url in announcement.urls:
            self.book.add(url, node=announcement.node, source="zeroconf")

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
        return task

    async def run(self) -> None:
        """All mesh loops; returns only when cancelled (the node stops it)."""
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5)
        )
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                cfg = self.config
                for period_s, tick, name in (
                    (cfg.dial_interval_s, self._dial_tick, "mesh-dial"),
                    (cfg.anti_entropy_s, self._repair_tick, "mesh-repair"),
                    (max(0.01, cfg.heartbeat_s / 5), self._heartbeat_tick, "mesh-heartbeat"),
                    (cfg.caps_s, self._announce_caps, "mesh-caps"),
                    (cfg.presence_refresh_s, self._presence_tick, "mesh-presence"),
                    (cfg.beacon_s, self._beacon_tick, "mesh-beacon"),
                    (HOUSEKEEPING_S, self._housekeeping_tick, "mesh-housekeeping"),
                ):
                    group.create_task(_every(period_s, tick, name), name=name)
                if self.discovery is not None:
                    # a zeroconf failure ends LAN discovery, not the node
                    self.spawn(self.discovery.run(), "mesh-zeroconf")
        finally:
            self._group = None
            if self.discovery is not None:
                with contextlib.suppress(Exception):
                    await self.discovery.stop()
            await self._http.close()
            self.hlog.flush()
            self.book.save()

    def stop(self) -> None:
        """Say bye on every link (the task group is cancelled by the node right after)."""
        for link in list(self.links.values()):
            link.close("node shutting down")

    # --- links: accepting and dialling ----------------------------------------------------

    def _handshake(self, *, outbound: bool, expect: str | None = None) -> Handshake:
        return Handshake(
            self.keys,
            self.membership,
            outbound,
            now_ms(),
            name=self.name,
            url=self.url,
            version=__version__,
            expect=expect,
        )

    async def accept(self, request: web.Request) -> web.StreamResponse:
        """``GET /mesh/v1/peer``: a peer dials us."""
        offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        if SUBPROTOCOL not in offered:
            self.refused.inc("subprotocol")
            return error_response(
                UpgradeRequired(f"peer links speak {SUBPROTOCOL}"),
                headers={"Sec-WebSocket-Protocol": SUBPROTOCOL},
            )
        transport = request.transport
        over_tls = transport is not None and transport.get_extra_info("ssl_object") is not None
        if not over_tls and self._needs_tls(request.remote or ""):
            self.refused.inc("plain_between_hosts")
            return error_response(
                UpgradeRequired("peer links between hosts use TLS: dial https://")
            )
        full = len(self.links) >= 2 * self.config.max_links
        if full and self._referrals >= MAX_REFERRALS:
            self.refused.inc("full")
            return error_response(
                Unavailable("this node has all the peer links it takes", retry_after_ms=5000)
            )
        ws = web.WebSocketResponse(
            protocols=(SUBPROTOCOL,),
            max_msg_size=MAX_FRAME_BYTES,
            compress=False,
            heartbeat=None,
            autoping=True,
        )
        await ws.prepare(request)
        handshake = self._handshake(outbound=False)
        handshake.full = full
        self._referrals += full
        try:
            peer = await run_handshake(ws, handshake, now_ms, self.link_errors)
            if full:
                # A verified member that found us full learns where else to link, so a
                # node whose only bootstrap address is a busy node still joins the mesh.
                self.refused.inc("full")
                await send_referral(ws, self.book.urls_for_exchange(), self.link_errors)
                return ws
        except WireError as exc:
            self.refused.inc(exc.code)
            log.info("refused a peer link from %s: %s", request.remote, exc)
            await ws.close(code=1008, message=exc.code.encode())
            return ws
        finally:
            self._referrals -= full
        entry = self.book.add(peer.url, node=peer.node, source="inbound") if peer.url else None
        link = PeerLink(
            peer,
            ws,
            outbound=False,
            on_frame=self._on_frame,
            on_down=self._link_down,
            address=entry.url if entry is not None else None,
            errors=self.link_errors,
        )
        if self._link_up(link):
            if entry is not None:
                # linked, so worth sharing with other peers; not dialled while the link is up
                self.book.succeeded(entry.url, peer.node, now_ms())
                self.book.hold(entry.url, time.monotonic(), 3600)
            await link.run()
        else:
            await ws.close(code=1000, message=b"duplicate")
        return ws

    async def dial(self, url: str) -> None:
        """Dial one address and run the link while it is up (the dial loop calls this;
        tests and --peer too). A second dial of an address already being dialled returns."""
        if url in self._dialing:
            return
        self._dialing.add(url)
        try:
            opened = await self._open_link(url)
        finally:
            self._dialing.discard(url)
        if opened is None:
            return
        ws, peer = opened
        self.book.succeeded(url, peer.node, now_ms())
        if peer.full:
            self._learn_peers(await receive_referral(ws))
            self.book.hold(url, time.monotonic(), FULL_HOLD_S)
            log.info("%s is full; learnt addresses from it", url)
            return
        link = PeerLink(
            peer,
            ws,
            outbound=True,
            on_frame=self._on_frame,
            on_down=self._link_down,
            address=url,
            errors=self.link_errors,
        )
        if self._link_up(link):
            self.book.hold(url, time.monotonic(), 3600)
            await link.run()
        else:
            self.book.hold(url, time.monotonic(), 30)
            await ws.close()

    async def _open_link(self, url: str) -> tuple[aiohttp.ClientWebSocketResponse, PeerInfo] | None:
        """Connect, upgrade and shake hands with ``url``, all within ``dial_timeout_s``
        (a peer that takes the TCP connection and never answers must not hold a dial
        slot forever); None when that failed (and the address book knows)."""
        assert self._http is not None
        address = self.book.addresses.get(url)
        expect = address.node if address is not None else None
        target = self._dial_url(url)
        tls = target.startswith("https:")
        ws: aiohttp.ClientWebSocketResponse | None = None
        try:
            async with asyncio.timeout(self.dial_timeout_s):
                ws = await self._http.ws_connect(
                    target + "/mesh/v1/peer",
                    protocols=(SUBPROTOCOL,),
                    max_msg_size=MAX_FRAME_BYTES,
                    autoping=True,
                    heartbeat=None,
                    compress=0,
                    ssl=self._tls_client if tls and self._tls_client is not None else False,
                )
                # spec §3.1: the certificate must carry the key of the node we meant to reach
                cert_node = peer_node_id(ws.get_extra_info("ssl_object")) if tls else None
                if cert_node is not None and expect is not None and cert_node != expect:
                    raise InvalidSignature(f"{target} presented the certificate of {cert_node}")
                handshake = self._handshake(outbound=True, expect=expect)
                peer = await run_handshake(ws, handshake, now_ms, self.link_errors)
                if cert_node is not None and cert_node != peer.node:
                    raise InvalidSignature("the TLS certificate and the signed hello disagree")
            return ws, peer
        except WireError as exc:
            self._dial_failed(url, exc)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            self._dial_failed(url, None)
            log.debug("dial %s failed: %s", target, exc)
        if ws is not None:
            await ws.close()
        return None

    def _dial_tick(self) -> None:
        room = self.config.max_links - len(self.links) - len(self._dialing)
        if room <= 0:
            return
        for address in self.book.due(time.monotonic(), set(self.links))[:room]:
            if address.url not in self._dialing:
                self.spawn(self.dial(address.url), f"dial-{address.url}")

    def _link_up(self, link: PeerLink) -> bool:
        """Admit an established link; simultaneous dials keep one (spec §7.2)."""
        existing = self.links.get(link.node)
        if existing is not None:
            # the lower NodeID's outbound link wins: ours when we are the lower one
            outbound_wins = winning_direction(self.keys.node_id, link.node)
            if existing.outbound == outbound_wins or link.outbound != outbound_wins:
                return False
            existing.close("duplicate link")
        self.links[link.node] = link
        self.heartbeats.up(link.node)
        self.link_events.inc("up")
        self._record(link.node, "link_up")
        log.info(
            "link up with %s (%s)",
            link.node,
            "outbound" if link.outbound else "inbound",
            extra={"peer": link.node},
        )
        self._send_membership(link)
        link.send("peers", peers=self.book.urls_for_exchange())
        link.send("caps", providers=self.remote.announcement(exclude_via=link.node))
        self._send_presence_snapshot(link)
        self._send_ihave(link)
        return True

    def _link_down(self, link: PeerLink, reason: str) -> None:
        if self.links.get(link.node) is not link:
            return  # a duplicate that lost
        del self.links[link.node]
        self.heartbeats.down(link.node)
        self.link_events.inc("down")
        self._record(link.node, "link_down")
        log.info("link down with %s: %s", link.node, reason, extra={"peer": link.node})
        if link.address is not None:
            self.book.hold(link.address, time.monotonic(), 0)
        if self.remote.forget(link.node):
            self._announce_caps()

    def _dial_failed(self, url: str, error: WireError | None) -> None:
        self.book.failed(url, time.monotonic())
        if error is None:
            return
        self.refused.inc(error.code)
        log.info("dialling %s refused: %s", url, error)
        if isinstance(error, LinkToSelf):
            self.book.own_urls.add(url)
            self.book.addresses.pop(url, None)
        elif isinstance(error, Revoked | Unauthorized):
            self.book.hold(url, time.monotonic(), 300)  # no point asking again soon

    def _needs_tls(self, host: str) -> bool:
        """Whether a peer link with ``host`` must use TLS (spec §3.1: between hosts)."""
        if self.tls_mode == "off":
            return False
        if self.tls_mode == "on":
            return True
        try:
            return not ipaddress.ip_address(host.strip("[]")).is_loopback
        except ValueError:
            return host != "localhost"

    def _dial_url(self, url: str) -> str:
        """The URL to dial: https between hosts (on the same port), plain where allowed."""
        parts = urlsplit(url)
        scheme = "https" if self._needs_tls(parts.hostname or "") else "http"
        return f"{scheme}://{parts.netloc}"

    def _link_to(self, node: str) -> PeerLink | None:
        return self.links.get(node)

    def close_links_of(self, node: str, reason: str) -> None:
        """End the link to ``node`` (revocation)."""
        link = self.links.get(node)
        if link is not None:
            link.close(reason)

    def _record(
        self,
        peer: str,
        kind: str,
        *,
        seq: int | None = None,
        rtt_ms: float | None = None,
        clock_offset_ms: float | None = None,
        ts: int | None = None,
    ) -> None:
        """One heartbeat-log record, with this node's current counts."""
        self.hlog.heartbeat(
            ts=ts or now_ms(),
            peer=peer,
            kind=kind,
            seq=seq,
            rtt_ms=rtt_ms,
            clock_offset_ms=clock_offset_ms,
            peers_linked=len(self.links),
            log_head=self.log.head_seq,
            subscribers=len(self.pubsub.subscribers),
        )

    # --- frames -----------------------------------------------------------------------

    def _on_frame(self, link: PeerLink, frame: dict[str, Any]) -> None:
        """A decoded frame from ``link``: parsed into its typed form, then handled.

        Raises:
            BadRequest: the frame is malformed (the link logs it and goes on).
        """
        typed = parse_frame(frame)
        if typed is not None:
            self._handlers[type(typed)](self, link, typed)

    def _h_msg(self, link: PeerLink, frame: Msg) -> None:
        outcome = self.gossip.receive_msg(frame, link.node)
        if isinstance(outcome, Deliver):
            self._deliver(outcome)
        elif isinstance(outcome, Duplicate):
            self.pubsub.metrics.duplicates.inc()
        else:
            self.sig_failures.inc("gossip")
            log.warning(
                "dropped a gossiped message from %s: %s",
                outcome.source,
                outcome.reason,
                extra={"peer": outcome.source},
            )

    def _deliver(self, action: Deliver) -> None:
        message = action.message
        self.hlog.trace(
            ts=now_ms(),
            msg_id=message.id,
            origin=message.origin,
            published_ms=message.ts,
            hops=action.hops,
        )
        fut = self.log.ingest(message, source=action.source)

        def done(f: asyncio.Future[Any]) -> None:
            self.gossip.ingested(message.id)
            if not f.cancelled() and f.exception() is None and f.result() is None:
                self.pubsub.metrics.duplicates.inc()

        fut.add_done_callback(done)

    def on_commit(self, batch: list[StoredMessage]) -> None:
        """Forward what this node newly holds to every link but the one it came from."""
        for forward in self.gossip.committed(batch, bool(self.links)):
            self._forward(forward)

    def _forward(self, forward: Forward) -> None:
        for link in list(self.links.values()):
            if link.node != forward.skip:
                link.send_raw(forward.data)

    def _send_ihave(self, link: PeerLink) -> None:
        link.send_raw(self.gossip.ihave().encode())

    def _h_ihave(self, link: PeerLink, frame: IHave) -> None:
        iwant = self.gossip.receive_ihave(frame, time.monotonic())
        if iwant is not None:
            link.send_raw(iwant.encode())

    def _h_iwant(self, link: PeerLink, frame: IWant) -> None:
        repair = self.gossip.receive_iwant(frame, link.node)
        if repair is not None:
            self.spawn(self._repair(link, repair), f"repair-{link.node}")

    async def _repair(self, link: PeerLink, repair: Repair) -> None:
        try:
            budget = repair.budget
            for origin, first, last in repair.spans:
                if budget <= 0:
                    break
                rows = await self.log.read_origin(
                    origin, first, last, min(budget, last - first + 1)
                )
                for raw in rows:
                    link.send_raw(Msg(raw, 1).encode())
                budget -= len(rows)
                self.repaired.inc(amount=len(rows))
        finally:
            self.gossip.repaired(repair.node)

    def _repair_tick(self) -> None:
        for link in list(self.links.values()):
            self._send_ihave(link)

    # --- membership -------------------------------------------------------------------

    def _h_membership(self, link: PeerLink, frame: MembershipBatch) -> None:
        admit = self.membership_flood.receive(frame, link.node, self.membership.records)
        if admit is not None:
            self.spawn(self._admit_from(admit.node, list(admit.records)), "membership")

    async def _admit_from(self, node: str, raw: list[dict[str, Any]]) -> None:
        """Verify and admit a peer's records off the event loop (spec §1.5: folding never
        stalls other clients); what they add is flooded on by the node."""
        # frames are admitted in arrival order: a later frame may name signers an
        # earlier one added
        async with self._membership_frames:
            parsed, errors = await asyncio.to_thread(_parse_records, raw)
            for error in errors:
                self.sig_failures.inc("membership")
                log.warning("bad membership record from %s: %s", node, error, extra={"peer": node})
            if parsed:
                await self.submit_records(parsed, Source.GOSSIP, node)

    def _send_membership(self, link: PeerLink) -> None:
        """All records, in frames of at most the per-request cap."""
        records = (r.to_json() for r in self.membership.records.values())
        for frame in self.membership_flood.snapshot(records):
            link.send_raw(frame.encode())

    def broadcast_records(self, records: list[MembershipRecord], skip: str | None = None) -> None:
        """Flood new membership records to every other link."""
        self._forward(self.membership_flood.broadcast((r.to_json() for r in records), skip))

    # --- presence ---------------------------------------------------------------------

    def on_local_presence(self, events: list[PresenceEvent]) -> None:
        """Local members joined, changed or left: tell the mesh."""
        if events and self.links:
            self._forward(
                Forward(self.presence.start([e.to_json() for e in events]).encode(), None)
            )

    def _h_presence(self, link: PeerLink, frame: Presence) -> None:
        received = self.presence.receive(frame, link.node)
        if received is None:
            return
        apply, forward = received
        for event in apply.events:
            self.pubsub.apply_remote_presence(event)
        self._forward(forward)

    def _send_presence_snapshot(self, link: PeerLink) -> None:
        events = self.pubsub.local_presence("refresh")
        if events:
            link.send_raw(self.presence.start(events).encode())

    def _presence_tick(self) -> None:
        events = self.pubsub.local_presence("refresh")
        if events:
            self._forward(self.presence.announce(events))

    # --- heartbeats -------------------------------------------------------------------

    def _h_ping(self, link: PeerLink, frame: Ping) -> None:
        link.send_raw(self.heartbeats.receive_ping(frame, now_ms()).encode())

    def _h_pong(self, link: PeerLink, frame: Pong) -> None:
        record = self.heartbeats.receive_pong(link.node, frame, time.monotonic(), now_ms())
        if record is not None:
            if record.observation.rtt_ms is not None:
                self.rtt.observe(record.observation.rtt_ms / 1000)
            self._observe(record)

    def _observe(self, record: Record) -> None:
        observation = record.observation
        self._record(
            record.node,
            observation.kind,
            seq=observation.seq,
            rtt_ms=observation.rtt_ms,
            clock_offset_ms=observation.clock_offset_ms,
            ts=record.ts,
        )

    def _heartbeat_tick(self) -> None:
        for action in self.heartbeats.tick(time.monotonic(), now_ms()):
            link = self.links.get(action.node)
            if isinstance(action, Record):
                self._observe(action)
            elif link is None:
                continue
            elif isinstance(action, CloseLink):
                link.close(action.reason)
            else:
                link.send_raw(action.frame.encode())

    # --- capabilities -----------------------------------------------------------------

    def _h_caps(self, link: PeerLink, frame: Caps) -> None:
        if self.remote.learn(link.node, list(frame.providers)):
            self._announce_caps(skip=link.node)

    def _announce_caps(self, skip: str | None = None) -> None:
        for link in list(self.links.values()):
            if link.node != skip:
                link.send("caps", providers=self.remote.announcement(exclude_via=link.node))

    def _h_peers(self, link: PeerLink, frame: Peers) -> None:
        self._learn_peers(list(frame.peers))

    def _learn_peers(self, peers: list[Any]) -> None:
        """Peer exchange: remember the addresses a member shared (spec §7.1)."""
        for entry in peers[:64]:
            if isinstance(entry, dict) and entry.get("node") != self.keys.node_id:
                self.book.add(str(entry.get("url", "")), node=entry.get("node"), source="exchange")

    # --- beacons and housekeeping -----------------------------------------------------------

    def beacon(self) -> dict[str, Any]:
        """This node's beacon (spec §7.5)."""
        mono, cpu = time.monotonic(), time.process_time()
        last_mono, last_cpu = self._cpu
        self._cpu = (mono, cpu)
        cpu_pct = 100.0 * (cpu - last_cpu) / (mono - last_mono) if mono > last_mono else 0.0
        peers = []
        for node, tracker in self.heartbeats.items():
            p50 = tracker.rtt_p50_ms
            peers.append(
                {
                    "peer": node,
                    "rtt_ms_p50": round(p50, 3) if p50 is not None else None,
                    "loss_pct": round(tracker.loss_pct, 2),
                    "path": "direct",
                }
            )
        return {
            "node": self.keys.node_id,
            "name": self.name,
            "uptime_s": int(mono - self._started),
            "peers": peers,
            "log_head": self.log.head_seq,
            "subscribers": len(self.pubsub.subscribers),
            "cpu_pct": round(cpu_pct, 1),
            "rss_mb": round(_rss_mb(), 1),
            "version": __version__,
        }

    async def _beacon_tick(self) -> None:
        me = Caller(self.keys.node_id, "node", Level.ANCHOR, None, True)
        with contextlib.suppress(WireError):
            await self.pubsub.publish(me, "mesh.beacon", "beacon", self.beacon(), 3600)

    def _housekeeping_tick(self) -> None:
        # prune first: a failing flush or save must not also stop the pruning
        mono = time.monotonic()
        if mono >= self._next_prune:
            self._next_prune = mono + PRUNE_EVERY_S
            self.hlog.prune(now_ms())
        self.hlog.flush()
        self.book.save()

    # --- status -----------------------------------------------------------------------

    def peers_status(self) -> list[dict[str, Any]]:
        """Linked peers and known addresses, for ``hearthnet peers``."""
        out = []
        for node, link in self.links.items():
            tracker = self.heartbeats.get(node)
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
                    "path": "direct",
                }
            )
        linked = set(self.links)
        for address in self.book.addresses.values():
            if address.node not in linked:
                out.append(
                    {
                        "node": address.node,
                        "linked": False,
                        "url": address.url,
                        "source": address.source,
                        "failures": address.failures,
                    }
                )
        return out

    _handlers: ClassVar[dict[type, Callable[[Mesh, PeerLink, Any], None]]] = {}


def _calls(
    method: Callable[[RemoteCalls, Any, Any], None],
) -> Callable[[Mesh, PeerLink, Any], None]:
    return lambda mesh, link, frame: method(mesh.remote, link, frame)


def _ignore(mesh: Mesh, link: PeerLink, frame: Bye) -> None:
    """A bye ends the link in its read loop before it reaches the handlers."""


Mesh._handlers = {
    Msg: Mesh._h_msg,
    IHave: Mesh._h_ihave,
    IWant: Mesh._h_iwant,
    MembershipBatch: Mesh._h_membership,
    Presence: Mesh._h_presence,
    Ping: Mesh._h_ping,
    Pong: Mesh._h_pong,
    Caps: Mesh._h_caps,
    Peers: Mesh._h_peers,
    Bye: _ignore,
    Call: _calls(RemoteCalls.on_call),
    StreamFrame: _calls(RemoteCalls.on_frame),
    Ack: _calls(RemoteCalls.on_ack),
    ToolResult: _calls(RemoteCalls.on_tool_result),
    Cancel: _calls(RemoteCalls.on_cancel),
}


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


def _rss_mb() -> float:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def advertised_url(host: str, port: int, local_url: str) -> str:
    """The URL peers should dial: for a node listening on every interface, the first
    non-loopback IPv4 address of this host (via ifaddr, which zeroconf uses too)."""
    if host not in ("0.0.0.0", "", "::"):  # noqa: S104 - comparing, not binding
        return local_url
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str) and not ip.ip.startswith("127."):
                return f"http://{ip.ip}:{port}"
    return local_url
