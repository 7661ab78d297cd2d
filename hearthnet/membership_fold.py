"""The membership fold: a pure function of a community's set of signed records (spec §1.5).

Every node that holds the same records computes the same membership, whatever order they
arrived in, because nothing here depends on arrival order:

1. **Chains.** Each signer's chained records form a chain: ``signer_seq`` 1, 2, 3, ... and
   ``prev``, the digest of the signer's previous record. A signer's chain is the longest
   prefix in which each step has exactly one record linking to the step before; a gap
   stops it (later records wait, *pending*), and so does a fork (two records at one step
   both linking to the same previous record: the signer equivocated, nothing from the
   fork on counts).
2. **Legacy era.** Records written before chains (no ``signer_seq``) are folded first, in
   ``(ts, id)`` order as before the upgrade. They only ever come from a node's own store
   or a join answer, never from gossip or a submission, so nobody can add one later.
3. **Merge.** Chains are then merged: of the chain heads whose signer has been added, the
   one with the smallest ``(ts, id)`` is applied next. ``ts`` only orders concurrent
   records of *different* signers (which of two anchors' rules is newer); it never makes a
   record valid or void.
4. **Limits.** ``member.revoked`` and ``member.level_changed`` name ``keep_upto``, the
   subject's last ``signer_seq`` that keeps its old standing. The subject's records past
   it are void (revoked) or judged at the new level, whenever they arrive. A revocation
   outranks level changes. When a limit reaches back over records already applied, the
   fold runs again with the limit known from the start, so what those records added is
   void too (transitively: a member added only by a void record is not a member, and
   neither is whom it added). The fold is done when the limits it starts with are exactly
   those of the records it applies; a limit record that keeps that from settling (one
   that voids what made its own signer a member) is applied without effect.

The result says, per record, whether the fold *applied* it (chain position valid, signer
allowed to sign at that position), and whether its signer lacked the *right* for that kind
(``forbidden``): the node uses both to decide what to store (see ``Membership.admit``).
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hearthnet.errors import BadRequest
from hearthnet.ids import is_node_id

if TYPE_CHECKING:
    from hearthnet.community import MembershipRecord


class Level(enum.IntEnum):
    """Membership levels, ordered: a higher level may do all a lower one may."""

    MEMBER = 1
    TRUSTED = 2
    ANCHOR = 3

    @classmethod
    def parse(cls, text: object) -> Level:
        """``"member"``, ``"trusted"`` or ``"anchor"``; :class:`BadRequest` otherwise."""
        if isinstance(text, str):
            try:
                return cls[text.upper()]
            except KeyError:
                pass
        raise BadRequest(f"unknown level {text!r}: member, trusted or anchor")

    @property
    def label(self) -> str:
        """Lower-case wire name."""
        return self.name.lower()


Rule = tuple[str, str, str]  # (pattern, subscribe level, publish level)
# A limit on a key's chain: (keep_upto, level for the records past it; None = void, the
# (ts, id) of the record that set it: of two level changes at one keep_upto, the later).
Limit = tuple[int, Level | None, tuple[int, str]]
SourcedLimit = tuple[str, int, Level | None, tuple[int, str]]  # (key, *Limit)
LIMIT_KINDS = ("member.revoked", "member.level_changed")
UNLIMITED = 2**63


@dataclass(slots=True)
class MemberInfo:
    """What the fold knows about one member."""

    level: Level
    role: str = "node"
    name: str | None = None
    added_ms: int = 0


@dataclass(slots=True)
class Fold:
    """The membership computed from one set of records."""

    community_id: str
    name: str = ""
    members: dict[str, MemberInfo] = field(default_factory=dict)
    revoked: set[str] = field(default_factory=set)
    revoked_tokens: set[tuple[str, str]] = field(default_factory=set)
    used_invites: set[str] = field(default_factory=set)
    pubsub_rules: tuple[Rule, ...] | None = None
    rotations: list[tuple[str, int]] = field(default_factory=list)  # (pattern, ts)
    # every key that was ever added (its records up to its limits count)
    known: set[str] = field(default_factory=set)
    applied: set[str] = field(default_factory=set)  # record ids the fold applied
    forbidden: set[str] = field(default_factory=set)  # applied, but the signer lacked the right
    void: set[str] = field(default_factory=set)  # chained records past their signer's limit
    # per signer: (signer_seq, digest) of the last record of its chain
    heads: dict[str, tuple[int, str]] = field(default_factory=dict)
    passes: int = 0


def build_chains(records: Iterable[MembershipRecord]) -> dict[str, list[MembershipRecord]]:
    """Each signer's chain: the longest prefix 1, 2, 3... with one record linking per step."""
    steps: dict[str, dict[int, list[MembershipRecord]]] = {}
    for rec in records:
        if rec.signer_seq is not None:
            steps.setdefault(rec.by, {}).setdefault(rec.signer_seq, []).append(rec)
    chains: dict[str, list[MembershipRecord]] = {}
    for signer, by_seq in steps.items():
        chain: list[MembershipRecord] = []
        prev: str | None = None
        while True:
            linking = [r for r in by_seq.get(len(chain) + 1, ()) if r.prev == prev]
            if len(linking) != 1:
                break  # a gap (pending) or a fork (equivocation): the chain stops here
            chain.append(linking[0])
            prev = linking[0].digest
        if chain:
            chains[signer] = chain
    return chains


def fold(community_id: str, records: Iterable[MembershipRecord]) -> Fold:
    """Fold a set of verified records; the result depends on the set only, not its order.

    Passes repeat until the limits a pass starts with are exactly the limits of the
    records it applies (none reaches back unknown, none is left over from a record that
    turned out void). Where no such set exists (a revocation that voids the record that
    made its own signer a member, or anchors revoking each other back and forth), the
    limit records that keep changing are disabled: applied, without effect.
    """
    mine = {r.id: r for r in records if r.community == community_id}
    ordered = sorted(mine.values(), key=lambda r: r.order_key)
    legacy = [r for r in ordered if r.signer_seq is None]
    chains = build_chains(ordered)
    limits: frozenset[SourcedLimit] = frozenset()
    disabled: frozenset[str] = frozenset()
    sources: dict[SourcedLimit, set[str]] = {}
    seen: set[tuple[frozenset[SourcedLimit], frozenset[str]]] = set()
    cap = 8 + 4 * sum(r.kind in LIMIT_KINDS for r in ordered)
    passes = 0
    while True:
        passes += 1
        fold_pass = _Pass(community_id, limits, disabled)
        fold_pass.run(legacy, chains)
        supported = frozenset(fold_pass.supported)
        for limit, ids in fold_pass.supported.items():
            sources.setdefault(limit, set()).update(ids)
        if supported == limits or passes >= cap:
            result = fold_pass.result
            result.heads = {s: (len(c), c[-1].digest) for s, c in chains.items()}
            result.passes = passes
            return result
        if (limits, disabled) in seen:
            flapping = {i for limit in supported ^ limits for i in sources.get(limit, ())}
            disabled, limits, seen = disabled | flapping, frozenset(), set()
            continue
        seen.add((limits, disabled))
        limits = supported


class _Pass:
    """One pass over the records, knowing some limits from the start."""

    def __init__(
        self, community_id: str, limits: frozenset[SourcedLimit], disabled: frozenset[str]
    ) -> None:
        self.community_id = community_id
        self.limits: dict[str, list[Limit]] = {}
        for key, keep_upto, level, order in sorted(limits, key=_limit_order):
            self.limits.setdefault(key, []).append((keep_upto, level, order))
        self.disabled = disabled
        # the limits of the records this pass applied, and which records set them
        self.supported: dict[SourcedLimit, list[str]] = {}
        self.result = Fold(community_id)
        self.base: dict[str, Level] = {community_id: Level.ANCHOR}
        self.heap: list[tuple[int, str, str, int]] = []
        self.chains: dict[str, list[MembershipRecord]] = {}

    # --- standing ------------------------------------------------------------------

    def authority(self, key: str, seq: int) -> Level | None:
        """The level ``key`` signs with at ``seq`` of its chain; None when void or unknown."""
        base = self.base.get(key)
        if base is None:
            return None
        best: Limit | None = None
        for limit in self.limits.get(key, ()):
            if limit[0] >= seq:
                continue
            if limit[1] is None:
                return None  # revoked: void past keep_upto, whatever the level changes say
            # spec §1.5 "applied in order": of two level changes that keep the same
            # records, the later one (the order the merge applies them in, (ts, id))
            if best is None or (limit[0], limit[2]) > (best[0], best[2]):
                best = limit
        return base if best is None else best[1]

    def _limit(self, key: str, limit: Limit, source: str) -> None:
        """A limit on ``key`` from record ``source``, in force for the rest of the pass."""
        self.supported.setdefault((key, *limit), []).append(source)
        known = self.limits.setdefault(key, [])
        if limit not in known:
            known.append(limit)

    # --- the pass ------------------------------------------------------------------

    def run(
        self, legacy: list[MembershipRecord], chains: dict[str, list[MembershipRecord]]
    ) -> None:
        """Fold legacy records, then merge the chains."""
        result = self.result
        result.known.add(self.community_id)
        result.members[self.community_id] = MemberInfo(Level.ANCHOR)
        for rec in legacy:
            level = self._current_level(rec.by)
            if level is None and rec.kind != "community.created":
                continue
            result.applied.add(rec.id)
            self._apply(rec, level, legacy_record=True)
        self.chains = chains
        for key in list(result.known):
            self._push(key, 0)
        while self.heap:
            _ts, _id, key, index = heapq.heappop(self.heap)
            rec = self.chains[key][index]
            seq = rec.signer_seq or 0  # chains hold chained records only
            level = self.authority(key, seq)
            if level is None:
                # spec §1.5: past keep_upto, void whenever it arrives; so is the rest
                result.void.update(r.id for r in self.chains[key][index:])
                continue
            result.applied.add(rec.id)
            self._apply(rec, level, legacy_record=False)
            self._push(key, index + 1)

    def _push(self, key: str, index: int) -> None:
        chain = self.chains.get(key)
        if chain is not None and index < len(chain):
            rec = chain[index]
            heapq.heappush(self.heap, (rec.ts, rec.id, key, index))

    def _current_level(self, key: str) -> Level | None:
        info = self.result.members.get(key)
        return info.level if info is not None else None

    def _apply(self, rec: MembershipRecord, signer: Level | None, *, legacy_record: bool) -> None:
        """Apply one record signed at ``signer``."""
        result = self.result
        if rec.kind == "community.created":
            if rec.by != rec.subject or rec.by != self.community_id:
                result.forbidden.add(rec.id)
            elif not result.name:
                result.name = rec.name or ""
                founder = result.members[self.community_id]
                founder.role, founder.name, founder.added_ms = rec.role or "node", rec.name, rec.ts
            return
        if signer is None:
            result.forbidden.add(rec.id)
            return
        if rec.kind == "member.added":
            level = Level.parse(rec.level) if rec.level else Level.MEMBER
            if signer < Level.TRUSTED or level > signer or not is_node_id(rec.subject):
                result.forbidden.add(rec.id)
            elif (
                rec.subject not in result.revoked
                and rec.subject not in result.known
                and (rec.invite is None or rec.invite not in result.used_invites)
            ):
                result.members[rec.subject] = MemberInfo(
                    level, rec.role or "node", rec.name, rec.ts
                )
                result.known.add(rec.subject)
                self.base[rec.subject] = level
                if rec.invite is not None:
                    result.used_invites.add(rec.invite)
                self._push(rec.subject, 0)
            return
        if rec.kind in ("member.level_changed", "member.revoked"):
            self._apply_limit(rec, signer, legacy_record=legacy_record)
            return
        if rec.kind == "token.revoked":
            if rec.iss is None or not (signer == Level.ANCHOR or rec.by == rec.iss):
                result.forbidden.add(rec.id)
            else:
                result.revoked_tokens.add((rec.iss, rec.subject))
            return
        if rec.kind == "topic.rotated":
            if signer != Level.ANCHOR:
                result.forbidden.add(rec.id)
            else:
                result.rotations.append((rec.subject, rec.ts))
            return
        if rec.kind == "pubsub.rules":
            if signer != Level.ANCHOR or rec.rules is None:
                result.forbidden.add(rec.id)
            else:
                result.pubsub_rules = rec.rules or None
            return
        result.forbidden.add(rec.id)
        return

    def _apply_limit(self, rec: MembershipRecord, signer: Level, *, legacy_record: bool) -> None:
        """member.revoked / member.level_changed: a limit on the subject's chain."""
        result = self.result
        if signer != Level.ANCHOR or rec.subject == self.community_id:
            result.forbidden.add(rec.id)
            return
        revoke = rec.kind == "member.revoked"
        if not revoke and (rec.level is None or rec.subject not in result.members):
            return
        new_level = None if revoke else Level.parse(rec.level)
        keep_upto = 0 if legacy_record else (rec.keep_upto or 0)
        if rec.id in self.disabled:
            return  # no consistent way to apply it (see fold): applied without effect
        self._limit(rec.subject, (keep_upto, new_level, rec.order_key), rec.id)
        if revoke:
            result.members.pop(rec.subject, None)
            result.revoked.add(rec.subject)
        else:
            current = self.authority(rec.subject, UNLIMITED)
            if current is not None:
                result.members[rec.subject].level = current
        return


def _limit_order(limit: SourcedLimit) -> tuple[str, int, int, tuple[int, str]]:
    return (limit[0], limit[1], -1 if limit[2] is None else int(limit[2]), limit[3])
