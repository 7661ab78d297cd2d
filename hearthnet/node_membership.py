"""Membership records entering the running node (spec §1.5): admitted, stored, gossiped
on, and enforced: a revocation ends the identity's links and sessions, a topic key
rotation warns the sessions on the tokens it voids and ends them after the grace, and the
pub/sub access rules follow the community's fold. :class:`hearthnet.node.Node` builds it
and hands it the records signed here, submitted, or gossiped.
"""

from __future__ import annotations

import asyncio
import logging

from hearthnet.clock import now_ms
from hearthnet.community import CommunityStore, MembershipRecord
from hearthnet.errors import Expired, Revoked
from hearthnet.membership import Admission, Membership, Source
from hearthnet.mesh.dialer import REVOKED_ADVICE
from hearthnet.mesh.service import Mesh
from hearthnet.node_tasks import NodeTasks
from hearthnet.pubsub.access import AccessRule, effective_rules
from hearthnet.pubsub.service import PubSub
from hearthnet.sessions import SessionRegistry
from hearthnet.tokens import CapabilityToken

log = logging.getLogger("hearthnet.node")


class MembershipIntake:
    """Admits membership records into the running node and carries out what they change."""

    def __init__(
        self,
        membership: Membership,
        store: CommunityStore,
        *,
        mesh: Mesh,
        sessions: SessionRegistry,
        pubsub: PubSub,
        configured_rules: tuple[AccessRule, ...],
        rotation_grace_s: float,
        tasks: NodeTasks,
    ) -> None:
        self.membership = membership
        self.store = store
        self.mesh = mesh
        self.sessions = sessions
        self.pubsub = pubsub
        self.configured_rules = configured_rules  # [[pubsub.rules]], until the community's
        self.rotation_grace_s = rotation_grace_s
        self.tasks = tasks
        # one batch of membership records is folded at a time (off the event loop)
        self._lock = asyncio.Lock()

    def apply(self, record: MembershipRecord) -> bool:
        """Store, apply and gossip a record signed here (or submitted); False if it was
        already known or refused. Folds on the event loop: for one record at a time."""
        admission = self.membership.install(self.membership.admit([record], Source.SUBMIT))
        self._installed(admission, None)
        return bool(admission.accepted)

    async def submit(
        self, records: list[MembershipRecord], source: Source, via: str | None = None
    ) -> Admission:
        """Admit a batch of verified records (from a request or from peer ``via``): fold
        it off the event loop, store and apply what it adds, and gossip that on.

        spec §1.5: records of strangers, void records and, when submitted, records their
        signer had no right to sign are refused and not stored; the admission says why.
        """
        async with self._lock:
            admission = await asyncio.to_thread(self.membership.admitter(records, source))
            admission = self.membership.install(admission)
            if admission.accepted:
                await asyncio.to_thread(self.store.extend, admission.accepted)
            self._installed(admission, via, stored=True)
        return admission

    def _installed(self, admission: Admission, via: str | None, *, stored: bool = False) -> None:
        """Persist (unless done), gossip and enforce what an installed admission added."""
        if not admission.accepted:
            return
        if not stored:
            self.store.extend(admission.accepted)
        self.mesh.broadcast_records(list(admission.accepted), skip=via)
        for record in admission.accepted:
            if record.kind == "member.revoked" and self.membership.is_revoked(record.subject):
                # spec §1.5: links and sessions of the revoked identity end within 10 s
                self.sessions.close_identity(record.subject, Revoked("identity revoked"))
                self.mesh.close_links_of(record.subject, "revoked")
                if record.subject == self.mesh.keys.node_id:
                    # the operator of this node must hear it from its own log, not puzzle
                    # over peers that say "the peer is revoked"
                    log.warning(
                        "this node was revoked from community %s by %s: %s",
                        self.membership.community_id,
                        record.by,
                        REVOKED_ADVICE,
                    )
                else:
                    log.info("revoked %s", record.subject, extra={"peer": record.subject})
            elif (
                record.kind == "token.revoked"
                and record.iss is not None
                and self.membership.is_token_revoked(record.iss, record.subject)
            ):
                self.sessions.close_token(record.iss, record.subject, Revoked("token revoked"))
            elif (
                record.kind == "topic.rotated"
                and (record.subject, record.ts) in self.membership.rotations
            ):
                self._rotate(record.subject, record.ts)
        # Any record can change the community's rules (a late one can change the fold).
        rules = effective_rules(self.membership, self.configured_rules)
        if rules != self.pubsub.policy.rules:
            dropped = self.pubsub.replace_rules(rules)
            log.info("pub/sub access rules changed (%d subscriptions refused now)", dropped)

    def _rotate(self, pattern: str, rotated_ms: int) -> None:
        """A topic key rotation: live sessions on tokens it voids get ``auth.expiring`` and
        the grace to re-authenticate; those that cannot (long-polls, bus streams) end
        when the grace is over."""

        def voided(token: CapabilityToken) -> bool:
            return token.voided_by_rotation(pattern, rotated_ms)

        grace_s = self.rotation_grace_s
        why = f"token voided by a key rotation of {pattern}"
        warned = self.sessions.expire_tokens(voided, now_ms() + int(grace_s * 1000), why)
        log.info("topic key rotation of %s: %d sessions warned", pattern, warned)

        async def end_of_grace() -> None:
            await asyncio.sleep(grace_s)
            self.sessions.close_voided(voided, Expired(why))

        if self.tasks.running:
            self.tasks.spawn(end_of_grace(), f"rotation-{pattern}")
