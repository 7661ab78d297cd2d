"""Gossip and anti-entropy on the links (spec §6.2, §7.3): ``msg``, ``batch``, ``ihave``
and ``iwant`` frames fed to the :class:`~hearthnet.mesh.gossip.Gossip` core, its actions
carried out on the log and the links, and the log's commits forwarded.

What a peer on a link older than ``hearthnet-peer.v3`` is not sent (whole batches as
one frame, messages with ``data_enc``) and how its anti-entropy is kept from asking for
those again and again is :mod:`hearthnet.mesh.older_links`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from hearthnet.clock import now_ms
from hearthnet.errors import Unavailable
from hearthnet.mesh.actions import Deliver, Duplicate, Forward, Refused, Repair
from hearthnet.mesh.batches import repair_frames
from hearthnet.mesh.frames import BatchMsgs, IHave, IWant, Msg
from hearthnet.mesh.gossip import Gossip
from hearthnet.mesh.health import LinkHealth
from hearthnet.mesh.older_links import Withheld, older_repair
from hearthnet.mesh.routing import PeerPath, Routes
from hearthnet.metrics import Counter
from hearthnet.pubsub.envelope import StoredMessage
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.service import PubSub

log = logging.getLogger("hearthnet.mesh")


class GossipTraffic:
    """Messages between nodes: gossip in, commits out, holes repaired.

    Args:
        gossip: the pure core.
        message_log: where repairs are read.
        pubsub: where delivered messages are ingested (the facade's peer path), and its
            duplicate and deferred counters.
        routes: where frames go out.
        health: the trace of each delivered message (heartbeat log).
        spawn: starts a task in the mesh's task group.
        repaired / sig_failures: counters.
    """

    def __init__(
        self,
        *,
        gossip: Gossip,
        message_log: MessageLog,
        pubsub: PubSub,
        routes: Routes,
        health: LinkHealth,
        spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]],
        repaired: Counter,
        sig_failures: Counter,
    ) -> None:
        self.gossip = gossip
        self.log = message_log
        self.pubsub = pubsub
        self.routes = routes
        self.health = health
        self.spawn = spawn
        self.repaired = repaired
        self.sig_failures = sig_failures
        self.withheld = Withheld()

    def msg(self, link: PeerPath, frame: Msg) -> None:
        """A gossiped message."""
        outcome = self.gossip.receive_msg(frame, link.node)
        if isinstance(outcome, Duplicate):
            self.pubsub.metrics.duplicates.inc()
        elif isinstance(outcome, Deliver):
            self._deliver(outcome)
        else:
            self._refused(outcome)

    def batch(self, link: PeerPath, frame: BatchMsgs) -> None:
        """A whole signed batch (spec §6.2)."""
        outcome = self.gossip.receive_batch(frame, link.node)
        if isinstance(outcome, Duplicate):
            self.pubsub.metrics.duplicates.inc(amount=frame.n)
        elif isinstance(outcome, Refused):
            self._refused(outcome)
        else:
            if len(outcome) < frame.n:
                self.pubsub.metrics.duplicates.inc(amount=frame.n - len(outcome))
            for deliver in outcome:
                self._deliver(deliver)

    def _refused(self, outcome: Refused) -> None:
        self.sig_failures.inc(outcome.label)
        log.warning(
            "dropped a gossiped message from %s: %s",
            outcome.source,
            outcome.reason,
            extra={"peer": outcome.source},
        )

    def _deliver(self, action: Deliver) -> None:
        message = action.message
        try:
            fut = self.pubsub.ingest(message, action.source)
        except Unavailable:
            # The log's queue is full: nothing of it was kept, so anti-entropy (ihave /
            # iwant) asks for it again once the log has room.
            self.gossip.ingested(message.id)
            self.pubsub.metrics.deferred.inc()
            return
        self.health.hlog.trace(
            ts=now_ms(),
            msg_id=message.id,
            origin=message.origin,
            published_ms=message.ts,
            hops=action.hops,
            catch_up=action.catch_up,
        )

        def done(f: asyncio.Future[Any]) -> None:
            self.gossip.ingested(message.id)
            if not f.cancelled() and f.exception() is None and f.result() is None:
                self.pubsub.metrics.duplicates.inc()

        fut.add_done_callback(done)

    def committed(self, batch: list[StoredMessage]) -> None:
        """The log committed ``batch``: forward each message to every link but the one
        it came from (the last step of the commit pipeline, after local fan-out)."""
        if self.withheld.shown:
            self.withheld.committed(
                (s.message.origin, s.message.origin_seq, s.message.data_enc is not None)
                for s in batch
            )
        for forward in self.gossip.committed(batch, len(self.routes) > 0):
            if isinstance(forward, Forward):
                self.routes.forward(forward)
            else:
                self.routes.forward_batch(forward)

    def ihave(self, link: PeerPath, frame: IHave) -> None:
        """A peer's heads: ask for what we lack."""
        older = None if link.peer.takes_binary else link.node
        heads = self.gossip.tracker.heads
        # debug: a hole skipped on a peer's floor is never asked for again (gossip.py)
        before = dict(heads) if log.isEnabledFor(logging.DEBUG) else None
        tracker = self.gossip.tracker
        iwant = self.gossip.receive_ihave(frame, time.monotonic(), older)
        if iwant is not None:
            link.send_raw(iwant.encode())
        if tracker.skipped:  # what a restart must not ask for again (logfloors.py)
            skipped, tracker.skipped = tracker.skipped, {}
            self.spawn(self.log.delete(elsewhere=skipped), "gossip-floors")
        if before is not None:
            for origin, floor in frame.floors.items():
                was = before.get(origin, 0)
                if heads.get(origin, 0) > was and floor > was + 1:
                    log.debug(
                        "skipped %s's origin_seqs %d..%d on %s's floor %d",
                        origin,
                        was + 1,
                        floor - 1,
                        link.node,
                        floor,
                        extra={"peer": link.node},
                    )

    def iwant(self, link: PeerPath, frame: IWant) -> None:
        """A peer asks for ranges: answered from the log (one answer per peer at a time)."""
        repair = self.gossip.receive_iwant(frame, link.node)
        if repair is not None:
            self.spawn(self._repair(link, repair), f"repair-{link.node}")

    async def _repair(self, link: PeerPath, repair: Repair) -> None:
        try:
            budget = repair.budget
            for origin, first, last in repair.spans:
                if budget <= 0:
                    break
                rows = await self.log.reader.read_origin(
                    origin, first, last, min(budget, last - first + 1)
                )
                for data in self._answer(link, origin, first, rows):
                    link.send_raw(data)
                budget -= len(rows)
                self.repaired.inc(amount=len(rows))
        finally:
            self.gossip.repaired(repair.node)

    def _answer(self, link: PeerPath, origin: str, first: int, rows: list[bytes]) -> list[bytes]:
        """The frames answering an ``iwant`` of ``origin`` from ``first`` with ``rows``:
        whole batches as ``batch`` frames on a v3 link (spec §6.2); on an older one no
        message with ``data_enc``, and an ``ihave`` that moves the peer past them."""
        peer = link.peer
        if peer.takes_binary:
            return repair_frames(rows, peer.takes_batches)
        frames, leading = older_repair(rows, first)
        head = self.gossip.tracker.heads.get(origin, 0)
        skip = self.withheld.repaired(link.node, origin, first, leading, head)
        return [*frames, skip.encode()] if skip is not None else frames

    def send_ihave(self, link: PeerPath, shared: bytes | None = None) -> None:
        """Our heads to ``link`` (``shared``: the same ``ihave`` encoded once for all
        links, sent as it is unless this peer is shown lower heads)."""
        if link.node in self.withheld.shown or shared is None:
            link.send_raw(self.withheld.ihave(link.node, self.gossip.ihave()).encode())
        else:
            link.send_raw(shared)

    def repair_tick(self) -> None:
        """Anti-entropy round: our heads to every link."""
        links = list(self.routes.links.values())
        if not links:
            return  # nothing encoded for no one: a lone node never loads CBOR (spec §11)
        shared = self.gossip.ihave().encode()
        for link in links:
            self.send_ihave(link, shared)

    def forget(self, node: str) -> None:
        """The link to ``node`` went down."""
        self.gossip.forget(node)
        self.withheld.forget(node)
