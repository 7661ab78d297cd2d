"""Pub/sub's part of the composition root (hearthnet/node.py): the log, the service, its
session sweeper and the endpoints' dependencies, and the commit pipeline that joins the
log to local fan-out, the mesh and federation.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

from hearthnet.auth import Authenticator
from hearthnet.config import Config
from hearthnet.console.rates import TopicRates
from hearthnet.federation.service import Federation
from hearthnet.identity import KeyPair
from hearthnet.membership import Membership
from hearthnet.mesh.service import Mesh
from hearthnet.metrics import MetricsRegistry
from hearthnet.pubsub.access import AccessPolicy, AccessRule, effective_rules
from hearthnet.pubsub.envelope import StoredMessage
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.retention import RetentionPolicy, RetentionRule
from hearthnet.pubsub.service import PubSub
from hearthnet.pubsub.sweeper import SessionSweeper
from hearthnet.pubsub.ws import PubSubDeps
from hearthnet.sessions import SessionRegistry
from hearthnet.transport.cors import OriginPolicy
from hearthnet.transport.server import ActiveStreams, ConnectionTracker, TransportMetrics

log = logging.getLogger("hearthnet.node")


@dataclass(frozen=True, slots=True)
class PubSubParts:
    """What :func:`build_pubsub` builds; the node keeps each part."""

    message_log: MessageLog
    service: PubSub
    sweeper: SessionSweeper
    deps: PubSubDeps
    configured_rules: tuple[AccessRule, ...]  # [[pubsub.rules]], until the community signs some


def build_pubsub(
    cfg: Config,
    *,
    data_dir: Path,
    keys: KeyPair,
    membership: Membership,
    metrics: MetricsRegistry,
    authenticator: Authenticator,
    connections: ConnectionTracker,
    streams: ActiveStreams,
    transport_metrics: TransportMetrics,
    sessions: SessionRegistry,
    origins: OriginPolicy,
) -> PubSubParts:
    """The message log (not yet open), the pub/sub service and what its endpoints need."""
    ps = cfg.pubsub
    # The node's own [[pubsub.rules]] apply until an anchor signs community rules.
    configured_rules = tuple(AccessRule.from_config(r) for r in ps.rules)
    rules = effective_rules(membership, configured_rules)
    if configured_rules and membership.pubsub_rules is not None:
        log.warning("[[pubsub.rules]] ignored: the community's signed rules apply")
    retention = RetentionPolicy(
        tuple(RetentionRule.from_config(r) for r in ps.retention),
        max_messages=ps.max_messages_per_topic,
        max_age_s=ps.max_age_s,
        max_bytes=ps.max_bytes,
        max_log_messages=ps.max_messages,
    )
    message_log = MessageLog(
        data_dir / "pubsub" / "log.sqlite3",
        keys,
        synchronous=ps.sync,
        max_batch=ps.max_batch,
        max_pending=ps.max_pending,
    )
    service = PubSub(
        node_id=keys.node_id,
        config=ps,
        log_store=message_log,
        policy=AccessPolicy(rules),
        retention=retention,
        metrics=metrics,
    )
    tick = (
        min(
            cfg.transport.ws_ping_s,
            ps.presence_silence_s / 2,
            cfg.transport.sse_keepalive_s,
            cfg.transport.ws_idle_s,
        )
        / 4
    )
    sweeper = SessionSweeper(service, tick_s=max(0.005, min(1.0, tick)))
    deps = PubSubDeps(
        node_id=keys.node_id,
        transport=cfg.transport,
        config=ps,
        authenticator=authenticator,
        service=service,
        connections=connections,
        streams=streams,
        metrics=transport_metrics,
        sweeper=sweeper,
        sessions=sessions,
        origins=origins,
    )
    return PubSubParts(message_log, service, sweeper, deps, configured_rules)


def wire_commits(
    message_log: MessageLog, pubsub: PubSub, mesh: Mesh, federation: Federation
) -> TopicRates:
    """The wiring between the log, pub/sub and the mesh, in one place; returns the
    console's messages-per-second counter that the pipeline feeds.

    Commit pipeline (spec §6.3, §7.3): the log commits a batch -> pub/sub delivers it
    to this node's subscribers -> the mesh gossips it to every link but the one it
    came from. Local fan-out goes first, so a local subscriber never waits on the
    links; each step runs even if the one before it failed (what is committed stays
    committed). Presence (spec §6.6): local members' presence changes are flooded by
    the mesh.
    """
    fan_out, gossip = pubsub.fanout.on_commit, mesh.on_commit
    rates = TopicRates()

    def committed(batch: list[StoredMessage]) -> None:
        try:
            fan_out(batch)
        except Exception:
            log.exception("local fan-out of a commit failed; gossiping it anyway")
        gossip(batch)
        federation.on_commit(batch)  # spec §8: agreements spread like records
        if len(batch) == 1:  # one publish in flight: no count of one made first
            rates.record_one(batch[0].topic, time.monotonic())
        else:
            rates.record((m.topic for m in batch), time.monotonic())

    message_log.listeners.append(committed)
    message_log.listeners.append(pubsub.retention_pass.on_commit)
    pubsub.presence_hub.on_local = mesh.on_local_presence
    return rates
