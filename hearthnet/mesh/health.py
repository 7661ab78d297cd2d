"""Link health on one node (spec §7.5): heartbeats on every link, the heartbeat log, the
beacon, and the periodic flush of what survives restarts.

Asyncio glue around :class:`~hearthnet.mesh.heartbeat.Heartbeats`: pings go out on the
paths :class:`~hearthnet.mesh.routing.Routes` gives, pongs come back from the mesh's frame
dispatch, and every observation becomes one heartbeat-log record.
"""

from __future__ import annotations

import contextlib
import resource
import time
from pathlib import Path
from typing import Any

from hearthnet import __version__
from hearthnet.caller import Caller
from hearthnet.clock import now_ms
from hearthnet.community import Level
from hearthnet.errors import WireError
from hearthnet.identity import KeyPair
from hearthnet.mesh.actions import CloseLink, Record
from hearthnet.mesh.addresses import PeerBook
from hearthnet.mesh.frames import Ping, Pong
from hearthnet.mesh.heartbeat import Heartbeats
from hearthnet.mesh.heartlog import HeartbeatLog
from hearthnet.mesh.links import PeerLink
from hearthnet.mesh.relayed_link import record_path
from hearthnet.mesh.routing import PeerPath, Routes
from hearthnet.metrics import MetricsRegistry
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.service import PubSub

PRUNE_EVERY_S = 3600.0  # heartbeat-log day files past retention are removed this often
RTT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class LinkHealth:
    """Heartbeats, heartbeat records and beacons of one node.

    Args:
        keys: this node's keys.
        name: this node's name (in the beacon).
        community: the community's id (in every heartbeat record).
        heartbeat_s: seconds between pings on a link.
        data_dir: where ``heartbeats/`` lives.
        routes: the paths pings go on.
        book: the peer book, saved with every housekeeping round.
        message_log, pubsub: this node's counts in records and beacons; pub/sub also
            publishes the beacon.
        metrics: where the RTT histogram is registered.
    """

    def __init__(
        self,
        *,
        keys: KeyPair,
        name: str,
        community: str,
        heartbeat_s: float,
        data_dir: Path,
        routes: Routes,
        book: PeerBook,
        message_log: MessageLog,
        pubsub: PubSub,
        metrics: MetricsRegistry,
    ) -> None:
        self.keys = keys
        self.name = name
        self.routes = routes
        self.book = book
        self.log = message_log
        self.pubsub = pubsub
        self.heartbeats = Heartbeats(heartbeat_s)
        self.hlog = HeartbeatLog(
            data_dir, node=keys.node_id, community=community, version=__version__
        )
        self.rtt = metrics.histogram(
            "hearthnet_link_rtt_seconds", "Round-trip time of link pings.", RTT_BUCKETS
        )
        self._started = time.monotonic()
        self._next_prune = self._started  # the first housekeeping tick prunes
        self._cpu = (self._started, time.process_time())

    def link_up(self, node: str) -> None:
        """A link came up: its heartbeats start, and it is recorded."""
        self.heartbeats.up(node)
        self.record(node, "link_up")

    def link_down(self, link: PeerLink) -> None:
        """A link went down: its heartbeats stop, and it is recorded with its path (it is
        no longer among the links, where :meth:`record` looks the path up)."""
        self.heartbeats.down(link.node)
        self.record(link.node, "link_down", path_of=link)

    def record(
        self,
        peer: str,
        kind: str,
        *,
        seq: int | None = None,
        rtt_ms: float | None = None,
        clock_offset_ms: float | None = None,
        ts: int | None = None,
        path_of: PeerLink | None = None,
    ) -> None:
        """One heartbeat-log record, with this node's current counts; ``path_of`` is the
        link whose path it records (default: the current link to ``peer``)."""
        link = path_of if path_of is not None else self.routes.links.get(peer)
        self.hlog.heartbeat(
            **record_path(link),  # relays: path and via (spec §8)
            ts=ts or now_ms(),
            peer=peer,
            kind=kind,
            seq=seq,
            rtt_ms=rtt_ms,
            clock_offset_ms=clock_offset_ms,
            peers_linked=len(self.routes),
            log_head=self.log.head_seq,
            subscribers=len(self.pubsub.subscribers),
        )

    def _observed(self, action: Record) -> None:
        observation = action.observation
        if observation.rtt_ms is not None:
            self.rtt.observe(observation.rtt_ms / 1000)
        self.record(
            action.node,
            observation.kind,
            seq=observation.seq,
            rtt_ms=observation.rtt_ms,
            clock_offset_ms=observation.clock_offset_ms,
            ts=action.ts,
        )

    def receive_ping(self, link: PeerPath, frame: Ping) -> None:
        """Answer a ping on the link it came on."""
        link.send_raw(self.heartbeats.receive_ping(frame, now_ms()).encode())

    def receive_pong(self, link: PeerPath, frame: Pong) -> None:
        """A pong: record its round trip and clock offset."""
        action = self.heartbeats.receive_pong(link.node, frame, time.monotonic(), now_ms())
        if action is not None:
            self._observed(action)

    def tick(self) -> None:
        """Ping the links that are due, record misses, close links three misses down."""
        for action in self.heartbeats.tick(time.monotonic(), now_ms()):
            if isinstance(action, Record):
                self._observed(action)
            elif isinstance(action, CloseLink):
                self.routes.close(action.node, action.reason)
            else:
                self.routes.send(action.node, action.frame)

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
                    "path": record_path(self.routes.links.get(node))["path"],  # relays
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

    async def beacon_tick(self) -> None:
        """Publish the beacon on ``mesh.beacon`` (gossiped like any message)."""
        me = Caller(self.keys.node_id, "node", Level.ANCHOR, None, True)
        with contextlib.suppress(WireError):
            await self.pubsub.publish(me, "mesh.beacon", "beacon", self.beacon(), 3600)

    def housekeeping_tick(self) -> None:
        """Prune old heartbeat-log days (hourly), flush the log, save the peer book."""
        # prune first: a failing flush or save must not also stop the pruning
        mono = time.monotonic()
        if mono >= self._next_prune:
            self._next_prune = mono + PRUNE_EVERY_S
            self.hlog.prune(now_ms())
        self.hlog.flush()
        self.book.save()


def _rss_mb() -> float:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
