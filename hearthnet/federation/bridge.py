"""The federation bridge (spec §8). A node with ``mesh.federation_peers`` (URLs of nodes
of other communities) opens every connection itself, so it may sit behind NAT:

- every :data:`SYNC_S` it exchanges agreements, revocations and membership records with
  each peer (``POST /mesh/v1/federation/sync``);
- it **pulls** the topics the other community grants us with a signed long-poll
  (``GET /pubsub/v1/subscribe``) that the other node answers under the grant;
- it **pushes** the messages of our members on the topics we grant the other community
  (``POST /mesh/v1/federation/push``), from a cursor on our log, woken by each commit.

A peer named ``mesh:<NodeID>`` is reached through relays, not HTTP: every request above
is carried on the federated link (:mod:`hearthnet.federation.carrier`).

Messages keep their origin's signature. The receiving side checks each (it verifies, its
origin is a member of the sending community, its topic is granted) and ingests it into
its log, from where gossip carries it to its members (:meth:`Bridge.take_messages`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from hearthnet.clock import now_ms
from hearthnet.errors import BadRequest, HearthNetError, WireError
from hearthnet.federation.carrier import Carrier, mesh_peer
from hearthnet.federation.service import Federation, guarded
from hearthnet.pubsub.envelope import Message
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.topics import TopicPattern

if TYPE_CHECKING:
    from hearthnet.client import Client

log = logging.getLogger("hearthnet.federation")

SYNC_S = 2.0  # a bridge's sync round (revocations reach the other side within it)
PULL_WAIT_S = 2  # a bridge's long-poll parks at most this long
MAX_PEERS = 16  # bridge peers (mesh.federation_peers)
PUSH_LIMIT = 500  # messages per push request
MAX_PUSHED = 500  # messages taken from one push request
STOP_S = 1.0  # how long stopping waits for the pulls and pushes to end
REQUEST_S = 10.0  # a sync (or a pull beyond its park) that takes longer is given up


class Bridge:
    """Sync and pull with the nodes of other communities."""

    def __init__(
        self,
        federation: Federation,
        *,
        peers: list[str],
        message_log: MessageLog,
        spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]],
        carrier: Carrier | None = None,
    ) -> None:
        self.federation = federation
        self.view = federation.view
        self.store = federation.store
        self.keys = federation.keys
        self.log = message_log
        self.spawn = spawn
        self.carrier = carrier  # mesh:<NodeID> peers: requests through relays
        self.peers: dict[str, str | None] = dict.fromkeys(peers[:MAX_PEERS])  # url -> community
        self.pulls: dict[str, asyncio.Task[Any]] = {}  # pull and push tasks, by name
        self._committed = asyncio.Event()  # our log committed something: pushes look
        federation.on_committed.append(self._committed.set)
        self._cursors = self.store.cursors()
        self._sent: dict[str, int] = {}  # peer url -> our membership version it took
        self._failing: dict[str, str] = {}  # peer url -> why its last sync failed (logged)
        self.pulled = 0  # messages ingested from other communities
        self.refused = 0  # pulled messages refused (bad, origin or topic not granted)

    @property
    def community_id(self) -> str:
        """Our community."""
        return self.view.community_id

    # --- rounds ---------------------------------------------------------------------------

    async def tick(self) -> None:
        """One bridge round: sync with every peer, keep a pull and a push running per
        peer while an agreement with its community is in force."""
        for url in list(self.peers):
            try:
                async with asyncio.timeout(REQUEST_S):
                    await self._sync_with(url)
            except (HearthNetError, OSError, TimeoutError) as exc:
                self._sync_failed(url, exc)
                continue
            if self._failing.pop(url, None) is not None:
                log.info("federation sync with %s works again", url)
            for kind, loop in (("pull", self._pull_loop), ("push", self._push_loop)):
                name = f"federation-{kind}-{url}"
                task = self.pulls.get(name)
                if task is None or task.done():
                    self.pulls[name] = self.spawn(guarded(loop(url), name), name)

    def _sync_failed(self, url: str, exc: Exception) -> None:
        """Log a failed sync once per reason: a peer out of reach for hours (a revoked
        agreement, a relay down) is one line, not one every round."""
        reason = f"{type(exc).__name__}: {exc}"
        if self._failing.get(url) != reason:
            self._failing[url] = reason
            log.info(
                "federation sync with %s failed: %s (tried every %g s; logged again when "
                "the reason changes or once it works)",
                url,
                exc or type(exc).__name__,
                SYNC_S,
            )

    async def _sync_with(self, url: str) -> None:
        community = self.peers.get(url)
        # our records only when they changed since the last sync that took them
        version = self.view.membership.version
        body = self.federation.offer(community or "", members=self._sent.get(url) != version)
        if not community:  # first contact: every agreement we hold may concern it
            body["agreements"] = [a.to_json() for a in self.view.agreements.values()]
        theirs = self.view.foreign.get(community or "")
        body["known"] = len(theirs.records) if theirs is not None else 0
        async with self._client(url) as client:
            answer = await client.request_json("POST", "/mesh/v1/federation/sync", body)
        if not isinstance(answer, dict) or not isinstance(answer.get("community"), str):
            raise BadRequest(f"{url} answered the sync with something else")
        remote = answer["community"]
        self.peers[url] = remote
        self._sent[url] = version
        raw = answer.get("records")
        await self.federation.apply(
            list(answer.get("agreements") or []),
            list(answer.get("revocations") or []),
            {remote: raw if isinstance(raw, list) else []},
        )

    def _client(self, url: str) -> Client:
        """A client of the peer at ``url``: HTTP, or carried through relays."""
        # imported on the first sync, not at start (idle RSS, spec §11)
        from hearthnet.client import Client  # noqa: PLC0415
        from hearthnet.federation.carried_client import CarriedClient  # noqa: PLC0415

        node = mesh_peer(url)
        if node is None:
            return Client(url, keys=self.keys, community=self.community_id)
        if self.carrier is None:
            raise BadRequest(f"{url}: this node carries no requests through relays")
        carry = self.carrier.carry_to(node)
        return CarriedClient(node, carry, keys=self.keys, community=self.community_id)

    def _patterns(self, from_community: str, to_community: str) -> tuple[str, ...]:
        """Topic patterns ``from_community`` grants ``to_community`` over the agreements
        in force now."""
        other = to_community if from_community == self.community_id else from_community
        patterns: dict[str, None] = {}
        for agreement in self.view.agreements_with(other, now_ms()):
            grant = agreement.grant(from_community, to_community)
            if grant is not None:
                patterns.update(dict.fromkeys(grant.topics))
        return tuple(patterns)

    # --- pull: their granted topics to us ---------------------------------------------------

    async def _pull_loop(self, url: str) -> None:
        """Pull what ``url``'s community grants us, while an agreement is in force."""
        async with self._client(url) as client:
            while True:
                remote = self.peers.get(url)
                grant = self._patterns(remote, self.community_id) if remote else ()
                if remote is None or not grant:
                    return  # the next tick starts it again when an agreement is in force
                epoch, seq = self._cursors.get(url, ("", 0))
                # first contact: from the start of the remote log (what retention kept)
                query: dict[str, Any] = {
                    "topics": ",".join(grant),
                    "timeout_s": PULL_WAIT_S,
                    "since_seq": seq,
                    "verify": "true",  # spec §6.2: frames carry sig only when asked; we re-verify
                }
                try:
                    async with asyncio.timeout(PULL_WAIT_S + REQUEST_S):
                        page = await client.request_json("GET", "/pubsub/v1/subscribe", query=query)
                except (WireError, TimeoutError) as exc:
                    log.info("federation pull from %s: %s", url, exc)
                    return
                if not isinstance(page, dict):
                    raise BadRequest(f"{url} answered a pull with something else")
                frames = page.get("messages") or []
                # the cursor moves only past what is durable here: a crash before the
                # commit pulls the same page again (duplicates drop)
                await self.take_messages(
                    remote, [f.get("data") if isinstance(f, dict) else None for f in frames]
                )
                new_epoch, head = str(page.get("epoch", "")), page.get("head_seq")
                if epoch and new_epoch != epoch:
                    head = 0  # the remote log was recreated: start over (duplicates drop)
                if isinstance(head, int) and new_epoch:
                    self._cursors[url] = (new_epoch, head)
                    await asyncio.to_thread(self.store.put_cursor, url, new_epoch, head)

    async def take_messages(self, remote: str, items: list[Any]) -> int:
        """Messages from ``remote``'s community (pulled, or pushed to us): each verified,
        of an origin that is a member of ``remote``, on a topic ``remote`` grants us,
        is ingested (through pub/sub's facade, :meth:`PubSub.ingest
        <hearthnet.pubsub.service.PubSub.ingest>`); the rest is dropped and counted.
        Returns how many were taken, once every one of them is durable in the log (so a
        pull's cursor and a push's answer never run ahead of what a crash would keep).

        Raises:
            Unavailable: the log's queue is full; the messages before it were taken.
            HearthNetError: a commit failed (the caller pulls or is pushed them again).
        """
        commits: list[asyncio.Future[Any]] = []
        try:
            taken = self._queue_messages(remote, items, commits)
        finally:
            if commits:
                await asyncio.gather(*commits)
        return taken

    def _queue_messages(
        self, remote: str, items: list[Any], commits: list[asyncio.Future[Any]]
    ) -> int:
        """:meth:`take_messages`' checks and queueing; each queued commit appended to
        ``commits``."""
        taken = 0
        for data in items[:MAX_PUSHED]:
            try:
                message = Message.parse(data)
            except HearthNetError as exc:
                self.refused += 1
                log.warning("bad federated message from %s: %s", remote, exc)
                continue
            if self.view.membership.level_of(message.origin) is not None:
                continue  # one of ours, come back: we hold it
            if self.view.community_of(message.origin) != remote or not self.view.may_forward(
                message.topic, remote, self.community_id, now_ms()
            ):
                self.refused += 1
                continue
            # Unavailable (the log's queue is full) goes to the caller: a pull keeps its
            # cursor and a push is answered 503, so what was not taken comes again.
            commits.append(self.federation.pubsub.ingest(message, None))
            taken += 1
            self.pulled += 1
        return taken

    # --- push: our granted topics to them ---------------------------------------------------

    async def _push_loop(self, url: str) -> None:
        """Push our members' messages on the topics we grant ``url``'s community."""
        key = "push:" + url
        async with self._client(url) as client:
            while True:
                remote = self.peers.get(url)
                granted = self._patterns(self.community_id, remote) if remote else ()
                if remote is None or not granted:
                    return  # the next tick starts it again when an agreement is in force
                epoch, after = self._cursors.get(key, (self.log.epoch, 0))
                if epoch != self.log.epoch:
                    after = 0  # our log was recreated
                self._committed.clear()
                rows = await self.log.reader.read_matching(
                    [TopicPattern.parse(p) for p in granted],
                    after_seq=after,
                    upto_seq=self.log.head_seq,
                    limit=PUSH_LIMIT,
                )
                ours = [
                    r.message.body()
                    for r in rows
                    if self.view.membership.level_of(r.message.origin) is not None
                ]
                if ours:
                    async with asyncio.timeout(REQUEST_S):
                        await client.request_json(
                            "POST", "/mesh/v1/federation/push", {"messages": ours}
                        )
                if rows:
                    self._cursors[key] = (self.log.epoch, rows[-1].seq)
                    await asyncio.to_thread(
                        self.store.put_cursor, key, self.log.epoch, rows[-1].seq
                    )
                    continue
                # nothing new: wait for a commit (or a while, to see a revocation)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(PULL_WAIT_S):
                        await self._committed.wait()

    def statistics(self) -> dict[str, Any]:
        """For the listing and tests."""
        return {
            "peers": dict(self.peers),
            "pulled": self.pulled,
            "refused": self.refused,
        }

    async def run(self) -> None:
        """One :meth:`tick` every :data:`SYNC_S` until cancelled; a failing round is
        logged and the next one runs as usual."""
        try:
            while True:
                await asyncio.sleep(SYNC_S)
                try:
                    await self.tick()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("federation round failed; the next runs as usual")
        finally:
            # they read and write the log, which the node closes next
            tasks = [t for t in self.pulls.values() if not t.done()]
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=STOP_S)
