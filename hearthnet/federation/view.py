"""What a node knows of its federations, and every decision about them (spec §8). Pure.

A :class:`FederationView` holds the agreements and revocations this node has seen and the
membership views of the other communities (their signed membership records, folded like
our own: a community's records verify offline from its founder's key, spec §1.5).

An agreement is *in force* at ``now`` when it is signed by both sides, each signer is an
anchor of the community it signs for in the current membership view (so revoking or
demoting an anchor voids what it signed), it has not expired, and no revocation signed by
an anchor of either community names it. Everything the node decides goes through:

- :meth:`may_forward` ``(topic, from_community, to_community)``: may a message published
  in one community on ``topic`` flow to the other;
- :meth:`may_call` ``(name, version, caller_community)``: may members of another
  community call this capability on our nodes;
- :meth:`accepts_origin` (gossip, spec §7.3) and :meth:`federated_caller` (requests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hearthnet.community import MembershipRecord
from hearthnet.errors import BadRequest, Forbidden, PayloadTooLarge, Revoked, Unauthorized
from hearthnet.federation.agreement import Agreement, Grant, Revocation
from hearthnet.membership import Membership, MembershipCaps, Source
from hearthnet.membership_fold import Level

MAX_AGREEMENTS = 64  # agreements held (in force or not), per node
MAX_REVOCATIONS = 256
MAX_FOREIGN_COMMUNITIES = 16
MAX_FOREIGN_RECORDS = 512  # membership records held per other community
FOREIGN_CAPS = MembershipCaps(per_request=MAX_FOREIGN_RECORDS, per_signer=MAX_FOREIGN_RECORDS)


@dataclass(frozen=True, slots=True)
class FederatedPeer:
    """A member of a federated community, as a request sees it."""

    identity: str
    community: str
    grant: Grant  # what our community grants its community, over every agreement in force
    agreements: tuple[Agreement, ...]  # those agreements, newest first


class FederationView:
    """Agreements, revocations and the other communities' membership, for one node."""

    def __init__(self, membership: Membership) -> None:
        self.membership = membership
        self.agreements: dict[str, Agreement] = {}
        self.revocations: dict[str, Revocation] = {}
        self.foreign: dict[str, Membership] = {}

    @property
    def community_id(self) -> str:
        """Our community."""
        return self.membership.community_id

    def view_of(self, community: str) -> Membership | None:
        """The membership view of ``community`` (ours or a federated one)."""
        if community == self.community_id:
            return self.membership
        return self.foreign.get(community)

    def is_anchor(self, identity: str, community: str) -> bool:
        """Whether ``identity`` is an anchor of ``community`` now. The founder always is
        (its key is the CommunityID and cannot be revoked, spec §1.5), also before any
        record of that community is known."""
        if identity == community:
            return True
        view = self.view_of(community)
        return view is not None and view.level_of(identity) == Level.ANCHOR

    # --- adding what arrives --------------------------------------------------------------

    def add_agreement(self, agreement: Agreement) -> bool:
        """Hold a complete agreement that involves our community; True when it is new.

        Raises:
            BadRequest: a proposal, or an agreement between two other communities.
            PayloadTooLarge: :data:`MAX_AGREEMENTS` held already.
        """
        if not agreement.complete:
            raise BadRequest("a proposal is signed by one side; accept it first")
        if self.community_id not in agreement.communities:
            raise BadRequest("the agreement is between two other communities")
        if agreement.id in self.agreements:
            return False
        if len(self.agreements) >= MAX_AGREEMENTS:
            raise PayloadTooLarge(f"at most {MAX_AGREEMENTS} federation agreements")
        self.agreements[agreement.id] = agreement
        return True

    def add_revocation(self, revocation: Revocation) -> bool:
        """Hold a revocation of an agreement we hold, signed by an anchor of one of its
        communities; True when it is new.

        Raises:
            NotFound-like BadRequest: no such agreement here.
            Unauthorized: the signer is not an anchor of either community.
        """
        agreement = self.agreements.get(revocation.agreement)
        if agreement is None:
            raise BadRequest(f"no agreement {revocation.agreement} is known here")
        if not any(self.is_anchor(revocation.by, c) for c in agreement.communities):
            raise Unauthorized("only an anchor of either community revokes an agreement")
        if revocation.agreement in self.revocations:
            return False
        if len(self.revocations) >= MAX_REVOCATIONS:
            raise PayloadTooLarge(f"at most {MAX_REVOCATIONS} federation revocations")
        self.revocations[revocation.agreement] = revocation
        return True

    def add_foreign_records(self, community: str, records: list[MembershipRecord]) -> int:
        """Fold another community's membership records into its view; the number new.

        Raises:
            BadRequest: our own community, or one we have no agreement with.
            PayloadTooLarge: over :data:`MAX_FOREIGN_RECORDS` or
                :data:`MAX_FOREIGN_COMMUNITIES`.
        """
        if community == self.community_id:
            raise BadRequest("our own records travel as membership, not federation")
        if not any(community in a.communities for a in self.agreements.values()):
            raise BadRequest(f"no agreement with {community} is known here")
        view = self.foreign.get(community)
        if view is None:
            if len(self.foreign) >= MAX_FOREIGN_COMMUNITIES:
                raise PayloadTooLarge(f"at most {MAX_FOREIGN_COMMUNITIES} federated communities")
            view = Membership(community, FOREIGN_CAPS)
        fresh = [r for r in records if r.community == community and r.id not in view.records]
        if len(view.records) + len(fresh) > MAX_FOREIGN_RECORDS:
            raise PayloadTooLarge(f"at most {MAX_FOREIGN_RECORDS} records of another community")
        if not fresh:
            return 0
        # as from a peer link: chained records only (legacy unchained ones could be
        # made up by whoever hands them over), the fold decides what they may do
        admitted = view.add_all(fresh, Source.GOSSIP)
        self.foreign[community] = view
        return len(admitted.accepted)

    # --- decisions ----------------------------------------------------------------------

    def in_force(self, agreement: Agreement, now_ms: int) -> bool:
        """Whether ``agreement`` is in force at ``now_ms`` (see the module docstring)."""
        return (
            agreement.complete
            and agreement.expires_ms > now_ms
            and agreement.id not in self.revocations
            and self.is_anchor(agreement.signer_a, agreement.community_a)
            and agreement.signer_b is not None
            and self.is_anchor(agreement.signer_b, agreement.community_b)
        )

    def agreements_with(self, community: str, now_ms: int) -> list[Agreement]:
        """Agreements in force between our community and ``community``, newest first."""
        found = [
            a
            for a in self.agreements.values()
            if community in a.communities
            and self.community_id in a.communities
            and self.in_force(a, now_ms)
        ]
        return sorted(found, key=lambda a: a.created_ms, reverse=True)

    def in_force_count(self, now_ms: int) -> int:
        """How many agreements are in force at ``now_ms`` (for ``/metrics``)."""
        return sum(1 for a in self.agreements.values() if self.in_force(a, now_ms))

    def may_forward(self, topic: str, from_community: str, to_community: str, now_ms: int) -> bool:
        """Whether a message published in ``from_community`` on ``topic`` may flow to
        ``to_community`` (one of them is ours; federation is not transitive)."""
        if from_community == to_community:
            return True
        other = to_community if from_community == self.community_id else from_community
        for agreement in self.agreements_with(other, now_ms):
            grant = agreement.grant(from_community, to_community)
            if grant is not None and grant.covers_topic(topic):
                return True
        return False

    def may_call(self, name: str, version: str, caller_community: str, now_ms: int) -> bool:
        """Whether members of ``caller_community`` may call ``name@version`` here."""
        grant = self.granted_to(caller_community, now_ms)
        return grant is not None and grant.covers_call(name, version)

    def granted_to(self, community: str, now_ms: int) -> Grant | None:
        """Everything our community grants ``community`` over the agreements in force
        (None when none is)."""
        agreements = self.agreements_with(community, now_ms)
        if not agreements:
            return None
        topics: dict[str, None] = {}
        caps: dict[str, None] = {}
        for agreement in agreements:
            grant = agreement.grant(self.community_id, community)
            assert grant is not None
            topics.update(dict.fromkeys(grant.topics))
            caps.update(dict.fromkeys(grant.capabilities))
        return Grant(tuple(topics), tuple(caps))

    def community_of(self, identity: str) -> str | None:
        """The federated community ``identity`` is a current member of, if any."""
        for community, view in self.foreign.items():
            if not view.is_revoked(identity) and view.level_of(identity) is not None:
                return community
        return None

    def in_force_community(self, identity: str, now_ms: int) -> str | None:
        """The federated community ``identity`` is a current member of, when an agreement
        with it is in force (spec §8: relays and bridges serve it), else None."""
        community = self.community_of(identity)
        if community is None or not self.agreements_with(community, now_ms):
            return None
        return community

    def bridge_community(self, identity: str, now_ms: int) -> str | None:
        """The federated community ``identity`` is a current member of, when an agreement
        with it in force names ``identity`` among that community's bridges (spec §8:
        only those get a relay's peer link or a relayed session), else None."""
        community = self.community_of(identity)
        if community is None:
            return None
        for agreement in self.agreements_with(community, now_ms):
            if identity in agreement.bridges_of(community):
                return community
        return None

    def accepts_origin(self, origin: str, topic: str, now_ms: int) -> bool:
        """Gossip (spec §7.3): whether a message from ``origin``, who is not one of our
        members, may be stored and forwarded here: it is a member of a federated
        community that grants us ``topic``."""
        community = self.community_of(origin)
        return community is not None and self.may_forward(
            topic, community, self.community_id, now_ms
        )

    def federated_caller(self, identity: str, community: str, now_ms: int) -> FederatedPeer:
        """Who a request signed by ``identity`` for ``community`` (not ours) is.

        Raises:
            Unauthorized: we know no such community or member.
            Revoked: the identity is revoked in its community.
            Forbidden: no agreement with that community is in force (revoked, expired).
        """
        view = self.foreign.get(community)
        if view is None:
            raise Unauthorized("not a member of this community or of a federated one")
        if view.is_revoked(identity):
            raise Revoked("identity revoked in its community")
        if view.level_of(identity) is None:
            raise Unauthorized(f"not a member of {community}")
        agreements = self.agreements_with(community, now_ms)
        grant = self.granted_to(community, now_ms)
        if grant is None:
            raise Forbidden(f"no federation agreement with {community} is in force")
        return FederatedPeer(identity, community, grant, tuple(agreements))

    # --- listing ------------------------------------------------------------------------

    def status(self, agreement: Agreement, now_ms: int) -> str:
        """``in_force``, ``revoked``, ``expired`` or ``unverified`` (a signer not known
        as an anchor here)."""
        if agreement.id in self.revocations:
            return "revoked"
        if agreement.expires_ms <= now_ms:
            return "expired"
        return "in_force" if self.in_force(agreement, now_ms) else "unverified"

    def listing(self, now_ms: int) -> list[dict[str, Any]]:
        """Every agreement held, newest first, with its status (``federation list``)."""
        out = []
        for agreement in sorted(self.agreements.values(), key=lambda a: -a.created_ms):
            revocation = self.revocations.get(agreement.id)
            out.append(
                {
                    **agreement.to_json(),
                    "status": self.status(agreement, now_ms),
                    "revoked_by": revocation.by if revocation else None,
                }
            )
        return out
