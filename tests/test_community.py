"""The signed membership log and its fold (spec §1.5)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearthnet.community import CommunityStore, Level, Membership, MembershipRecord, open_membership
from hearthnet.errors import BadRequest, InvalidSignature
from hearthnet.identity import KeyPair

FOUNDER = KeyPair.from_seed(b"\x01" * 32)
ALICE = KeyPair.from_seed(b"\x02" * 32)
BOB = KeyPair.from_seed(b"\x03" * 32)
C = FOUNDER.node_id


def rec(signer: KeyPair, kind: str, subject: str, ts: int, **kw: object) -> MembershipRecord:
    """A signed record in the founder's community."""
    return MembershipRecord.create(signer, kind, C, subject, now_ms=ts, **kw)  # type: ignore[arg-type]


def fold(*records: MembershipRecord) -> Membership:
    """Fold records (in any given order) into a view."""
    view = Membership(C)
    for r in records:
        view.add(r)
    return view


GENESIS = rec(FOUNDER, "community.created", C, 1, name="home")


def test_founder_is_anchor() -> None:
    """The community.created record makes the founder an anchor."""
    assert (Level.ANCHOR, "home") == (fold(GENESIS).level_of(C), fold(GENESIS).name)


def test_fold_is_order_independent() -> None:
    """Records applied in any arrival order give the same view (sorted by ts, id)."""
    add_alice = rec(FOUNDER, "member.added", ALICE.node_id, 2, level=Level.TRUSTED)
    add_bob = rec(ALICE, "member.added", BOB.node_id, 3)
    a = fold(GENESIS, add_alice, add_bob)
    b = fold(add_bob, add_alice, GENESIS)
    assert ({C: Level.ANCHOR, ALICE.node_id: Level.TRUSTED, BOB.node_id: Level.MEMBER},) * 2 == (
        {k: v.level for k, v in a.members.items()},
        {k: v.level for k, v in b.members.items()},
    )


def test_member_cannot_add_and_trusted_cannot_add_anchor() -> None:
    """Adding needs anchor or trusted, and never above the signer's own level."""
    add_bob = rec(FOUNDER, "member.added", BOB.node_id, 2)
    bob_adds_alice = rec(BOB, "member.added", ALICE.node_id, 3)
    view = fold(GENESIS, add_bob, bob_adds_alice)
    assert None is view.level_of(ALICE.node_id)
    add_alice_trusted = rec(FOUNDER, "member.added", ALICE.node_id, 4, level=Level.TRUSTED)
    carol = KeyPair.from_seed(b"\x04" * 32)
    alice_adds_anchor = rec(ALICE, "member.added", carol.node_id, 5, level=Level.ANCHOR)
    view = fold(GENESIS, add_alice_trusted, alice_adds_anchor)
    assert None is view.level_of(carol.node_id)


def test_revocation_voids_later_records_of_the_revoked() -> None:
    """A revoked member is gone, and what it signed afterwards has no effect."""
    add_alice = rec(FOUNDER, "member.added", ALICE.node_id, 2, level=Level.TRUSTED)
    revoke = rec(FOUNDER, "member.revoked", ALICE.node_id, 3)
    late_add = rec(ALICE, "member.added", BOB.node_id, 4)
    view = fold(GENESIS, add_alice, revoke, late_add)
    assert (None, True, None) == (
        view.level_of(ALICE.node_id),
        view.is_revoked(ALICE.node_id),
        view.level_of(BOB.node_id),
    )


def test_founder_cannot_be_revoked() -> None:
    """The community's root stays."""
    add_alice = rec(FOUNDER, "member.added", ALICE.node_id, 2, level=Level.ANCHOR)
    revoke_founder = rec(ALICE, "member.revoked", C, 3)
    assert Level.ANCHOR == fold(GENESIS, add_alice, revoke_founder).level_of(C)


def test_token_revocation_by_issuer_or_anchor() -> None:
    """token.revoked is honoured from the issuer or an anchor, not from others."""
    add_alice = rec(FOUNDER, "member.added", ALICE.node_id, 2)
    add_bob = rec(FOUNDER, "member.added", BOB.node_id, 2)
    by_issuer = rec(ALICE, "token.revoked", "jti-1", 3, iss=ALICE.node_id)
    by_other = rec(BOB, "token.revoked", "jti-2", 3, iss=ALICE.node_id)
    by_anchor = rec(FOUNDER, "token.revoked", "jti-3", 3, iss=ALICE.node_id)
    view = fold(GENESIS, add_alice, add_bob, by_issuer, by_other, by_anchor)
    assert [True, False, True] == [
        view.is_token_revoked(ALICE.node_id, j) for j in ("jti-1", "jti-2", "jti-3")
    ]


CHAT = (("chat.**", "member", "member"), ("**", "anchor", "anchor"))


def test_pubsub_rules_from_anchors_only_last_wins_empty_clears() -> None:
    """pubsub.rules (spec §6.9): only anchors set them; in fold order the last one wins,
    whatever the arrival order; an empty list hands the rules back to each node."""
    add_alice = rec(FOUNDER, "member.added", ALICE.node_id, 2, level=Level.TRUSTED)
    first = rec(FOUNDER, "pubsub.rules", C, 3, rules=CHAT)
    by_trusted = rec(ALICE, "pubsub.rules", C, 4, rules=(("**", "any", "any"),))
    second = rec(FOUNDER, "pubsub.rules", C, 5, rules=CHAT[1:])
    clear = rec(FOUNDER, "pubsub.rules", C, 6, rules=())
    assert fold(GENESIS).pubsub_rules is None
    assert fold(GENESIS, add_alice, first, by_trusted).pubsub_rules == CHAT
    assert fold(second, by_trusted, first, add_alice, GENESIS).pubsub_rules == CHAT[1:]
    assert fold(GENESIS, first, second, clear).pubsub_rules is None
    assert MembershipRecord.parse(first.to_json()) == first  # survives the wire


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


def test_rules_only_on_pubsub_rules_records() -> None:
    """Other kinds cannot carry rules, and pubsub.rules needs them."""
    with pytest.raises(BadRequest):
        rec(FOUNDER, "member.added", ALICE.node_id, 2, rules=CHAT)
    with pytest.raises(BadRequest):
        rec(FOUNDER, "pubsub.rules", C, 2)


def test_forged_record_refused() -> None:
    """A record whose signature does not match is refused when parsed."""
    body = GENESIS.to_json()
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
