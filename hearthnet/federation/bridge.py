"""The federation bridge (spec §8): a node with ``mesh.federation_peers`` (URLs of nodes
of other communities), or that another community's bridge synced with, exchanges
agreements, revocations and membership records with each peer every :data:`SYNC_S`
(``POST /mesh/v1/federation/sync``) and pulls the topics the other community grants us
with a signed long-poll (``GET /pubsub/v1/subscribe``) that the other node answers under
the grant. Pulled messages keep their origin's signature; each is checked (origin a
member of that community, topic granted) and ingested into our log, from where gossip
carries it to our members.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from hearthnet.client import Client
from hearthnet.clock import now_ms
from hearthnet.errors import BadRequest, HearthNetError, WireError
from hearthnet.federation.service import Federation, guarded
from hearthnet.pubsub.envelope import Message
from hearthnet.pubsub.log import MessageLog

log = logging.getLogger("hearthnet.federation")

SYNC_S = 2.0  # a bridge's sync round (revocations reach the other side within it)
PULL_WAIT_S = 2  # a bridge's long-poll parks at most this long
MAX_PEERS = 16  # bridge peers (configured and learned)
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
    ) -> None:
        self.federation = federation
        self.view = federation.view
        self.store = federation.store
        self.keys = federation.keys
        self.log = message_log
        self.spawn = spawn
        self.peers: dict[str, str | None] = dict.fromkeys(peers[:MAX_PEERS])  # url -> community
        self.pulls: dict[str, asyncio.Task[Any]] = {}
        self._cursors = self.store.cursors()
        self._sent: dict[str, int] = {}  # peer url -> our membership version it took
        self.pulled = 0  # messages ingested from other communities
        self.refused = 0  # pulled messages refused (bad, origin or topic not granted)

    @property
    def community_id(self) -> str:
        """Our community."""
        return self.view.community_id

    def learn_peer(self, url: object, community: str) -> None:
        """A bridge of ``community`` synced with us from ``url``: pull from it too."""
        if (
            isinstance(url, str)
            and url.startswith(("http://", "https://"))
            and len(url) < 512
            and (url.rstrip("/") in self.peers or len(self.peers) < MAX_PEERS)
        ):
            self.peers[url.rstrip("/")] = community

    # --- bridging -----------------------------------------------------------------------------

    async def tick(self) -> None:
        """One bridge round: sync with every peer, keep one pull running per peer."""
        for url in list(self.peers):
            try:
                async with asyncio.timeout(REQUEST_S):
                    await self._sync_with(url)
            except (HearthNetError, OSError, TimeoutError) as exc:
                log.info("federation sync with %s failed: %s", url, exc)
                continue
            task = self.pulls.get(url)
            if task is None or task.done():
                name = f"federation-pull-{url}"
                self.pulls[url] = self.spawn(guarded(self._pull_loop(url), name), name)

    async def _sync_with(self, url: str) -> None:
        community = self.peers.get(url)
        # our records only when they changed since the last sync that took them
        version = self.view.membership.version
        body = self.federation.offer(community or "", members=self._sent.get(url) != version)
        if not community:  # first contact: every agreement we hold may concern it
            body["agreements"] = [a.to_json() for a in self.view.agreements.values()]
        theirs = self.view.foreign.get(community or "")
        body["known"] = len(theirs.records) if theirs is not None else 0
        async with Client(url, keys=self.keys, community=self.community_id) as client:
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

    async def _pull_loop(self, url: str) -> None:
        """Pull what ``url``'s community grants us, while an agreement is in force."""
        async with Client(url, keys=self.keys, community=self.community_id) as client:
            while True:
                remote = self.peers.get(url)
                grant = self._granted_by(remote, now_ms()) if remote else None
                if remote is None or grant is None or not grant:
                    return  # the next tick starts it again when an agreement is in force
                epoch, seq = self._cursors.get(url, ("", 0))
                # first contact: from the start of the remote log (what retention kept)
                query: dict[str, Any] = {
                    "topics": ",".join(grant),
                    "timeout_s": PULL_WAIT_S,
                    "since_seq": seq,
                }
                try:
                    async with asyncio.timeout(PULL_WAIT_S + REQUEST_S):
                        page = await client.request_json("GET", "/pubsub/v1/subscribe", query=query)
                except (WireError, TimeoutError) as exc:
                    log.info("federation pull from %s: %s", url, exc)
                    return
                await self._take_page(url, remote, epoch, page)

    def _granted_by(self, remote: str, now: int) -> tuple[str, ...]:
        """Topic patterns ``remote`` grants us over the agreements in force."""
        patterns: dict[str, None] = {}
        for agreement in self.view.agreements_with(remote, now):
            grant = agreement.grant(remote, self.community_id)
            if grant is not None:
                patterns.update(dict.fromkeys(grant.topics))
        return tuple(patterns)

    async def _take_page(self, url: str, remote: str, epoch: str, page: Any) -> None:
        if not isinstance(page, dict):
            raise BadRequest(f"{url} answered a pull with something else")
        new_epoch, head = str(page.get("epoch", "")), page.get("head_seq")
        if epoch and new_epoch != epoch:
            head = 0  # the remote log was recreated: start over (duplicates are dropped)
        for frame in page.get("messages") or []:
            data = frame.get("data") if isinstance(frame, dict) else None
            try:
                message = Message.parse(data)
            except HearthNetError as exc:
                self.refused += 1
                log.warning("bad message pulled from %s: %s", url, exc)
                continue
            origin_community = self.view.community_of(message.origin)
            if self.view.membership.level_of(message.origin) is not None:
                continue  # one of ours, come back: we hold it
            if origin_community != remote or not self.view.may_forward(
                message.topic, remote, self.community_id, now_ms()
            ):
                self.refused += 1
                continue
            self.log.ingest(message, source=None)
            self.pulled += 1
        if isinstance(head, int) and new_epoch:
            self._cursors[url] = (new_epoch, head)
            await asyncio.to_thread(self.store.put_cursor, url, new_epoch, head)

    def statistics(self) -> dict[str, Any]:
        """For ``/status``-like views and tests."""
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
            for task in self.pulls.values():  # they read and write the log
                task.cancel()
