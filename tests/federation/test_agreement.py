"""Federation agreements, revocations and every decision about them (spec §8). Pure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hearthnet.community import Level, MembershipRecord
from hearthnet.errors import BadRequest, Forbidden, InvalidSignature, Unauthorized
from hearthnet.federation.agreement import Agreement, Grant, Revocation
from hearthnet.federation.view import FederationView
from hearthnet.identity import KeyPair
from hearthnet.membership import Membership, Source
from hearthnet.pubsub.topics import TopicPattern

NOW = 1_800_000_000_000
DAY = 86_400_000
A, B, C = (KeyPair.from_seed(bytes([i]) * 32) for i in (1, 2, 3))
A2, B_MEMBER, STRANGER = (KeyPair.from_seed(bytes([i]) * 32) for i in (4, 5, 6))


def community(founder: KeyPair, *members: tuple[KeyPair, Level]) -> Membership:
    """A community founded by ``founder`` with ``members`` added by it."""
    view = Membership(founder.node_id)
    genesis = MembershipRecord.create(
        founder,
        "community.created",
        founder.node_id,
        founder.node_id,
        now_ms=NOW - DAY,
        name="c",
        signer_seq=1,
        prev=None,
    )
    view.add_all([genesis], Source.STORE)
    for keys, level in members:
        view.add(view.sign(founder, "member.added", keys.node_id, now_ms=NOW - DAY, level=level))
    return view


A_GRANTS_B = Grant(("chat.**",), ("echo@1",))
B_GRANTS_A = Grant(("news.*",), ())


def agreement(
    a_grants_b: Grant = A_GRANTS_B,
    b_grants_a: Grant = B_GRANTS_A,
    *,
    signer_a: KeyPair = A,
    signer_b: KeyPair = B,
    expires_ms: int = NOW + DAY,
    agreement_id: str = "01JZ0000000000000000000000",
    bridges_b: tuple[str, ...] = (),
) -> Agreement:
    """An agreement between A's and B's communities, signed by both."""
    proposal = Agreement.propose(
        signer_a,
        agreement_id=agreement_id,
        community_a=A.node_id,
        community_b=B.node_id,
        a_grants_b=a_grants_b,
        b_grants_a=b_grants_a,
        now_ms=NOW,
        expires_ms=expires_ms,
        bridges_b=bridges_b,
    )
    return proposal.countersign(signer_b)


def view_of_a(*agreements: Agreement) -> FederationView:
    """A's node: A's membership, B's records known, the agreements held."""
    view = FederationView(community(A, (A2, Level.ANCHOR)))
    for item in agreements:
        view.add_agreement(item)
    b = community(B, (B_MEMBER, Level.MEMBER))
    view.add_foreign_records(B.node_id, list(b.records.values()))
    return view


def test_agreement_round_trips_and_verifies() -> None:
    """parse(to_json()) gives the same agreement, both signatures checked."""
    signed = agreement()
    assert (True, signed) == (signed.complete, Agreement.parse(signed.to_json()))


def test_proposal_carries_one_signature() -> None:
    """A proposal parses without sig_b and is not complete."""
    proposal = Agreement.parse(
        {k: v for k, v in agreement().to_json().items() if k not in ("signer_b", "sig_b")}
    )
    assert (False, None) == (proposal.complete, proposal.signer_b)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("expires_ms", NOW + 2 * DAY),
        ("a_grants_b", {"topics": ["chat.**", "news.**"], "capabilities": []}),
        ("community_b", C.node_id),
    ],
)
def test_changed_terms_break_the_signatures(field: str, value: object) -> None:
    """Any change to the terms is refused: widening a grant, extending, re-targeting."""
    obj = agreement().to_json()
    obj[field] = value
    with pytest.raises(InvalidSignature):
        Agreement.parse(obj)


@pytest.mark.parametrize(
    "grant",
    [
        {"topics": ["bad..topic"], "capabilities": []},
        {"topics": [], "capabilities": ["echo@x"]},
        {"topics": ["a"] * 33, "capabilities": []},
        {"topics": []},
        {"topics": ["**"], "capabilities": []},  # would reach mesh.*
        {"topics": ["mesh.beacon"], "capabilities": []},
        {"topics": ["node.*.inbox"], "capabilities": []},
    ],
)
def test_malformed_grants_refused(grant: object) -> None:
    """Bad patterns, bad names, too many items, missing keys and patterns reaching the
    community-internal topics (mesh.*, inboxes) are bad_request."""
    with pytest.raises(BadRequest):
        Grant.parse(grant)


def test_revocation_round_trips() -> None:
    """A revocation verifies; a tampered one does not."""
    revocation = Revocation.create(B, "01JZ0000000000000000000000", NOW)
    obj = revocation.to_json()
    assert revocation == Revocation.parse(obj)
    with pytest.raises(InvalidSignature):
        Revocation.parse({**obj, "ts": NOW + 1})


FORWARD_TABLE = [
    # (topic, from, to, expected)
    ("chat.room1", A, B, True),
    ("chat.room1.sub", A, B, True),
    ("chatter", A, B, False),
    ("news.today", A, B, False),  # granted by B to A, not by A to B
    ("news.today", B, A, True),
    ("news.today.late", B, A, False),  # news.* is one segment
    ("chat.room1", B, A, False),
    ("chat.room1", A, A, True),  # within a community: not federation's business
]


@pytest.mark.parametrize(("topic", "src", "dst", "expected"), FORWARD_TABLE)
def test_may_forward_follows_the_grants(
    topic: str, src: KeyPair, dst: KeyPair, expected: bool
) -> None:
    """Only topics a community granted flow, in the direction granted."""
    view = view_of_a(agreement())
    assert expected == view.may_forward(topic, src.node_id, dst.node_id, NOW)


@pytest.mark.parametrize(
    ("name", "version", "expected"),
    [
        ("echo", "1.0", True),
        ("echo", "1.3", True),
        ("echo", "2.0", False),
        ("llm.chat", "2.0", False),
    ],
)
def test_may_call_follows_the_grants(name: str, version: str, expected: bool) -> None:
    """B's members may call what A granted them (echo@1), nothing else."""
    assert expected == view_of_a(agreement()).may_call(name, version, B.node_id, NOW)


def test_expiry_revocation_and_a_demoted_signer_end_an_agreement() -> None:
    """Expired, revoked, or signed by someone who is no longer an anchor: nothing flows."""
    expired = view_of_a(agreement(expires_ms=NOW + 10))
    revoked = view_of_a(agreement())
    revoked.add_revocation(Revocation.create(B, agreement().id, NOW))
    demoted = view_of_a(agreement(signer_a=A2))
    record = demoted.membership.sign(A, "member.revoked", A2.node_id, now_ms=NOW)
    demoted.membership.add(record)
    allowed = [
        v.may_forward("chat.x", A.node_id, B.node_id, NOW + 10) for v in (expired, revoked, demoted)
    ]
    assert [False, False, False] == allowed


def test_an_anchor_that_is_not_the_founder_may_sign() -> None:
    """A2 (an anchor added by A's founder) signs for A; the agreement is in force."""
    view = view_of_a(agreement(signer_a=A2))
    assert "in_force" == view.status(agreement(signer_a=A2), NOW)
    assert view.may_forward("chat.x", A.node_id, B.node_id, NOW)


def test_a_member_that_is_not_an_anchor_signs_nothing_in_force() -> None:
    """B_MEMBER's counter-signature does not make an agreement (it stays unverified)."""
    view = view_of_a(agreement(signer_b=B_MEMBER))
    assert ("unverified", False) == (
        view.status(agreement(signer_b=B_MEMBER), NOW),
        view.may_forward("chat.x", A.node_id, B.node_id, NOW),
    )


def test_revocation_by_a_stranger_refused() -> None:
    """Only an anchor of either community revokes."""
    view = view_of_a(agreement())
    with pytest.raises(Unauthorized):
        view.add_revocation(Revocation.create(STRANGER, agreement().id, NOW))
    assert "in_force" == view.status(agreement(), NOW)


def test_federated_caller_gets_the_grant_and_nothing_else() -> None:
    """A member of B gets A's grant; a stranger claiming B is refused; revoked: forbidden."""
    view = view_of_a(agreement())
    peer = view.federated_caller(B_MEMBER.node_id, B.node_id, NOW)
    assert Grant(("chat.**",), ("echo@1",)) == peer.grant
    with pytest.raises(Unauthorized):
        view.federated_caller(STRANGER.node_id, B.node_id, NOW)
    view.add_revocation(Revocation.create(A, agreement().id, NOW))
    with pytest.raises(Forbidden):
        view.federated_caller(B_MEMBER.node_id, B.node_id, NOW)


def test_gossip_accepts_foreign_origins_only_on_granted_topics() -> None:
    """B's node may originate news.* here (granted to A), not chat.* and not strangers."""
    view = view_of_a(agreement())
    got = [
        view.accepts_origin(B.node_id, "news.today", NOW),
        view.accepts_origin(B.node_id, "chat.room", NOW),
        view.accepts_origin(STRANGER.node_id, "news.today", NOW),
    ]
    assert [True, False, False] == got


def test_agreements_between_other_communities_and_proposals_are_not_held() -> None:
    """A node holds complete agreements its own community is party to."""
    view = FederationView(community(A))
    proposal = Agreement.parse(
        {k: v for k, v in agreement().to_json().items() if k not in ("signer_b", "sig_b")}
    )
    other = Agreement.propose(
        B,
        agreement_id="01JZ0000000000000000000001",
        community_a=B.node_id,
        community_b=C.node_id,
        a_grants_b=Grant(),
        b_grants_a=Grant(),
        now_ms=NOW,
        expires_ms=NOW + DAY,
    ).countersign(C)
    for item in (proposal, other):
        with pytest.raises(BadRequest):
            view.add_agreement(item)
    assert {} == view.agreements


SEGMENT = st.sampled_from(["chat", "news", "a", "b", "x1"])
TOPICS = st.lists(SEGMENT, min_size=1, max_size=4).map(".".join)


@given(topic=TOPICS, patterns=st.lists(TOPICS | TOPICS.map(lambda t: t + ".**"), max_size=3))
def test_forwarding_matches_the_topic_pattern_matcher(topic: str, patterns: list[str]) -> None:
    """may_forward(A→B) is exactly: some granted pattern matches the topic."""
    view = FederationView(community(A))
    view.add_agreement(agreement(Grant(tuple(patterns), ())))
    expected = any(TopicPattern.parse(p).matches(topic) for p in patterns)
    assert expected == view.may_forward(topic, A.node_id, B.node_id, NOW)


def test_relays_serve_a_federated_member_only_while_an_agreement_is_in_force() -> None:
    """in_force_community: B's member while the agreement holds; none after its expiry,
    after a revocation, and never for a stranger (spec §8: relays and bridges)."""
    signed = agreement(expires_ms=NOW + DAY)
    view = view_of_a(signed)
    before = [view.in_force_community(n.node_id, NOW) for n in (B_MEMBER, B, STRANGER)]
    expired = view.in_force_community(B_MEMBER.node_id, NOW + DAY)
    view.add_revocation(Revocation.create(A, signed.id, NOW + 1))
    assert ([B.node_id, B.node_id, None], None, None) == (
        before,
        expired,
        view.in_force_community(B_MEMBER.node_id, NOW + 2),
    )


def test_named_bridges_are_signed_terms_and_only_they_bridge() -> None:
    """bridges_b round-trips and is signed (dropping it breaks both signatures);
    bridge_community names B's member only while it is a named bridge in force."""
    signed = agreement(bridges_b=(B_MEMBER.node_id,))
    view = view_of_a(signed)
    bridges = [view.bridge_community(n.node_id, NOW) for n in (B_MEMBER, B, STRANGER)]
    unnamed = {k: v for k, v in signed.to_json().items() if k != "bridges_b"}
    with pytest.raises(InvalidSignature):
        Agreement.parse(unnamed)
    view.add_revocation(Revocation.create(A, signed.id, NOW + 1))
    assert (signed, [B.node_id, None, None], None) == (
        Agreement.parse(signed.to_json()),
        bridges,
        view.bridge_community(B_MEMBER.node_id, NOW + 2),
    )


@pytest.mark.parametrize("bridges", [["not-a-node"], [A.node_id, A.node_id], "x", [A.node_id] * 17])
def test_malformed_bridges_refused(bridges: object) -> None:
    """bridges_a is a list of at most 16 distinct NodeIDs."""
    with pytest.raises(BadRequest, match="bridges_a"):
        Agreement.parse({**agreement().to_json(), "bridges_a": bridges})
