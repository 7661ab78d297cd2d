"""Authentication: signed calls, signed requests, tokens, session proofs (spec §1.4, §1.6, §2.2)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from hearthnet.auth import Authenticator
from hearthnet.bus.envelope import request_envelope
from hearthnet.caller import Caller
from hearthnet.community import Level
from hearthnet.errors import BadRequest, Expired, InvalidSignature, Replayed, Revoked, Unauthorized
from hearthnet.identity import KeyPair
from hearthnet.ids import new_ulid
from hearthnet.membership import Membership
from hearthnet.replay import ReplayCache
from hearthnet.tokens import CapabilityToken, Scope

NODE = KeyPair.from_seed(b"\x10" * 32)
MEMBER = KeyPair.from_seed(b"\x11" * 32)
STRANGER = KeyPair.from_seed(b"\x12" * 32)
NOW = 1_763_800_000_000


def make_auth() -> tuple[Authenticator, list[str]]:
    """An authenticator for NODE's community with MEMBER added; returns recorded failures."""
    view = Membership(NODE.node_id)
    view.add(view.sign(NODE, "community.created", NODE.node_id, now_ms=1))
    view.add(view.sign(NODE, "member.added", MEMBER.node_id, now_ms=2))
    failures: list[str] = []
    return Authenticator(
        node_id=NODE.node_id, membership=view, replay=ReplayCache(), on_failure=failures.append
    ), failures


def envelope(keys: KeyPair, ts: int = NOW, **over: Any) -> dict[str, Any]:
    """A call envelope from ``keys``."""
    env = {
        "body": {"input": {"x": 1}},
        "capability": "echo",
        "version": "1.0",
        "request_id": new_ulid(ts),
        "from": keys.node_id,
        "community": NODE.node_id,
        "ts": ts,
    }
    env.update(over)
    return env


def test_signed_call_from_member_verifies() -> None:
    """A member's correctly signed call becomes a VerifiedCall with its level."""
    auth, failures = make_auth()
    env = envelope(MEMBER)
    call = auth.authenticate_call(env, signature=MEMBER.sign_object(env), token=None, now_ms=NOW)
    assert (MEMBER.node_id, Level.MEMBER, False, []) == (
        call.caller.identity,
        call.caller.level,
        call.caller.is_self,
        failures,
    )


@pytest.mark.parametrize(
    ("case", "error", "reason"),
    [
        ("bad_signature", InvalidSignature, "bad_signature"),
        ("stale", Expired, "expired"),
        ("future", Expired, "expired"),
        ("stranger", Unauthorized, "not_member"),
        ("other_community", Unauthorized, "wrong_community"),
    ],
)
def test_refusals_have_their_codes_and_are_counted(
    case: str, error: type[Exception], reason: str
) -> None:
    """Each kind of bad credential gets its wire code and one counted reason."""
    auth, failures = make_auth()
    keys = STRANGER if case == "stranger" else MEMBER
    ts = {"stale": NOW - 61_000, "future": NOW + 61_000}.get(case, NOW)
    env = envelope(keys, ts)
    if case == "other_community":
        env["community"] = STRANGER.node_id
    sig = keys.sign_object(env)
    if case == "bad_signature":
        sig = MEMBER.sign_object({**env, "ts": ts + 1})
    with pytest.raises(error):
        auth.authenticate_call(env, signature=sig, token=None, now_ms=NOW)
    assert [reason] == failures


def test_replayed_request_id_refused() -> None:
    """The same signed call twice: the second is replayed."""
    auth, failures = make_auth()
    env = envelope(MEMBER)
    sig = MEMBER.sign_object(env)
    auth.authenticate_call(env, signature=sig, token=None, now_ms=NOW)
    with pytest.raises(Replayed):
        auth.authenticate_call(env, signature=sig, token=None, now_ms=NOW + 1000)
    assert ["replayed"] == failures


def test_bad_signature_does_not_poison_replay_cache() -> None:
    """An unsigned attempt with a victim's request id does not block the real call."""
    auth, _ = make_auth()
    env = envelope(MEMBER)
    with pytest.raises(InvalidSignature):
        auth.authenticate_call(env, signature="ed25519:" + "A" * 86, token=None, now_ms=NOW)
    auth.authenticate_call(env, signature=MEMBER.sign_object(env), token=None, now_ms=NOW)


@pytest.mark.parametrize(
    "env",
    [
        None,
        [],
        {"body": {}},
        {**envelope(MEMBER), "extra": 1},
        {**envelope(MEMBER), "request_id": "nope"},
        {**envelope(MEMBER), "ts": "1"},
        {**envelope(MEMBER), "body": []},
    ],
)
def test_malformed_envelopes_are_bad_requests(env: Any) -> None:
    """Structurally wrong envelopes are bad_request before any crypto."""
    auth, _ = make_auth()
    with pytest.raises(BadRequest):
        auth.authenticate_call(env, signature="ed25519:x", token=None, now_ms=NOW)


def test_token_call_checks_scope_expiry_and_revocation() -> None:
    """A token caller carries its scopes; expired and revoked tokens are refused."""
    auth, failures = make_auth()
    token = CapabilityToken.issue(
        MEMBER, community=NODE.node_id, scopes=[Scope.parse("call:echo")], ttl_ms=60_000, now_ms=NOW
    )
    env = envelope(MEMBER)
    del env["from"]
    call = auth.authenticate_call(env, signature=None, token=token.encode(), now_ms=NOW)
    assert (True, False) == (
        call.caller.may_call("echo", "1.0", Level.MEMBER),
        call.caller.may_call("llm.chat", "2.0", Level.MEMBER),
    )
    with pytest.raises(Expired):
        auth.authenticate_call(env, signature=None, token=token.encode(), now_ms=NOW + 60_000)
    auth.membership.add(
        auth.membership.sign(NODE, "token.revoked", token.jti, now_ms=3, iss=MEMBER.node_id)
    )
    with pytest.raises(Revoked):
        auth.authenticate_call(env, signature=None, token=token.encode(), now_ms=NOW)
    assert ["token_expired", "revoked"] == failures


def test_sessions_of_one_token_share_its_caller_until_its_issuer_changes_level() -> None:
    """One verified token text gives one Caller to every session; a new level a new one."""
    auth, _ = make_auth()
    trusted = KeyPair.from_seed(b"\x13" * 32)
    view = auth.membership
    view.add(view.sign(NODE, "member.added", trusted.node_id, now_ms=3, level=Level.TRUSTED))
    text = CapabilityToken.issue(
        trusted, community=NODE.node_id, scopes=[Scope.parse("sub:a.**")], ttl_ms=60_000, now_ms=NOW
    ).encode()
    first = auth.authenticate_session({"token": text}, NOW)
    again = auth.authenticate_session({"token": text}, NOW)
    view.add(view.sign(NODE, "member.level_changed", trusted.node_id, now_ms=4, level=Level.MEMBER))
    demoted = auth.authenticate_session({"token": text}, NOW)
    assert (True, Level.TRUSTED, Level.MEMBER, False) == (
        first is again,
        first.level,
        demoted.level,
        demoted is first,
    )


def test_a_members_calls_share_its_caller_until_membership_changes() -> None:
    """Signed calls of one member reuse one Caller while its level holds; a new level
    gives a new one, and a revocation refuses the next call."""
    auth, failures = make_auth()
    view = auth.membership

    def call() -> Caller:
        env = envelope(MEMBER)
        verified = auth.authenticate_call(
            env, signature=MEMBER.sign_object(env), token=None, now_ms=NOW
        )
        return verified.caller

    first, again = call(), call()
    view.add(view.sign(NODE, "member.level_changed", MEMBER.node_id, now_ms=3, level=Level.TRUSTED))
    promoted = call()
    view.add(view.sign(NODE, "member.revoked", MEMBER.node_id, now_ms=4))
    with pytest.raises(Revoked):
        call()
    assert (True, False, Level.TRUSTED, ["revoked"]) == (
        first is again,
        promoted is first,
        promoted.level,
        failures,
    )


def test_token_from_non_member_refused() -> None:
    """Only members can issue tokens."""
    auth, _ = make_auth()
    token = CapabilityToken.issue(
        STRANGER,
        community=NODE.node_id,
        scopes=[Scope.parse("call:echo")],
        ttl_ms=60_000,
        now_ms=NOW,
    )
    with pytest.raises(Unauthorized):
        auth.caller_for_token(token.encode(), NOW)


def test_signed_request_envelope() -> None:
    """A non-call request signed over {method, path, body, ...} verifies; another path does not."""
    auth, _ = make_auth()
    rid = new_ulid(NOW)
    env = request_envelope(
        method="POST",
        path="/pubsub/v1/topics/a/messages",
        body={"d": 1},
        request_id=rid,
        sender=MEMBER.node_id,
        community=NODE.node_id,
        ts=NOW,
    )
    sig = MEMBER.sign_object(env)

    def authenticate(path: str) -> Caller:
        return auth.authenticate_request(
            method="POST",
            path=path,
            body={"d": 1},
            request_id=rid,
            sender=MEMBER.node_id,
            community=NODE.node_id,
            ts=NOW,
            signature=sig,
            token=None,
            now_ms=NOW,
        )

    with pytest.raises(InvalidSignature):
        authenticate("/pubsub/v1/topics/b/messages")
    assert MEMBER.node_id == authenticate("/pubsub/v1/topics/a/messages").identity


def test_session_auth_proof_is_bound_to_this_node_and_single_use() -> None:
    """A WS auth proof names the server; reusing its nonce is a replay."""
    auth, _ = make_auth()
    proof = {"identity": MEMBER.node_id, "ts": NOW, "nonce": "n0nce-123", "node": NODE.node_id}
    frame = {**proof, "sig": MEMBER.sign_object(proof)}
    del frame["node"]
    assert MEMBER.node_id == auth.authenticate_session(frame, NOW).identity
    with pytest.raises(Replayed):
        auth.authenticate_session(frame, NOW)
    wrong = {**proof, "node": STRANGER.node_id}
    with pytest.raises(InvalidSignature):
        auth.authenticate_session(
            {**frame, "nonce": "other-nonce", "sig": MEMBER.sign_object(wrong)}, NOW
        )


def test_a_callers_owner_is_made_once_and_outside_its_equality() -> None:
    """A token caller's owner is ``token:<iss>/<sub>`` for every token of that pair, a
    member's its identity; replace() makes it anew, and equality ignores it."""
    scopes = [Scope.parse("pub:a.**")]
    tokens = [
        CapabilityToken.issue(
            MEMBER, community=NODE.node_id, scopes=scopes, ttl_ms=60_000, now_ms=now, sub="kit"
        )
        for now in (NOW, NOW + 1)
    ]
    callers = [Caller(t.identity, "token", Level.MEMBER, t) for t in tokens]
    member = Caller(MEMBER.node_id, "node", Level.MEMBER)
    as_token = dataclasses.replace(member, kind="token", token=tokens[0])
    assert [f"token:{MEMBER.node_id}/kit"] * 3 + [MEMBER.node_id] == [
        c.owner for c in [*callers, as_token, member]
    ]
    assert (True, False) == (member == dataclasses.replace(member), member == as_token)
