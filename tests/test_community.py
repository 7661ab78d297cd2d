"""The signed membership log and its fold (spec §1.5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hearthnet.community import CommunityStore, Level, MembershipRecord
from hearthnet.errors import BadRequest, InvalidSignature
from hearthnet.identity import KeyPair
from hearthnet.membership import Membership, MembershipCaps, Source, open_membership
from hearthnet.membership_fold import Fold, fold

FOUNDER = KeyPair.from_seed(b"\x01" * 32)
ALICE = KeyPair.from_seed(b"\x02" * 32)
BOB = KeyPair.from_seed(b"\x03" * 32)
CAROL = KeyPair.from_seed(b"\x04" * 32)
DAVE = KeyPair.from_seed(b"\x05" * 32)
C = FOUNDER.node_id
LIMITED = ("member.revoked", "member.level_changed")


class Chains:
    """Signs records on per-signer chains, as each signer's own node would."""

    def __init__(self) -> None:
        self.heads: dict[str, tuple[int, str | None]] = {}

    def rec(
        self,
        signer: KeyPair,
        kind: str,
        subject: str,
        ts: int,
        *,
        keep_upto: int | None = None,
        **kw: object,
    ) -> MembershipRecord:
        """The signer's next record; a revocation keeps the subject's chain so far."""
        seq, prev = self.heads.get(signer.node_id, (0, None))
        if kind in LIMITED and keep_upto is None:
            keep_upto = self.heads.get(subject, (0, None))[0]
        record = MembershipRecord.create(
            signer,
            kind,
            C,
            subject,
            now_ms=ts,
            signer_seq=seq + 1,
            prev=prev,
            keep_upto=keep_upto,
            **kw,  # type: ignore[arg-type]
        )
        self.heads[signer.node_id] = (seq + 1, record.digest)
        return record


def legacy(signer: KeyPair, kind: str, subject: str, ts: int, **kw: object) -> MembershipRecord:
    """A record as written before chains (no signer_seq, prev)."""
    return MembershipRecord.create(
        signer,
        kind,
        C,
        subject,
        now_ms=ts,
        signer_seq=None,
        prev=None,
        **kw,  # type: ignore[arg-type]
    )


def levels(view: Fold | Membership) -> dict[str, Level]:
    """Members and their levels."""
    return {k: v.level for k, v in view.members.items()}


@pytest.fixture
def chains() -> Chains:
    """Fresh chains, starting with the founder's genesis."""
    return Chains()


def genesis(chains: Chains) -> MembershipRecord:
    """The founder's community.created, first on its chain."""
    return chains.rec(FOUNDER, "community.created", C, 1, name="home")


def test_founder_is_anchor(chains: Chains) -> None:
    """The community.created record makes the founder an anchor."""
    view = fold(C, [genesis(chains)])
    assert (Level.ANCHOR, "home") == (view.members[C].level, view.name)


def test_fold_is_order_independent(chains: Chains) -> None:
    """Records folded in any order give the same view."""
    g = genesis(chains)
    add_alice = chains.rec(FOUNDER, "member.added", ALICE.node_id, 2, level=Level.TRUSTED)
    add_bob = chains.rec(ALICE, "member.added", BOB.node_id, 3)
    expected = {C: Level.ANCHOR, ALICE.node_id: Level.TRUSTED, BOB.node_id: Level.MEMBER}
    assert [expected] * 2 == [
        levels(fold(C, [g, add_alice, add_bob])),
        levels(fold(C, [add_bob, add_alice, g])),
    ]


def test_member_cannot_add_and_trusted_cannot_add_anchor(chains: Chains) -> None:
    """Adding needs anchor or trusted, and never above the signer's own level."""
    g = genesis(chains)
    add_bob = chains.rec(FOUNDER, "member.added", BOB.node_id, 2)
    bob_adds_alice = chains.rec(BOB, "member.added", ALICE.node_id, 3)
    add_carol = chains.rec(FOUNDER, "member.added", CAROL.node_id, 4, level=Level.TRUSTED)
    carol_adds_anchor = chains.rec(CAROL, "member.added", DAVE.node_id, 5, level=Level.ANCHOR)
    view = fold(C, [g, add_bob, bob_adds_alice, add_carol, carol_adds_anchor])
    assert (None, None, {bob_adds_alice.id, carol_adds_anchor.id}) == (
        view.members.get(ALICE.node_id),
        view.members.get(DAVE.node_id),
        view.forbidden,
    )


def test_revocation_voids_records_past_keep_upto(chains: Chains) -> None:
    """A revoked member is gone, and what it signed past keep_upto has no effect."""
    g = genesis(chains)
    add_alice = chains.rec(FOUNDER, "member.added", ALICE.node_id, 2, level=Level.TRUSTED)
    revoke = chains.rec(FOUNDER, "member.revoked", ALICE.node_id, 3)
    late_add = chains.rec(ALICE, "member.added", BOB.node_id, 4)
    view = fold(C, [g, add_alice, revoke, late_add])
    assert (None, True, None, {late_add.id}) == (
        view.members.get(ALICE.node_id),
        ALICE.node_id in view.revoked,
        view.members.get(BOB.node_id),
        view.void,
    )


def test_backdated_record_of_a_revoked_member_is_void_transitively(chains: Chains) -> None:
    """Finding 2: a revoked trusted member signs member.added with a ts before its own
    revocation; the key it adds, and whom that key adds, are not members."""
    g = genesis(chains)
    add_alice = chains.rec(FOUNDER, "member.added", ALICE.node_id, 10, level=Level.TRUSTED)
    alice_adds_bob = chains.rec(ALICE, "member.added", BOB.node_id, 20)  # before: valid
    revoke = chains.rec(FOUNDER, "member.revoked", ALICE.node_id, 100)  # keep_upto=1
    backdated = chains.rec(ALICE, "member.added", CAROL.node_id, 99, level=Level.TRUSTED)
    carol_adds_dave = chains.rec(CAROL, "member.added", DAVE.node_id, 101, level=Level.TRUSTED)
    records = [g, add_alice, alice_adds_bob, revoke, backdated, carol_adds_dave]
    view = fold(C, records)
    assert ({C, BOB.node_id}, 1, {backdated.id}) == (
        set(view.members),
        revoke.keep_upto,
        view.void,
    )


def test_revocation_arriving_late_voids_what_was_applied(chains: Chains) -> None:
    """Records past keep_upto applied before the revocation arrived are undone by it."""
    g = genesis(chains)
    add_alice = chains.rec(FOUNDER, "member.added", ALICE.node_id, 10, level=Level.TRUSTED)
    revoke = chains.rec(FOUNDER, "member.revoked", ALICE.node_id, 30, keep_upto=0)
    alice_adds_bob = chains.rec(ALICE, "member.added", BOB.node_id, 20, level=Level.TRUSTED)
    bob_adds_carol = chains.rec(BOB, "member.added", CAROL.node_id, 21)
    view = Membership(C)
    before = view.add_all([g, add_alice, alice_adds_bob, bob_adds_carol], Source.GOSSIP)
    members_before = set(view.members)
    after = view.add_all([revoke], Source.GOSSIP)
    assert (4, {C, ALICE.node_id, BOB.node_id, CAROL.node_id}, 1, {C}) == (
        len(before.accepted),
        members_before,
        len(after.accepted),
        set(view.members),
    )


def test_level_change_judges_later_records_at_the_new_level(chains: Chains) -> None:
    """A demoted member's records past keep_upto may no longer add, backdated or not."""
    g = genesis(chains)
    add_alice = chains.rec(FOUNDER, "member.added", ALICE.node_id, 10, level=Level.TRUSTED)
    demote = chains.rec(FOUNDER, "member.level_changed", ALICE.node_id, 50, level=Level.MEMBER)
    backdated = chains.rec(ALICE, "member.added", BOB.node_id, 11)
    view = fold(C, [g, add_alice, demote, backdated])
    assert ({C: Level.ANCHOR, ALICE.node_id: Level.MEMBER}, {backdated.id}) == (
        levels(view),
        view.forbidden,
    )


def test_fork_stops_a_chain(chains: Chains) -> None:
    """Two records at one step of a chain (equivocation): neither counts."""
    g = genesis(chains)
    heads = dict(chains.heads)
    add_alice = chains.rec(FOUNDER, "member.added", ALICE.node_id, 2)
    chains.heads = heads
    add_bob = chains.rec(FOUNDER, "member.added", BOB.node_id, 2)
    assert {C} == set(fold(C, [g, add_alice, add_bob]).members)


def test_gap_waits_for_the_missing_record(chains: Chains) -> None:
    """A record whose predecessor is missing is pending: stored, applied once it comes."""
    g = genesis(chains)
    add_alice = chains.rec(FOUNDER, "member.added", ALICE.node_id, 2)
    add_bob = chains.rec(FOUNDER, "member.added", BOB.node_id, 3)
    view = Membership(C)
    view.add_all([g, add_bob], Source.GOSSIP)
    waiting = set(view.members)
    view.add_all([add_alice], Source.GOSSIP)
    assert ({C}, {C, ALICE.node_id, BOB.node_id}) == (waiting, set(view.members))


def test_strangers_records_are_refused(chains: Chains) -> None:
    """Finding 3 (core): records of a key no record added are refused, not stored."""
    view = Membership(C)
    view.add_all([genesis(chains)], Source.STORE)
    spam = [chains.rec(ALICE, "token.revoked", f"jti-{i}", 5, iss=ALICE.node_id) for i in range(3)]
    admission = view.add_all(spam, Source.GOSSIP)
    assert (0, ["unauthorized"] * 3, 1) == (
        len(admission.accepted),
        [e.code for _, e in admission.refused],
        len(view.records),
    )


def test_submitted_record_without_the_right_is_forbidden(chains: Chains) -> None:
    """Finding 6 (core): a member's revocation is refused when submitted, kept inert over
    gossip (so chains stay identical everywhere); either way it revokes no one."""
    g = genesis(chains)
    add_alice = chains.rec(FOUNDER, "member.added", ALICE.node_id, 2)
    add_bob = chains.rec(FOUNDER, "member.added", BOB.node_id, 3)
    revoke = chains.rec(ALICE, "member.revoked", BOB.node_id, 4)
    submitted, gossiped = Membership(C), Membership(C)
    for view in (submitted, gossiped):
        view.add_all([g, add_alice, add_bob], Source.STORE)
    refused = submitted.add_all([revoke], Source.SUBMIT)
    kept = gossiped.add_all([revoke], Source.GOSSIP)
    assert (["forbidden"], 1, False, False) == (
        [e.code for _, e in refused.refused],
        len(kept.accepted),
        submitted.is_revoked(BOB.node_id),
        gossiped.is_revoked(BOB.node_id),
    )


def test_per_signer_cap(chains: Chains) -> None:
    """No more than the per-signer cap of records is stored for one key."""
    view = Membership(C, MembershipCaps(per_request=10, per_signer=3))
    g = genesis(chains)
    more = [chains.rec(FOUNDER, "token.revoked", f"j{i}", 2 + i, iss=C) for i in range(4)]
    admission = view.add_all([g, *more], Source.GOSSIP)
    assert (3, ["capacity_exceeded"] * 2) == (
        len(admission.accepted),
        [e.code for _, e in admission.refused],
    )


# --- order independence (hypothesis) ------------------------------------------------

KEYS = [FOUNDER, ALICE, BOB, CAROL, DAVE]
KINDS = ["member.added", "member.revoked", "member.level_changed", "token.revoked"]


@st.composite
def histories(draw: st.DrawFn) -> list[MembershipRecord]:
    """Random records on proper chains: adds, revocations (random keep_upto), level
    changes and token revocations between five keys, with random (backdated) ts."""
    chains = Chains()
    records = [genesis(chains)]
    for _ in range(draw(st.integers(0, 10))):
        signer = draw(st.sampled_from(KEYS))
        subject = draw(st.sampled_from(KEYS[1:]))
        kind = draw(st.sampled_from(KINDS))
        ts = draw(st.integers(2, 50))
        level = draw(st.sampled_from(list(Level)))
        if kind == "token.revoked":
            records.append(chains.rec(signer, kind, f"jti-{ts}", ts, iss=subject.node_id))
        elif kind == "member.added":
            records.append(chains.rec(signer, kind, subject.node_id, ts, level=level))
        else:
            keep = draw(st.integers(0, 3))
            extra = {"level": level} if kind == "member.level_changed" else {}
            records.append(chains.rec(signer, kind, subject.node_id, ts, keep_upto=keep, **extra))
    return records


def summary(view: Fold | Membership) -> tuple[object, ...]:
    """What a node enforces."""
    return (levels(view), set(view.revoked), set(view.revoked_tokens))


@settings(max_examples=60, deadline=None)
@given(data=st.data(), records=histories())
def test_any_arrival_order_gives_the_same_membership(
    data: st.DataObject, records: list[MembershipRecord]
) -> None:
    """Records arriving one by one in any order, refused ones offered again later (as a
    peer does on the next link-up), end in the fold of the whole set."""
    expected = summary(fold(C, records))
    order = data.draw(st.permutations(records))
    view = Membership(C)
    pending = list(order)
    while pending:
        retry = []
        for record in pending:
            if not view.add(record, Source.GOSSIP):
                retry.append(record)
        if len(retry) == len(pending):
            break
        pending = retry
    assert expected == summary(view)
    assert expected == summary(fold(C, data.draw(st.permutations(records))))


@settings(max_examples=60, deadline=None)
@given(records=histories(), ts=st.integers(0, 60), back=st.integers(0, 2))
def test_records_past_keep_upto_add_nothing(
    records: list[MembershipRecord], ts: int, back: int
) -> None:
    """Whatever else happened, once an anchor revokes ALICE keeping her chain up to its
    head (or ``back`` records short of it), ALICE's records past keep_upto (at any ts,
    backdated or not) add no member that the fold without them lacks."""
    chains = Chains()
    for record in records:  # continue the same chains
        chains.heads[record.by] = (record.signer_seq or 0, record.digest)
    keep = max(0, chains.heads.get(ALICE.node_id, (0, None))[0] - back)
    revoke = chains.rec(FOUNDER, "member.revoked", ALICE.node_id, 60, keep_upto=keep)
    late = [chains.rec(ALICE, "member.added", k.node_id, ts, level=Level.TRUSTED) for k in KEYS[2:]]
    with_late = fold(C, [*records, revoke, *late])
    without = fold(C, [*records, revoke])
    assert (set(without.members), set()) == (
        set(with_late.members),
        {r.id for r in late} & with_late.applied,
    )


# --- legacy records (written before chains) -------------------------------------------


def test_records_jsonl_from_before_chains_loads(tmp_path: Path) -> None:
    """An old records.jsonl (no signer_seq, prev) loads with the old fold's meaning, and
    new records chain on after it."""
    old = [
        legacy(FOUNDER, "community.created", C, 1, name="home"),
        legacy(FOUNDER, "member.added", ALICE.node_id, 2, level=Level.TRUSTED),
        legacy(ALICE, "member.added", BOB.node_id, 3),
        legacy(FOUNDER, "member.revoked", CAROL.node_id, 4),
    ]
    store = CommunityStore(tmp_path)
    store.dir.mkdir(parents=True)
    store.path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in old))
    view = open_membership(store, FOUNDER, name="x", now_ms=10)
    loaded = levels(view)
    nxt = view.sign(ALICE, "member.added", DAVE.node_id, now_ms=11)
    view.add(nxt, Source.SUBMIT)
    assert (
        {C: Level.ANCHOR, ALICE.node_id: Level.TRUSTED, BOB.node_id: Level.MEMBER},
        "home",
        (1, None),
        Level.MEMBER,
    ) == (loaded, view.name, (nxt.signer_seq, nxt.prev), view.level_of(DAVE.node_id))


def test_legacy_records_are_refused_over_the_wire(chains: Chains) -> None:
    """A backdated record without signer_seq (the old format) from a revoked member is
    refused by gossip, submission and a join answer the inviter did not sign: the legacy
    path only reads the node's own store and its inviter's answer."""
    view = Membership(C)
    g = genesis(chains)
    add_alice = chains.rec(FOUNDER, "member.added", ALICE.node_id, 2, level=Level.TRUSTED)
    revoke = chains.rec(FOUNDER, "member.revoked", ALICE.node_id, 3)
    view.add_all([g, add_alice, revoke], Source.STORE)
    forged = legacy(ALICE, "member.added", BOB.node_id, 1)
    codes = [
        [e.code for _, e in view.add_all([forged], source).refused]
        for source in (Source.GOSSIP, Source.SUBMIT, Source.JOIN)
    ]
    assert ([["bad_request"]] * 3, None) == (codes, view.level_of(BOB.node_id))


def test_legacy_revocation_voids_the_whole_chain(chains: Chains) -> None:
    """A revocation from before chains keeps nothing of the revoked key's chain."""
    g = legacy(FOUNDER, "community.created", C, 1, name="home")
    add_alice = legacy(FOUNDER, "member.added", ALICE.node_id, 2, level=Level.TRUSTED)
    revoke = legacy(FOUNDER, "member.revoked", ALICE.node_id, 3)
    chained = chains.rec(ALICE, "member.added", BOB.node_id, 1)
    view = fold(C, [g, add_alice, revoke, chained])
    assert ({C}, {chained.id}) == (set(view.members), view.void)


CHAT = (("chat.**", "member", "member"), ("**", "anchor", "anchor"))


def test_pubsub_rules_from_anchors_only_last_wins_empty_clears(chains: Chains) -> None:
    """pubsub.rules (spec §6.9): only anchors set them; the anchor's last one wins,
    whatever the arrival order; an empty list hands the rules back to each node."""
    g = genesis(chains)
    add_alice = chains.rec(FOUNDER, "member.added", ALICE.node_id, 2, level=Level.TRUSTED)
    first = chains.rec(FOUNDER, "pubsub.rules", C, 3, rules=CHAT)
    by_trusted = chains.rec(ALICE, "pubsub.rules", C, 4, rules=(("**", "any", "any"),))
    second = chains.rec(FOUNDER, "pubsub.rules", C, 5, rules=CHAT[1:])
    clear = chains.rec(FOUNDER, "pubsub.rules", C, 6, rules=())
    assert fold(C, [g]).pubsub_rules is None
    assert fold(C, [g, add_alice, first, by_trusted]).pubsub_rules == CHAT
    assert fold(C, [second, by_trusted, first, add_alice, g]).pubsub_rules == CHAT[1:]
    assert fold(C, [g, add_alice, first, second, clear]).pubsub_rules is None
    assert MembershipRecord.parse(first.to_json()) == first  # survives the wire


def test_token_revocation_by_issuer_or_anchor(chains: Chains) -> None:
    """token.revoked is honoured from the issuer or an anchor, not from others."""
    g = genesis(chains)
    add_alice = chains.rec(FOUNDER, "member.added", ALICE.node_id, 2)
    add_bob = chains.rec(FOUNDER, "member.added", BOB.node_id, 2)
    by_issuer = chains.rec(ALICE, "token.revoked", "jti-1", 3, iss=ALICE.node_id)
    by_other = chains.rec(BOB, "token.revoked", "jti-2", 3, iss=ALICE.node_id)
    by_anchor = chains.rec(FOUNDER, "token.revoked", "jti-3", 3, iss=ALICE.node_id)
    view = fold(C, [g, add_alice, add_bob, by_issuer, by_other, by_anchor])
    assert [True, False, True] == [
        (ALICE.node_id, j) in view.revoked_tokens for j in ("jti-1", "jti-2", "jti-3")
    ]


def test_founder_cannot_be_revoked(chains: Chains) -> None:
    """The community's root stays."""
    g = genesis(chains)
    add_alice = chains.rec(FOUNDER, "member.added", ALICE.node_id, 2, level=Level.ANCHOR)
    revoke_founder = chains.rec(ALICE, "member.revoked", C, 3)
    assert Level.ANCHOR == fold(C, [g, add_alice, revoke_founder]).members[C].level


@pytest.mark.parametrize(
    "rules",
    [
        [{"pattern": "chat.**", "subscribe": "everyone", "publish": "member"}],
        [{"pattern": "chat..x", "subscribe": "member", "publish": "member"}],
        [{"pattern": "chat.**", "subscribe": "member"}],
        [{"pattern": "chat.**", "subscribe": "member", "publish": "member", "x": "y"}],
        [{"pattern": f"t{i}", "subscribe": "any", "publish": "any"} for i in range(65)],
        "chat.**",
    ],
)
def test_bad_pubsub_rules_are_refused_when_parsed(rules: object) -> None:
    """A bad level, pattern or shape, or too many rules: the record is refused whole."""
    body = {
        "id": "01KANAR9G03AZDCKJ8EVQ3X5S7",
        "kind": "pubsub.rules",
        "community": C,
        "subject": C,
        "by": C,
        "ts": 3,
        "rules": rules,
    }
    body["sig"] = FOUNDER.sign_object(body)
    with pytest.raises(BadRequest):
        MembershipRecord.parse(body)


def test_rules_only_on_pubsub_rules_records(chains: Chains) -> None:
    """Other kinds cannot carry rules, and pubsub.rules needs them."""
    with pytest.raises(BadRequest):
        chains.rec(FOUNDER, "member.added", ALICE.node_id, 2, rules=CHAT)
    with pytest.raises(BadRequest):
        chains.rec(FOUNDER, "pubsub.rules", C, 2)


@pytest.mark.parametrize(
    "change",
    [
        {"signer_seq": 0},
        {"signer_seq": 2},  # no prev
        {"prev": "sha256:x"},
        {"keep_upto": 1},  # not a revocation
        {"signer_seq": True},
    ],
)
def test_bad_chain_fields_are_refused_when_parsed(
    chains: Chains, change: dict[str, object]
) -> None:
    """signer_seq from 1, prev from 2 on, keep_upto only on revocations and level changes."""
    body = chains.rec(FOUNDER, "member.added", ALICE.node_id, 2).to_json()
    del body["sig"]
    body.update(change)
    body["sig"] = FOUNDER.sign_object(body)
    with pytest.raises(BadRequest):
        MembershipRecord.parse(body)


def test_forged_record_refused(chains: Chains) -> None:
    """A record whose signature does not match is refused when parsed."""
    body = genesis(chains).to_json()
    body["name"] = "evil"
    with pytest.raises(InvalidSignature):
        MembershipRecord.parse(body)


def test_single_node_community_created_and_reloaded(tmp_path: Path) -> None:
    """First start founds a one-node community; a restart reads the same one back."""
    store = CommunityStore(tmp_path)
    first = open_membership(store, FOUNDER, name="den", now_ms=5)
    second = open_membership(store, FOUNDER, name="ignored", now_ms=6)
    assert (C, "den", 1, C, "den") == (
        first.community_id,
        first.name,
        len(store.load()),
        second.community_id,
        second.name,
    )


def _revoked_anchor_that_revoked_someone() -> tuple[Membership, KeyPair, KeyPair, KeyPair]:
    """Founder F adds anchor A and member Y; A revokes Y; F then revokes A."""
    founder, anchor, member = (KeyPair.generate() for _ in range(3))
    view = Membership(founder.node_id)
    t = 1_000_000
    view.add_all(
        [view.sign(founder, "community.created", founder.node_id, now_ms=t, name="c")],
        Source.STORE,
    )
    for i, (subject, level) in enumerate(((anchor, Level.ANCHOR), (member, Level.MEMBER))):
        view.add_all(
            [view.sign(founder, "member.added", subject.node_id, now_ms=t + 1 + i, level=level)],
            Source.SUBMIT,
        )
    view.add_all([view.sign(anchor, "member.revoked", member.node_id, now_ms=t + 3)], Source.SUBMIT)
    view.add_all(
        [view.sign(founder, "member.revoked", anchor.node_id, now_ms=t + 4)], Source.SUBMIT
    )
    return view, founder, anchor, member


def test_a_revoked_key_cannot_fork_its_chain_to_undo_a_revocation_it_signed() -> None:
    """A second record at a chain place already held is refused and not stored: revoked A
    signing a record at its signer_seq 1 (where its revocation of Y stands) changes nothing."""
    view, founder, anchor, member = _revoked_anchor_that_revoked_someone()
    fork = MembershipRecord.create(
        anchor,
        "token.revoked",
        founder.node_id,
        founder.node_id,
        now_ms=1_000_010,
        iss=anchor.node_id,
        signer_seq=1,
        prev=None,
    )
    stored_before = len(view.records)
    admission = view.add_all([fork], Source.GOSSIP)
    assert (["bad_request"], stored_before, True, None) == (
        [error.code for _, error in admission.refused],
        len(view.records),
        view.is_revoked(member.node_id),
        view.level_of(member.node_id),
    )


def test_a_revoked_keys_records_past_a_gap_are_refused_not_stored() -> None:
    """Records of a revoked key that wait for a missing one are refused (revoked), so a
    revoked key cannot fill the store."""
    view, founder, anchor, _member = _revoked_anchor_that_revoked_someone()
    junk = [
        MembershipRecord.create(
            anchor,
            "token.revoked",
            founder.node_id,
            founder.node_id,
            now_ms=1_000_010 + i,
            iss=anchor.node_id,
            signer_seq=1000 + i,
            prev="sha256:" + "A" * 43,
        )
        for i in range(20)
    ]
    stored_before = len(view.records)
    admission = view.add_all(junk, Source.GOSSIP)
    assert ({"revoked"}, 0, stored_before) == (
        {error.code for _, error in admission.refused},
        len(admission.accepted),
        len(view.records),
    )


def test_a_later_level_change_at_the_same_keep_upto_wins(chains: Chains) -> None:
    """An anchor raises Alice to trusted, then lowers her to member again before she signed
    anything (both changes keep_upto 0): she is a member. The fold once kept her trusted,
    the higher level, whatever the order: a promotion could not be taken back."""
    g = genesis(chains)
    add = chains.rec(FOUNDER, "member.added", ALICE.node_id, 2)
    up = chains.rec(FOUNDER, "member.level_changed", ALICE.node_id, 3, level=Level.TRUSTED)
    down = chains.rec(FOUNDER, "member.level_changed", ALICE.node_id, 4, level=Level.MEMBER)
    again = chains.rec(FOUNDER, "member.level_changed", ALICE.node_id, 5, level=Level.TRUSTED)
    assert [Level.MEMBER, Level.MEMBER, Level.TRUSTED] == [
        levels(fold(C, [g, add, up, down]))[ALICE.node_id],
        levels(fold(C, [down, up, add, g]))[ALICE.node_id],
        levels(fold(C, [g, add, up, down, again]))[ALICE.node_id],
    ]
