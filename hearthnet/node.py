"""The composition root: builds a node from its parts and owns its background tasks.

Nothing else in HearthNet constructs long-lived components or starts tasks without an
owner: every background task belongs to the node's :class:`asyncio.TaskGroup`, and
:meth:`Node.statistics` is the one snapshot behind ``/metrics``, ``/status`` and
``hearthnet node status``.

Use it as an async context manager (tests run nodes in-process this way) or through
:meth:`Node.serve_forever` (``hearthnet node start``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from capabilities import builtin_capabilities, node_capabilities
from hearthnet import __version__
from hearthnet.auth import Authenticator
from hearthnet.bus.calls import Bus, BusMetrics
from hearthnet.bus.capability import Capability
from hearthnet.bus.registry import CapabilityRegistry
from hearthnet.bus.routing import LocalProvider, Router
from hearthnet.bus.signatures import SignatureWorker
from hearthnet.clock import now_ms
from hearthnet.community import CommunityStore, Level, MembershipRecord
from hearthnet.config import Config
from hearthnet.datadir import DataDirLock, NameFile, RunFile
from hearthnet.errors import ConfigError
from hearthnet.identity import KeyPair, load_or_create_keys
from hearthnet.membership import Admission, Membership, MembershipCaps, Source, open_membership
from hearthnet.mesh.admission import redeem_invite
from hearthnet.mesh.http import MeshHttp
from hearthnet.mesh.service import Mesh, advertised_url
from hearthnet.mesh.tls import ensure_certificate, server_context
from hearthnet.metrics import MetricsRegistry
from hearthnet.node_federation import build_federation
from hearthnet.node_membership import MembershipIntake
from hearthnet.node_pubsub import build_pubsub, wire_commits
from hearthnet.node_routes import node_routes
from hearthnet.node_statistics import NodeStatistics
from hearthnet.node_tasks import NodeTasks
from hearthnet.process_metrics import register_process_metrics
from hearthnet.pubsub.batchsig import VERIFIER
from hearthnet.pubsub.http import PubSubHttp
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.service import PubSub
from hearthnet.pubsub.sweeper import SessionSweeper
from hearthnet.pubsub.ws import PubSubDeps
from hearthnet.replay import ReplayCache
from hearthnet.sessions import SessionRegistry
from hearthnet.transport.bus_http import BusEndpointDeps, BusHttpEndpoints
from hearthnet.transport.cors import OriginPolicy, own_host_names
from hearthnet.transport.frontdoor import head_limits
from hearthnet.transport.server import (
    ActiveStreams,
    ConnectionTracker,
    HttpServer,
    TransportMetrics,
)

if TYPE_CHECKING:
    from capabilities.llm_chat import LlmChat

# SIGHUP too: a node run in a terminal that closes (an ssh session that drops) got the
# default action, death without a shutdown (no final frames, a stale run file); there is
# no configuration to reload, a restart applies changes.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

log = logging.getLogger("hearthnet.node")

MANIFEST_TTL_MS = 60_000
MANIFEST_REISSUE_MS = 30_000


def client_url(host: str, port: int) -> str:
    """The URL a local client should use for a node bound to ``host:port``."""
    if host in ("0.0.0.0", ""):  # noqa: S104 - comparing, not binding
        host = "127.0.0.1"
    elif host in ("::", "[::]"):
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


class Node:
    """One HearthNet node."""

    def __init__(
        self,
        config: Config,
        *,
        extra_capabilities: list[Capability] | None = None,
        join: str | None = None,
    ) -> None:
        self.config = config
        self.join_token = join
        self.data_dir = config.data_path
        self.metrics = MetricsRegistry()
        register_process_metrics(self.metrics)
        self.started_ms = 0
        self._started_mono = 0.0
        self._lock = DataDirLock(self.data_dir)
        self.run_file = RunFile(self.data_dir)
        self._extra_capabilities = list(extra_capabilities or [])
        self.tasks = NodeTasks()  # every background task belongs to its task group
        self.spawn = self.tasks.spawn
        self._stop = asyncio.Event()
        self.url = ""
        self.name = config.node.name  # the default name needs the keys: set in _build()
        # Built in _build(), once the data dir is locked.
        self.keys: KeyPair
        self.membership: Membership
        self.registry: CapabilityRegistry
        self.router: Router
        self.bus: Bus
        self.authenticator: Authenticator
        self.server: HttpServer
        self.message_log: MessageLog
        self.pubsub: PubSub
        self.sweeper: SessionSweeper
        self.pubsub_deps: PubSubDeps
        self.mesh: Mesh
        self.streams: ActiveStreams
        self.connections: ConnectionTracker
        self._manifest: dict[str, Any] | None = None

    # --- construction ------------------------------------------------------------

    def _build(self) -> None:
        cfg = self.config
        # spec §5: llm.chat only when a model server or the demo model is configured;
        # built first, so a bad [llm] section stops the node before it takes the lock; its
        # modules (tool loop, backends, jsonschema) are loaded only then (spec §11)
        self.llm: LlmChat | None = None
        if cfg.llm.url or cfg.llm.demo:
            from capabilities.llm_chat import build_llm_chat  # noqa: PLC0415

            self.llm = build_llm_chat(cfg.llm)
        self._lock.acquire()  # makes the data directory (0700) when there is none
        self.keys = load_or_create_keys(self.data_dir)
        # --name (or [node] name) is remembered in the data dir for the starts without one
        self.name = NameFile(self.data_dir).name_of(cfg.node, self.keys.node_id, remember=True)
        self._community_store = CommunityStore(self.data_dir)
        self.membership = open_membership(
            self._community_store,
            self.keys,
            name=self.name,
            now_ms=now_ms(),
            caps=MembershipCaps(cfg.mesh.membership_per_request, cfg.mesh.membership_per_signer),
        )
        signature_failures = self.metrics.counter(
            "hearthnet_signature_failures_total",
            "Signatures, tokens and credentials refused, by reason.",
            ("reason",),
        )
        self.authenticator = Authenticator(
            node_id=self.keys.node_id,
            membership=self.membership,
            replay=ReplayCache(
                int(cfg.security.replay_window_s * 1000), cfg.security.replay_cache_max
            ),
            clock_window_ms=int(cfg.security.clock_window_s * 1000),
            on_failure=signature_failures.inc,
        )
        self.signatures = SignatureWorker()  # HTTP call signatures, beside the event loop
        self.registry = CapabilityRegistry()
        for cap in [*builtin_capabilities(), *self._extra_capabilities]:
            self.registry.register(cap)
        if self.llm is not None:
            self.registry.register(self.llm)
        self.router = Router(LocalProvider(self.keys.node_id, self.registry))
        self.bus = Bus(
            node_id=self.keys.node_id,
            router=self.router,
            limits=cfg.limits,
            bus=cfg.bus,
            metrics=BusMetrics.register(self.metrics),
        )
        transport_metrics = TransportMetrics.register(self.metrics)
        self.origins = OriginPolicy.from_config(
            cfg.security.allowed_origins,
            own_host_names(
                socket.gethostname(), cfg.mesh.advertise_url, cfg.security.allowed_hosts
            ),
        )
        self.streams = ActiveStreams()
        self.sessions = SessionRegistry()
        connections_refused = self.metrics.counter(
            "hearthnet_connections_refused_total",
            "Connections refused or closed, by the limit reached (identity, node; before "
            "authentication: head_timeout, body_rate, per_source, fd_reserve).",
            ("limit",),
        )
        self.connections = ConnectionTracker(
            cfg.limits.connections_per_identity, cfg.limits.connections_total, connections_refused
        )
        self.metrics.gauge(
            "hearthnet_connections",
            "Open streams and sockets.",
            lambda: float(self.connections.total),
        )
        deps = BusEndpointDeps(
            node_id=self.keys.node_id,
            transport=cfg.transport,
            authenticator=self.authenticator,
            bus=self.bus,
            metrics=transport_metrics,
            connections=self.connections,
            streams=self.streams,
            sessions=self.sessions,
            signatures=self.signatures,
        )
        ps = build_pubsub(
            cfg,
            data_dir=self.data_dir,
            keys=self.keys,
            membership=self.membership,
            metrics=self.metrics,
            authenticator=self.authenticator,
            connections=self.connections,
            streams=self.streams,
            transport_metrics=transport_metrics,
            sessions=self.sessions,
            origins=self.origins,
        )
        self.message_log, self.pubsub, self.sweeper = ps.message_log, ps.service, ps.sweeper
        self.pubsub_deps = ps.deps
        if self.llm is not None:
            self.llm.pubsub = self.pubsub  # llm.chat publish_to (docs/browser.md)
        self.mesh = Mesh(
            keys=self.keys,
            membership=self.membership,
            submit_records=self.submit_records,
            config=cfg.mesh,
            tls_mode=cfg.node.tls,
            name=self.name,
            data_dir=self.data_dir,
            message_log=self.message_log,
            pubsub=self.pubsub,
            authenticator=self.authenticator,
            bus=self.bus,
            router=self.router,
            metrics=self.metrics,
        )
        self.mesh.remote.signatures = self.signatures  # peers' calls, as HTTP calls
        self.intake = MembershipIntake(
            self.membership,
            self._community_store,
            mesh=self.mesh,
            sessions=self.sessions,
            pubsub=self.pubsub,
            configured_rules=ps.configured_rules,
            rotation_grace_s=cfg.security.rotation_grace_s,
            tasks=self.tasks,
        )
        fed = build_federation(
            keys=self.keys,
            membership=self.membership,
            data_dir=self.data_dir,
            peers=list(cfg.mesh.federation_peers),
            pubsub=self.pubsub,
            sessions=self.sessions,
            spawn=self.spawn,
            mesh=self.mesh,
            message_log=self.message_log,
            authenticator=self.authenticator,
            metrics=self.metrics,
        )
        self._federation_store, self.federation = fed.store, fed.service
        self.federation_carrier, self.federation_bridge = fed.carrier, fed.bridge
        for cap in node_capabilities(self._peers_view, self.pubsub):  # spec §2.1
            self.registry.register(cap)
        # the console's messages per second
        self.topic_rates = wire_commits(self.message_log, self.pubsub, self.mesh, self.federation)
        pubsub_http = PubSubHttp(self.pubsub_deps)
        mesh_http = MeshHttp(self.mesh, self.authenticator, self.keys, self.submit_records)
        self.mesh.relaying.join_handler = mesh_http.admit_join  # spec §8: joins via a relay
        routes = node_routes(self, deps, pubsub_http, mesh_http)
        tls = None
        if cfg.node.tls != "off":
            tls = server_context(*ensure_certificate(self.data_dir, self.keys))
        self.server = HttpServer(
            routes=routes,
            metrics=transport_metrics,
            max_body_bytes=cfg.transport.max_body_bytes,
            head=head_limits(cfg.transport),
            connections_refused=connections_refused,
            keepalive_idle_s=cfg.transport.keepalive_idle_s,
            tls=tls,
            upgrades=pubsub_http.upgrades(),
            calls=BusHttpEndpoints(deps),
            origins=self.origins,
        )

    # --- life cycle ----------------------------------------------------------------

    async def __aenter__(self) -> Node:
        if self.join_token:
            keys = load_or_create_keys(self.data_dir)
            name = NameFile(self.data_dir).name_of(self.config.node, keys.node_id, remember=False)
            await redeem_invite(self.data_dir, self.join_token, name=name)
        try:
            self._build()
            await self.message_log.open()
        except BaseException:
            self._lock.release()
            raise
        await self.tasks.open()
        try:
            await self._start_serving()
        except BaseException:
            # whatever failed (the port, a bad advertise URL, the peer book), nothing stays
            # open: a second try on the same data dir must not find it locked
            await self.server.close()
            await self.tasks.close()
            await self.message_log.close()
            self._lock.release()
            raise
        log.info("node started", extra={"node": self.keys.node_id})
        return self

    async def _start_serving(self) -> None:
        self.spawn(self.message_log.run(), "pubsub-log-flush")
        self.spawn(self.pubsub.retention_pass.loop(), "pubsub-retention")
        self.spawn(self.sweeper.run(), "pubsub-sweeper")
        try:
            host, port = await self.server.start(self.config.node.host, self.config.node.port)
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {self.config.node.host}:{self.config.node.port}: {exc.strerror}"
            ) from exc
        self.url = client_url(host, port)
        await self.mesh.start(
            advertised_url(self.config.node.host, port, self.url),
            host=self.config.node.host,
            port=port,
            serve_socket=self.server.serve_socket,
        )
        self.spawn(self.mesh.run(), "mesh")
        self.federation.url = self.mesh.url
        self.federation_carrier.local_url = self.url  # carried requests: our own server
        self.spawn(self.federation_bridge.run(), "federation")
        self.started_ms = now_ms()
        self._started_mono = time.monotonic()
        self.run_file.write(
            url=self.url,
            node=self.keys.node_id,
            community=self.membership.community_id,
            started_ms=self.started_ms,
        )

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            await self.shutdown()
        finally:
            await self.tasks.close()
            self._lock.release()

    def stop(self) -> None:
        """Ask :meth:`serve_forever` to shut down (signal handlers call this)."""
        self._stop.set()

    async def serve_forever(
        self, on_ready: Callable[[Node], Awaitable[None] | None] | None = None
    ) -> None:
        """Run until SIGINT/SIGTERM/SIGHUP or :meth:`stop`; then shut down within 5 s."""
        loop = asyncio.get_running_loop()
        async with self:
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, self.stop)
            if on_ready is not None:
                result = on_ready(self)
                if asyncio.iscoroutine(result):
                    await result
            await self._stop.wait()
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)

    async def shutdown(self) -> None:
        """Stop accepting, end streams with a final frame, close everything (spec §9)."""
        if not self.tasks.running:
            return
        self._stop.set()
        self.mesh.stop()
        await self.server.stop_accepting()
        await self.streams.shutdown(self.config.node.shutdown_grace_s)
        await self.server.close()
        self.signatures.close()
        # Everything in the background that reads or writes the log stops before it closes;
        # the flush loop is stopped by close() itself, after the last batch is committed.
        await self.tasks.cancel("pubsub-retention", "pubsub-sweeper", "mesh", "federation")
        await self.federation_carrier.close()
        await self.message_log.close()
        self._federation_store.close()
        if self.llm is not None:
            await self.llm.aclose()
        self.run_file.remove()
        log.info("node stopped", extra={"node": self.keys.node_id})

    # --- membership ------------------------------------------------------------------

    def apply_membership(self, record: MembershipRecord) -> bool:
        """Store, apply and gossip a record signed here (or submitted); False if it was
        already known or refused (:meth:`MembershipIntake.apply`)."""
        return self.intake.apply(record)

    async def submit_records(
        self, records: list[MembershipRecord], source: Source, via: str | None = None
    ) -> Admission:
        """Admit a batch of verified records from a request or from peer ``via``
        (:meth:`MembershipIntake.submit`, spec §1.5)."""
        return await self.intake.submit(records, source, via)

    def add_member(
        self,
        node_id: str,
        level: Level = Level.MEMBER,
        *,
        role: str = "node",
        name: str | None = None,
    ) -> MembershipRecord:
        """Add ``node_id`` to this node's community, signed by this node (which must be
        an anchor or trusted member)."""
        record = self.membership.sign(
            self.keys,
            "member.added",
            node_id,
            now_ms=now_ms(),
            level=level,
            role=role,
            name=name,
        )
        self.apply_membership(record)
        return record

    # --- views ---------------------------------------------------------------------

    def ready_line(self) -> str:
        """The one line ``hearthnet node start`` prints when ready (spec §9)."""
        return (
            f"hearthnet ready url={self.url} node={self.keys.node_id} "
            f"community={self.membership.community_id}"
        )

    def statistics(self) -> NodeStatistics:
        """A frozen snapshot of the node."""
        calls = self.metrics.counter("hearthnet_calls_total", "", ("capability", "result"))
        relaying = self.mesh.relaying.statistics()
        if "paths" in relaying:  # a member's: what the calls sent again (call_hold.py)
            relaying["paths"]["calls"] = self.mesh.remote.counts.status()
        return NodeStatistics(
            node=self.keys.node_id,
            short_id=self.keys.short_id,
            community=self.membership.community_id,
            name=self.name,
            version=__version__,
            url=self.url,
            pid=os.getpid(),
            started_ms=self.started_ms,
            uptime_s=time.monotonic() - self._started_mono,
            capabilities=tuple(d.key for d in self.registry.descriptors()),
            streams_active=self.bus.metrics.streams_active,
            connections=self.connections.total,
            calls_total=int(calls.total()),
            members=len(self.membership.members),
            log_epoch=self.message_log.epoch,
            log_head=self.message_log.head_seq,
            topics=len(self.message_log.topics),
            subscribers=len(self.pubsub.subscribers),
            published_total=int(self.pubsub.metrics.published.total()),
            delivered_total=int(self.pubsub.metrics.delivered.total()),
            mesh_url=self.mesh.url,
            peers_linked=len(self.mesh.links),
            relaying=relaying,
            signatures=VERIFIER.counts(),
        )

    def _peers_view(self) -> dict[str, Any]:
        """What ``mesh.peers@1.0`` answers: this node and its peers, one row each."""
        return {"node": self.keys.node_id, "url": self.mesh.url, "peers": self.mesh.peers_status()}

    def manifest(self) -> dict[str, Any]:
        """The signed node manifest (spec §7.1), re-issued every 30 s, valid for 60 s."""
        now = now_ms()
        if self._manifest is None or now - self._manifest["issued_ms"] >= MANIFEST_REISSUE_MS:
            body: dict[str, Any] = {
                "node": self.keys.node_id,
                "community": self.membership.community_id,
                "name": self.name,
                "endpoints": [self.url],
                "capabilities": [d.summary() for d in self.registry.descriptors()],
                "relay": self.config.mesh.relay,  # spec §7.1, §8
                "relays": list(self.mesh.relaying.relay_urls),  # spec §8: reachable through
                "started_ms": self.started_ms,
                "issued_ms": now,
                "expires_ms": now + MANIFEST_TTL_MS,
            }
            body["sig"] = self.keys.sign_object(body)
            self._manifest = body
        return self._manifest
