"""Invites and admission (spec §1.5). Pure."""

from __future__ import annotations

import pytest

from hearthnet.community import Level, MembershipRecord
from hearthnet.errors import Expired, InvalidSignature, Revoked, Unauthorized
from hearthnet.identity import KeyPair
from hearthnet.ids import b64url_encode
from hearthnet.membership import Membership, Source
from hearthnet.mesh.admission import (
    Invite,
    admit,
    answer_source,
    join_request,
    sign_join_answer,
)

FOUNDER = KeyPair.from_seed(b"\x81" * 32)
MEMBER = KeyPair.from_seed(b"\x82" * 32)
NEW = KeyPair.from_seed(b"\x83" * 32)
NOW = 1_763_800_000_000


BASE = Membership(FOUNDER.node_id)
BASE.add(BASE.sign(FOUNDER, "community.created", FOUNDER.node_id, now_ms=1))
BASE.add(BASE.sign(FOUNDER, "member.added", MEMBER.node_id, now_ms=2))


def view(*extra: MembershipRecord) -> Membership:
    """The founder's community with MEMBER at member level."""
    m = Membership(FOUNDER.node_id)
    m.add_all(list(BASE.records.values()), Source.STORE)
    for r in extra:
        m.add(r)
    return m


def invite(
    by: KeyPair = FOUNDER, level: Level = Level.MEMBER, ttl: int = 60_000, nonce: str = "nonce-0001"
) -> Invite:
    """An invite."""
    return Invite.issue(
        by,
        community=FOUNDER.node_id,
        level=level,
        ttl_ms=ttl,
        now_ms=NOW,
        bootstrap=["http://127.0.0.1:7080"],
        nonce=nonce,
    )


def test_invite_round_trip_and_admission() -> None:
    """hn1: decodes; a valid join request yields a member.added naming the nonce."""
    inv = invite()
    record = admit(
        FOUNDER,
        view(),
        join_request(NEW, Invite.decode(inv.encode()), name="attic", now_ms=NOW),
        NOW,
    )
    membership = view(record)
    assert (NEW.node_id, "nonce-0001", Level.MEMBER) == (
        record.subject,
        record.invite,
        membership.level_of(NEW.node_id),
    )


def test_an_invite_works_once_mesh_wide() -> None:
    """A second member.added with the same invite nonce is ignored by every fold."""
    first = admit(FOUNDER, view(), join_request(NEW, invite(), name="a", now_ms=NOW), NOW)
    other = KeyPair.generate()
    sneaky = view(first).sign(
        FOUNDER, "member.added", other.node_id, now_ms=NOW + 1, invite="nonce-0001"
    )
    folded = view(first, sneaky)
    with pytest.raises(Unauthorized):
        admit(FOUNDER, view(first), join_request(other, invite(), name="b", now_ms=NOW), NOW)
    assert None is folded.level_of(other.node_id)


@pytest.mark.parametrize(
    ("case", "error"),
    [
        ("expired", Expired),
        ("member invites", Unauthorized),
        ("forged", InvalidSignature),
        ("stale request", Expired),
        ("revoked joiner", Revoked),
        ("wrong key signs", InvalidSignature),
    ],
)
def test_refusals(case: str, error: type[Exception]) -> None:
    """Expired or forged invites, invites by plain members, stale or misdirected requests."""
    extra: list[MembershipRecord] = []
    inv = (
        invite(by=MEMBER)
        if case == "member invites"
        else invite(ttl=-1 if case == "expired" else 60_000)
    )
    request = join_request(
        NEW, inv, name="x", now_ms=NOW - 120_000 if case == "stale request" else NOW
    )
    if case == "forged":
        request["invite"] = inv.encode()[:-6] + "AAAAAA"
    if case == "wrong key signs":
        request["sig"] = MEMBER.sign_object({k: v for k, v in request.items() if k != "sig"})
    if case == "revoked joiner":
        extra.append(view().sign(FOUNDER, "member.revoked", NEW.node_id, now_ms=3))
    with pytest.raises(error):
        admit(FOUNDER, view(*extra), request, NOW)


def test_only_trusted_nodes_admit() -> None:
    """A bootstrap node that is a plain member cannot sign the member.added record."""
    with pytest.raises(Unauthorized):
        admit(MEMBER, view(), join_request(NEW, invite(), name="x", now_ms=NOW), NOW)


@pytest.mark.parametrize("payload", [b"[" * 1500 + b"]" * 1500, b'{"expires_ms": Infinity}'])
def test_malformed_invite_json_is_invalid_signature(payload: bytes) -> None:
    """An invite nested deeper than the recursion limit, or with non-JSON numbers, is
    invalid_signature, never a crash."""
    with pytest.raises(InvalidSignature):
        Invite.decode("hn1:" + b64url_encode(payload))


def test_an_invite_carries_relay_urls_under_its_signature() -> None:
    """Relay URLs round-trip through hn1:; changing them breaks the signature."""
    inv = Invite.issue(
        FOUNDER,
        community=FOUNDER.node_id,
        level=Level.MEMBER,
        ttl_ms=60_000,
        now_ms=NOW,
        bootstrap=["http://127.0.0.1:7080"],
        nonce="nonce-0009",
        relays=["http://relay.example:7080"],
    )
    forged = {**inv.to_json(), "relays": ["http://elsewhere.example:7080"]}
    with pytest.raises(InvalidSignature):
        Invite.from_json(forged)
    assert (("http://relay.example:7080",), ()) == (
        Invite.decode(inv.encode()).relays,
        invite().relays,
    )


def test_a_join_answer_is_trusted_as_far_as_its_signer() -> None:
    """Signed by the inviter for this join: as its store; by another node: as the network;
    altered, or signed for another join: invalid_signature."""
    inv = invite()
    record = admit(FOUNDER, view(), join_request(NEW, inv, name="n", now_ms=NOW), NOW)
    answer = sign_join_answer(FOUNDER, {"community": FOUNDER.node_id, "records": []}, record)
    by_member = sign_join_answer(MEMBER, {"records": []}, record)
    outcomes: list[object] = [
        answer_source(answer, inv, NEW.node_id),
        answer_source(by_member, inv, NEW.node_id),
    ]
    for bad, node in (({**answer, "records": [{}]}, NEW.node_id), (answer, MEMBER.node_id)):
        with pytest.raises(InvalidSignature) as caught:
            answer_source(bad, inv, node)
        outcomes.append(caught.value.code)
    assert [Source.STORE, Source.JOIN, "invalid_signature", "invalid_signature"] == outcomes
