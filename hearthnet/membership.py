"""A community's membership as the node holds it (spec §1.5): the records, their fold, and
what a new batch of records may add.

:class:`Membership` is shared by everything that checks members; :func:`admit_records`
decides, as a pure function that may run on a worker thread, which records of a batch are
stored and which are refused; :func:`open_membership` loads a data directory's records.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable, Container
from dataclasses import dataclass
from functools import partial

from hearthnet.community import CommunityStore, MembershipRecord
from hearthnet.errors import (
    BadRequest,
    CapacityExceeded,
    Forbidden,
    PayloadTooLarge,
    Revoked,
    StorageError,
    Unauthorized,
    WireError,
)
from hearthnet.identity import KeyPair
from hearthnet.membership_fold import Fold, Level, MemberInfo, Rule, fold
from hearthnet.tokens import CapabilityToken


class Source(enum.Enum):
    """Where a batch of records comes from; it decides what :meth:`Membership.admit` keeps."""

    # the node's own records.jsonl, or the answer to its join request signed by the
    # inviter (mesh/admission.py): legacy records (written before chains) are accepted,
    # and no caps apply
    STORE = "store"
    # any other answer to a join request (a bootstrap node that is not the inviter, an
    # older node that does not sign answers): the whole log, so no per-request cap, but
    # chained records only, as over a peer link; one its signer had no right to sign is
    # kept inert. Whoever serves the answer can then withhold records, never add one
    # that the community's chains do not hold.
    JOIN = "join"
    # a peer link: chained records only; one its signer had no right to sign is kept
    # inert, so that every node holds the same chains
    GOSSIP = "gossip"
    # POST /mesh/v1/membership or signed on this node: chained records only; one its
    # signer had no right to sign is refused (forbidden) and not stored
    SUBMIT = "submit"


@dataclass(frozen=True, slots=True)
class MembershipCaps:
    """Bounds on what a node accepts (``[mesh] membership_*`` in the configuration)."""

    per_request: int = 1000  # records in one request or gossip frame
    per_signer: int = 10_000  # records stored per signing key


@dataclass(frozen=True, slots=True)
class Admission:
    """What a batch of records does to a membership view: computed, not yet installed."""

    accepted: tuple[MembershipRecord, ...]
    refused: tuple[tuple[MembershipRecord, WireError], ...]
    fold: Fold
    source: Source
    base_version: int

    def first_error(self) -> WireError | None:
        """The first refusal, to answer a request that stored nothing."""
        return self.refused[0][1] if self.refused else None


def admit_records(
    community_id: str,
    caps: MembershipCaps,
    stored: tuple[MembershipRecord, ...],
    batch: list[MembershipRecord],
    *,
    source: Source,
    base_version: int,
) -> Admission:
    """Decide which of ``batch`` to store next to ``stored`` (pure; may run off the loop).

    A record is kept when the fold of ``stored`` plus the batch applies it, or when its
    signer is a member and it waits for an earlier record of its chain (pending). Records
    of strangers are refused (``unauthorized``), records of a revoked key past its
    ``keep_upto`` (``revoked``), records over the per-signer cap (``capacity_exceeded``),
    legacy records over the wire (``bad_request``) and, when submitted, records their
    signer had no right to sign (``forbidden``).
    """
    if source in (Source.GOSSIP, Source.SUBMIT) and len(batch) > caps.per_request:
        raise PayloadTooLarge(f"at most {caps.per_request} membership records at a time")
    known = {r.id for r in stored}
    counts = Counter(r.by for r in stored)
    # spec §1.5: a chain position, once held, is never taken by another record. A fork
    # stops the signer's chain in the fold, so a second record at a held place would
    # retract everything after it: a revoked key could undo its own past records (a
    # revocation it issued, say). The first record a node holds keeps the place.
    places: dict[tuple[str, int | None], str] = {
        (r.by, r.signer_seq): r.id for r in stored if r.signer_seq is not None
    }
    fresh: list[MembershipRecord] = []
    refused: list[tuple[MembershipRecord, WireError]] = []
    for rec in batch:
        if rec.community != community_id or rec.id in known:
            continue
        known.add(rec.id)
        place = (rec.by, rec.signer_seq)
        if rec.is_legacy and source is not Source.STORE:
            refused.append((rec, BadRequest("a membership record needs signer_seq and prev")))
        elif (
            source is not Source.STORE
            and rec.signer_seq is not None
            and places.setdefault(place, rec.id) != rec.id
        ):
            refused.append(
                (
                    rec,
                    # place_taken: the signer may sign again at its chain's new head
                    BadRequest(
                        f"another record holds signer_seq {rec.signer_seq} of {rec.by}",
                        extra={"place_taken": True},
                    ),
                )
            )
        elif source is not Source.STORE and counts[rec.by] >= caps.per_signer:
            refused.append((rec, CapacityExceeded(f"at most {caps.per_signer} records per signer")))
        else:
            counts[rec.by] += 1
            fresh.append(rec)
    if not fresh:
        return Admission((), tuple(refused), fold(community_id, stored), source, base_version)
    result = fold(community_id, [*stored, *fresh])
    accepted: list[MembershipRecord] = []
    forbidden = False
    for rec in fresh:
        if rec.id in result.applied:
            if rec.id in result.forbidden and source is Source.SUBMIT:
                forbidden = True
                refused.append((rec, Forbidden(f"{rec.by} may not sign {rec.kind} here")))
            else:
                accepted.append(rec)
        elif rec.id in result.void or rec.by in result.revoked:
            # a revoked key's records wait for nothing: those up to its keep_upto are
            # applied when they link, the rest are void (not stored, so a revoked key
            # cannot fill the store with records past a gap)
            refused.append((rec, Revoked("the signer was revoked before this record")))
        elif rec.by in result.known:
            accepted.append(rec)  # pending: an earlier record of its chain is missing
        else:
            refused.append((rec, Unauthorized("the signer is not a member of the community")))
    if forbidden:
        result = fold(community_id, [*stored, *accepted])
    return Admission(tuple(accepted), tuple(refused), result, source, base_version)


def split_submitted(
    raw: list[object], community_id: str, known: Container[str], held: Container[str]
) -> tuple[list[object], list[dict[str, object]]]:
    """Sort submitted records before any signature is checked (spec §1.5: a node refuses
    records from strangers, and checking a signature is the expensive part).

    Returns the records worth verifying, and those refused at once: signed by a key that
    is neither a member (``known``, revoked ones included: their records up to
    ``keep_upto`` stay valid) nor added by one in this same batch, directly or down a
    line of additions. Records of another community and records already ``held`` (by
    id) are dropped, as the fold would drop them. Anything not shaped like a record is
    left to the parser, which refuses it without checking a signature.
    """
    adds: dict[str, list[str]] = {}
    for r in raw:
        if isinstance(r, dict) and r.get("kind") == "member.added":
            by, subject = r.get("by"), r.get("subject")
            if isinstance(by, str) and isinstance(subject, str):
                adds.setdefault(by, []).append(subject)
    reach = {by for by in adds if by in known}
    todo = list(reach)
    while todo:
        for subject in adds.get(todo.pop(), ()):
            if subject not in reach:
                reach.add(subject)
                todo.append(subject)
    verify: list[object] = []
    strangers: list[dict[str, object]] = []
    for r in raw:
        if not isinstance(r, dict) or not isinstance(r.get("by"), str):
            verify.append(r)
        elif r.get("community") != community_id or (
            isinstance(r.get("id"), str) and r["id"] in held
        ):
            continue
        elif r["by"] in known or r["by"] in reach:
            verify.append(r)
        else:
            strangers.append(r)
    return verify, strangers


class Membership:
    """A community's records and their fold, shared by everything that checks members.

    The fold is replaced as a whole when records are installed, so readers never see a
    half-applied batch.
    """

    def __init__(self, community_id: str, caps: MembershipCaps | None = None) -> None:
        self.community_id = community_id
        self.caps = caps or MembershipCaps()
        self.records: dict[str, MembershipRecord] = {}
        self.version = 0
        self._fold = fold(community_id, ())

    # --- the view ------------------------------------------------------------------

    @property
    def name(self) -> str:
        """The community's name (from ``community.created``)."""
        return self._fold.name

    @property
    def members(self) -> dict[str, MemberInfo]:
        """Live members by key."""
        return self._fold.members

    @property
    def revoked(self) -> set[str]:
        """Revoked keys."""
        return self._fold.revoked

    @property
    def revoked_tokens(self) -> set[tuple[str, str]]:
        """Individually revoked tokens as ``(iss, jti)``."""
        return self._fold.revoked_tokens

    @property
    def used_invites(self) -> set[str]:
        """Nonces of invites already redeemed."""
        return self._fold.used_invites

    @property
    def pubsub_rules(self) -> tuple[Rule, ...] | None:
        """The community's pub/sub rules; None while no anchor has set any."""
        return self._fold.pubsub_rules

    @property
    def known(self) -> set[str]:
        """Every key a record made a member (revoked ones included)."""
        return self._fold.known

    def level_of(self, identity: str) -> Level | None:
        """The identity's level, or None when it is not a (live) member."""
        info = self._fold.members.get(identity)
        return info.level if info is not None else None

    def is_revoked(self, identity: str) -> bool:
        """True when the identity was a member and was revoked."""
        return identity in self._fold.revoked

    def is_token_revoked(self, iss: str, jti: str) -> bool:
        """True when the token ``(iss, jti)`` was revoked individually."""
        return (iss, jti) in self._fold.revoked_tokens

    @property
    def rotations(self) -> tuple[tuple[str, int], ...]:
        """Topic key rotations ``(pattern, ts)`` in fold order."""
        return tuple(self._fold.rotations)

    def rotation_voiding(self, token: CapabilityToken) -> str | None:
        """The pattern of a key rotation that voids ``token``, or None."""
        for pattern, rotated_ms in self._fold.rotations:
            if token.voided_by_rotation(pattern, rotated_ms):
                return pattern
        return None

    def head(self, identity: str) -> tuple[int, str | None]:
        """``(signer_seq, digest)`` of the last record of the identity's chain; (0, None)
        before its first."""
        head = self._fold.heads.get(identity)
        return head if head is not None else (0, None)

    # --- changing it ---------------------------------------------------------------

    def sign(
        self,
        signer: KeyPair,
        kind: str,
        subject: str,
        *,
        now_ms: int,
        level: Level | None = None,
        name: str | None = None,
        role: str | None = None,
        iss: str | None = None,
        invite: str | None = None,
        rules: tuple[Rule, ...] | None = None,
        keep_upto: int | None = None,
    ) -> MembershipRecord:
        """A new record by ``signer``, next on its chain (not applied yet).

        A revocation or level change keeps the subject's chain as this view knows it
        (``keep_upto`` = the subject's last signer_seq) unless told otherwise.
        """
        seq, prev = self.head(signer.node_id)
        if kind in ("member.revoked", "member.level_changed") and keep_upto is None:
            keep_upto = self.head(subject)[0]
        return MembershipRecord.create(
            signer,
            kind,
            self.community_id,
            subject,
            now_ms=now_ms,
            level=level,
            name=name,
            role=role,
            iss=iss,
            invite=invite,
            rules=rules,
            signer_seq=seq + 1,
            prev=prev,
            keep_upto=keep_upto,
        )

    def admit(self, batch: list[MembershipRecord], source: Source) -> Admission:
        """What ``batch`` would do (see :func:`admit_records`); nothing changes yet.

        Raises:
            PayloadTooLarge: more records than the per-request cap.
        """
        return self.admitter(batch, source)()

    def admitter(self, batch: list[MembershipRecord], source: Source) -> Callable[[], Admission]:
        """:meth:`admit` as a call that reads nothing of this view any more (the records
        are taken now), so it can run on a worker thread while the loop goes on."""
        stored = tuple(self.records.values())
        return partial(
            admit_records,
            self.community_id,
            self.caps,
            stored,
            batch,
            source=source,
            base_version=self.version,
        )

    def install(self, admission: Admission) -> Admission:
        """Store the admitted records and switch to their fold (recomputed when the view
        changed since the admission was computed). Returns what was installed."""
        if admission.base_version != self.version:
            admission = self.admit(list(admission.accepted), admission.source)
        if admission.accepted or admission.fold.heads != self._fold.heads:
            for rec in admission.accepted:
                self.records[rec.id] = rec
            self._fold = admission.fold
            self.version += 1
        return admission

    def add(self, record: MembershipRecord, source: Source = Source.GOSSIP) -> bool:
        """Admit and install one record; False when it was known, foreign or refused."""
        return bool(self.install(self.admit([record], source)).accepted)

    def add_all(self, records: list[MembershipRecord], source: Source) -> Admission:
        """Admit and install a batch (in any order: it is folded as a set)."""
        return self.install(self.admit(records, source))


def open_membership(
    store: CommunityStore,
    keys: KeyPair,
    *,
    name: str,
    now_ms: int,
    caps: MembershipCaps | None = None,
) -> Membership:
    """Load the node's community, creating a single-node community on first start.

    A node started without a community founds one of its own (spec §1.5), so
    ``hearthnet node start`` works with no arguments. Records written before chains
    (legacy) load as they are: see :mod:`hearthnet.membership_fold`.
    """
    records = store.load()
    if not records:
        genesis = MembershipRecord.create(
            keys,
            "community.created",
            keys.node_id,
            keys.node_id,
            now_ms=now_ms,
            name=name,
            signer_seq=1,
            prev=None,
        )
        store.append(genesis)
        records = [genesis]
    created = [r for r in records if r.kind == "community.created"]
    if not created:
        raise StorageError(f"{store.path}: no community.created record")
    membership = Membership(created[0].community, caps)
    membership.add_all(records, Source.STORE)
    return membership
