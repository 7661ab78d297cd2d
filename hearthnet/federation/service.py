"""Federation on one node (spec §8): the thin asyncio layer around
:class:`~hearthnet.federation.view.FederationView`.

- **Intake.** Agreements, revocations and the other communities' membership records come
  from the CLI (``POST /mesh/v1/federation``), from the other community's bridge nodes
  (``POST /mesh/v1/federation/sync``) and from our own community's gossip (topic
  ``mesh.federation``). Every item is signed; each is verified and checked against the
  view, stored in SQLite, and what is new is published on ``mesh.federation`` so that
  every member of our community holds it too (spec §8: agreements reach both communities).
- **Bridging** is :mod:`hearthnet.federation.bridge`'s: it feeds what the other side
  sends through :meth:`Federation.apply` and answers with :meth:`Federation.offer`.
- **Revocation.** A revocation stops calls and pulls at once on the node that holds it
  (every request is checked against the view), ends parked polls of the other
  community's members, and reaches the other community's bridge on its next sync.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

from hearthnet.caller import Caller
from hearthnet.community import Level, MembershipRecord
from hearthnet.errors import (
    BadRequest,
    Forbidden,
    HearthNetError,
    PayloadTooLarge,
    Revoked,
    WireError,
)
from hearthnet.federation.agreement import Agreement, Revocation
from hearthnet.federation.store import FederationStore
from hearthnet.federation.view import MAX_FOREIGN_RECORDS, FederationView
from hearthnet.identity import KeyPair
from hearthnet.pubsub.envelope import StoredMessage
from hearthnet.pubsub.service import PubSub
from hearthnet.sessions import SessionRegistry

log = logging.getLogger("hearthnet.federation")

TOPIC = "mesh.federation"  # spec §6.1: mesh.* is written by nodes only
RECORDS_PER_MESSAGE = 100  # membership records per mesh.federation message
MAX_ITEMS = 64  # agreements or revocations in one request


class Federation:
    """The node's federations: intake and distribution (the bridge is
    :class:`~hearthnet.federation.bridge.Bridge`)."""

    def __init__(
        self,
        *,
        keys: KeyPair,
        view: FederationView,
        store: FederationStore,
        pubsub: PubSub,
        sessions: SessionRegistry,
        spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]],
    ) -> None:
        self.keys = keys
        self.view = view
        self.store = store
        self.pubsub = pubsub
        self.sessions = sessions
        self.spawn = spawn
        self.url = ""
        self._lock = asyncio.Lock()
        self.on_committed: list[Callable[[], None]] = []  # the bridge's pushes wake on it

    @property
    def community_id(self) -> str:
        """Our community."""
        return self.view.community_id

    # --- intake ---------------------------------------------------------------------------

    async def apply(
        self,
        agreements: list[Any],
        revocations: list[Any],
        records: dict[str, list[Any]],
        *,
        distribute: bool = True,
    ) -> dict[str, int]:
        """Verify and hold signed items; store and (when ``distribute``) publish the new
        ones on ``mesh.federation``. Items that do not verify or fit are skipped and
        logged; the counts say what was new.

        Raises:
            PayloadTooLarge: more than :data:`MAX_ITEMS` agreements or revocations.
        """
        if len(agreements) > MAX_ITEMS or len(revocations) > MAX_ITEMS:
            raise PayloadTooLarge(f"at most {MAX_ITEMS} agreements and revocations at a time")
        async with self._lock:
            new_agreements = await asyncio.to_thread(self._parse_all, Agreement.parse, agreements)
            added_a = [a for a in new_agreements if self._hold_agreement(a)]
            added_r: list[Revocation] = []
            added_records: dict[str, list[MembershipRecord]] = {}
            for community, raw in list(records.items())[:MAX_ITEMS]:
                if not isinstance(raw, list) or not raw or len(raw) > MAX_FOREIGN_RECORDS:
                    continue
                parsed = await asyncio.to_thread(self._parse_all, MembershipRecord.parse, raw)
                fresh = self._hold_records(community, parsed)
                if fresh:
                    added_records[community] = fresh
            parsed_r: list[Revocation] = await asyncio.to_thread(
                self._parse_all, Revocation.parse, revocations
            )
            for revocation in parsed_r:
                if self._hold(partial(self.view.add_revocation, revocation)):
                    added_r.append(revocation)
            await asyncio.to_thread(self._persist, added_a, added_r, added_records)
        self._end_sessions(added_r, added_records)
        if distribute and (added_a or added_r or added_records):
            await self._publish(added_a, added_r, added_records)
        return {
            "agreements": len(added_a),
            "revocations": len(added_r),
            "records": sum(len(r) for r in added_records.values()),
        }

    @staticmethod
    def _parse_all(parse: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        out = []
        for item in items:
            try:
                out.append(parse(item))
            except HearthNetError as exc:
                log.warning("dropped a federation item: %s", exc)
        return out

    @staticmethod
    def _hold(step: Callable[[], bool]) -> bool:
        try:
            return step()
        except HearthNetError as exc:
            log.warning("federation item not held: %s", exc)
            return False

    def _hold_agreement(self, agreement: Agreement) -> bool:
        # only what an anchor of ours signed takes a slot (a stranger cannot fill them)
        ours = agreement.signer_of(self.community_id)
        if ours is None or not self.view.is_anchor(ours, self.community_id):
            log.warning("federation agreement %s not signed by an anchor of ours", agreement.id)
            return False
        return self._hold(lambda: self.view.add_agreement(agreement))

    def _hold_records(
        self, community: str, parsed: list[MembershipRecord]
    ) -> list[MembershipRecord]:
        before = self.view.view_of(community)
        known = set(before.records) if before is not None else set()
        if not self._hold(lambda: self.view.add_foreign_records(community, parsed) > 0):
            return []
        after = self.view.view_of(community)
        assert after is not None
        return [r for r in parsed if r.id in after.records and r.id not in known]

    def _persist(
        self,
        agreements: list[Agreement],
        revocations: list[Revocation],
        records: dict[str, list[MembershipRecord]],
    ) -> None:
        for agreement in agreements:
            self.store.put_agreement(agreement)
        for community, recs in records.items():
            self.store.put_records(community, recs)
        for revocation in revocations:
            self.store.put_revocation(revocation)

    async def _publish(
        self,
        agreements: list[Agreement],
        revocations: list[Revocation],
        records: dict[str, list[MembershipRecord]],
    ) -> None:
        """Tell our community (spec §8): every member holds the agreements in force."""
        me = Caller(self.keys.node_id, "node", Level.ANCHOR, None, True)
        bodies: list[dict[str, Any]] = [
            {
                "agreements": [a.to_json() for a in agreements],
                "revocations": [r.to_json() for r in revocations],
                "records": {},
            }
        ]
        for community, recs in records.items():
            for i in range(0, len(recs), RECORDS_PER_MESSAGE):
                chunk = [r.to_json() for r in recs[i : i + RECORDS_PER_MESSAGE]]
                bodies.append({"agreements": [], "revocations": [], "records": {community: chunk}})
        for body in bodies:
            try:
                await self.pubsub.publish(me, TOPIC, "federation", body, 7 * 24 * 3600)
            except WireError as exc:
                log.warning("could not publish federation items: %s", exc)

    def on_commit(self, batch: list[StoredMessage]) -> None:
        """The log committed ``batch``: apply federation items that came from our peers,
        and wake the bridge's pushes."""
        for wake in self.on_committed:
            wake()
        for stored in batch:
            # topic and origin first: a commit's other messages need no Message made
            if stored.topic != TOPIC or stored.origin == self.keys.node_id:
                continue
            message = stored.message
            if self.view.membership.level_of(message.origin) is None:
                continue
            data = message.data if isinstance(message.data, dict) else {}
            try:
                self.spawn(guarded(self._apply_gossiped(data), "federation-gossip"), "federation")
            except RuntimeError:  # the node is stopping: the item stays in the log
                return

    async def _apply_gossiped(self, data: dict[str, Any]) -> None:
        agreements, revocations = data.get("agreements"), data.get("revocations")
        records = data.get("records")
        if not (
            isinstance(agreements, list)
            and isinstance(revocations, list)
            and isinstance(records, dict)
        ):
            return
        try:
            await self.apply(agreements, revocations, records, distribute=False)
        except HearthNetError as exc:
            log.warning("federation items from gossip not applied: %s", exc)

    def _end_sessions(
        self, revocations: list[Revocation], records: dict[str, list[MembershipRecord]]
    ) -> None:
        """Sessions of the other communities' members end when their grant does (spec
        §8: within 10 s; here at once): every session on a revoked agreement, and every
        session of a member its own community just revoked (spec §1.5)."""
        for revocation in revocations:
            agreement = self.view.agreements.get(revocation.agreement)
            if agreement is not None:
                issuer = agreement.signer_of(self.community_id) or self.community_id
                self.sessions.close_token(
                    issuer, agreement.id, Forbidden("the federation agreement was revoked")
                )
        for recs in records.values():
            for record in recs:
                if record.kind == "member.revoked":
                    self.sessions.close_identity(record.subject, Revoked("identity revoked"))

    # --- what the other side's bridge asks ---------------------------------------------------

    def offer(self, community: str, *, members: bool = True) -> dict[str, Any]:
        """What we hand a bridge of ``community``: the agreements with it, their
        revocations, and (``members``) our membership records. (A bridge sends its
        records when they changed since its last sync; an answer carries ours unless the
        bridge said it holds as many as we have, ``known``: records only accumulate.)"""
        agreements = [a for a in self.view.agreements.values() if community in a.communities]
        ids = {a.id for a in agreements}
        records = self.view.membership.records.values() if members else ()
        return {
            "community": self.community_id,
            "agreements": [a.to_json() for a in agreements],
            "revocations": [r.to_json() for i, r in self.view.revocations.items() if i in ids],
            "records": [r.to_json() for r in records],
            "url": self.url,
        }

    async def take_sync(self, body: object) -> str:
        """``POST /mesh/v1/federation/sync`` from another community's bridge: take what
        it sends (all of it signed); returns its community. The HTTP layer then checks
        who signed the request and answers with :meth:`offer`.

        Raises:
            BadRequest: malformed. Forbidden: no agreement with that community is held.
        """
        if not isinstance(body, dict) or not isinstance(body.get("community"), str):
            raise BadRequest("a sync is {community, agreements, revocations, records, url?}")
        community = str(body["community"])
        if community == self.community_id:
            raise BadRequest("a sync comes from another community")
        agreements, revocations, records = (
            body.get("agreements"),
            body.get("revocations"),
            body.get("records"),
        )
        if not (
            isinstance(agreements, list)
            and isinstance(revocations, list)
            and isinstance(records, list)
        ):
            raise BadRequest("agreements, revocations and records are lists")
        await self.apply(agreements, revocations, {community: records})
        if not any(community in a.communities for a in self.view.agreements.values()):
            raise Forbidden(f"no federation agreement with {community} is held here")
        return community


async def guarded(coro: Coroutine[Any, Any, Any], name: str) -> None:
    """Run ``coro``; a failure is logged, never passed to the node's task group (which
    would end the node)."""
    try:
        await coro
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("federation task %s failed", name)
