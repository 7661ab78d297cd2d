"""Fuzzing the membership edges of a live node: signed records (membership, levels,
revocations, token revocations, rules) and join requests posted over HTTP (spec §1.5,
§1.6).

The node's community here: the anchor (the node), the fuzzer's member, and a member the
anchor revoked. Records come validly signed by every kind of signer, backdated or not,
with hostile fields; forged invites come from strangers. Only the anchor's own records
may change who is a member, nothing from a stranger may be stored, and the member's
token keeps working unless its issuer or an anchor revoked it.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hearthnet.clock import now_ms
from hearthnet.community import RECORD_KINDS, CommunityStore, Level, MembershipRecord
from hearthnet.identity import KeyPair
from hearthnet.ids import new_ulid
from hearthnet.mesh.admission import Invite
from tests.fuzz.budget import budget
from tests.fuzz.live import LiveNode
from tests.fuzz.strategies import edge_ints, json_text, json_values, odd_text
from tests.helpers import run_cli

REVOKEE_SEED = b"\x52" * 32
HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


@pytest.fixture(scope="module")
def revokee(live: LiveNode) -> KeyPair:
    """A member the anchor added and then revoked (its later records are void)."""
    keys = KeyPair.from_seed(REVOKEE_SEED)
    enrol_revokee(live, keys)
    return keys


def enrol_revokee(live: LiveNode, keys: KeyPair) -> None:
    """Add ``keys`` as a trusted member, then revoke it, as the anchor; remember the span
    of time in which it was a member (``live.revokee_span``)."""
    if keys.node_id in live.granted_revoked:
        return
    # Trusted from just after the community's creation until now: a record the revoked
    # key dates inside that span is what its ts must not buy (spec §1.5).
    created = min(r.ts for r in CommunityStore(live.data_dir).load())
    added, revoked = created + 1, now_ms()
    for kind, level, ts in (
        ("member.added", Level.TRUSTED, added),
        ("member.revoked", None, revoked),
    ):
        # keep_upto: the revokee's chain is empty, so every record it signs is past it
        live.add_record(live.view().sign(live.anchor, kind, keys.node_id, now_ms=ts, level=level))
    live.revokee_span = (added, revoked)  # type: ignore[attr-defined]
    live.expected_revoked.add(keys.node_id)
    live.granted_revoked.add(keys.node_id)


def signed_record(signer: KeyPair, fields: dict[str, Any]) -> dict[str, Any]:
    """A record with ``fields``, validly signed by ``signer`` where JCS can sign it."""
    body = {
        "id": new_ulid(),
        "kind": "member.added",
        "community": fields.pop("community"),
        "subject": signer.node_id,
        "by": signer.node_id,
        "ts": now_ms(),
        **fields,
    }
    body.pop("sig", None)
    try:
        body["sig"] = signer.sign_object(body)
    except Exception:
        body["sig"] = "ed25519:" + "A" * 86
    return body


@functools.cache
def record_fields(
    live: LiveNode, generation: int, revokee: KeyPair
) -> st.SearchStrategy[dict[str, Any]]:
    """Record fields: every kind, subjects that matter, levels, times from the past to the
    future, and hostile extras. Made once per node ``generation`` (a node restarted after
    a crash is another community), not per input: building it costs more than an input."""
    people = [live.stranger.node_id, live.member.node_id, live.anchor.node_id, revokee.node_id]
    return st.fixed_dictionaries(
        {
            "community": st.one_of(st.just(live.community), odd_text, st.just(live.member.node_id)),
            "kind": st.one_of(st.sampled_from(sorted(RECORD_KINDS)), odd_text),
            "subject": st.one_of(st.sampled_from(people), odd_text, st.builds(new_ulid)),
        },
        optional={
            "level": st.one_of(st.sampled_from(["member", "trusted", "anchor"]), odd_text),
            "ts": st.one_of(
                st.integers(min_value=-2 * HOUR_MS, max_value=2 * HOUR_MS).map(
                    lambda d: now_ms() + d
                ),
                st.just(0),
                edge_ints,
            ),
            "iss": st.sampled_from(people),
            "invite": odd_text,
            "name": st.one_of(odd_text, json_values()),
            "role": odd_text,
            "rules": st.one_of(
                st.just([{"pattern": "**", "subscribe": "any", "publish": "any"}]),
                json_values(),
            ),
            "signer_seq": st.one_of(st.integers(min_value=-1, max_value=5), edge_ints),
            "prev": odd_text,
            "zzz": json_values(),
        },
    )


def post_records(live: LiveNode, records: list[Any]) -> tuple[int, Any]:
    """POST records to the node as anyone may."""
    return live.run(
        live.request(
            "POST",
            "/mesh/v1/membership",
            data=json_text({"records": records}),
            headers={"Content-Type": "application/json"},
        )
    )


def token_still_works(live: LiveNode) -> None:
    """The member's token answers echo (nobody without the right revoked it)."""
    envelope = {"capability": "echo", "version": "1.0"}
    status, answer = live.run(
        live.request(
            "POST",
            "/bus/v1/call",
            data=orjson.dumps({"input": "token"}),
            headers={
                "Content-Type": "application/json",
                "X-HearthNet-Capability": envelope["capability"],
                "X-HearthNet-Capability-Version": envelope["version"],
                "X-HearthNet-Token": live.token,
            },
        )
    )
    assert (200, {"echo": "token"}) == (status, answer["output"])


@budget(300)
@given(data=st.data())
def test_signed_records(live: LiveNode, revokee: KeyPair, data: st.DataObject) -> None:
    """Validly signed records from strangers, members and revoked members change nothing."""
    live.ensure_running()
    enrol_revokee(live, revokee)
    signers = {"stranger": live.stranger, "member": live.member, "revokee": revokee}
    batch = data.draw(
        st.lists(
            st.tuples(
                st.sampled_from(sorted(signers)), record_fields(live, live.generation, revokee)
            ),
            min_size=1,
            max_size=5,
        ),
        label="records",
    )
    records = [signed_record(signers[who], dict(fields)) for who, fields in batch]
    post_records(live, records)
    live.check("membership records", len(records))
    token_still_works(live)


@budget(80)
@given(
    body=st.one_of(
        json_values(),
        st.fixed_dictionaries({"records": json_values()}),
        st.fixed_dictionaries({"records": st.lists(json_values(), max_size=5)}),
        st.just({"records": [{}] * 1001}),
        st.binary(max_size=64),
    )
)
def test_membership_bodies(live: LiveNode, body: Any) -> None:
    """Any body on POST /mesh/v1/membership: a JSON answer, nothing stored."""
    live.ensure_running()
    raw = body if isinstance(body, bytes) else json_text(body)
    live.run(
        live.request(
            "POST", "/mesh/v1/membership", data=raw, headers={"Content-Type": "application/json"}
        )
    )
    live.check("membership bodies")


@budget(20)
@given(
    position=st.floats(0, 1),
    level=st.sampled_from(list(Level)),
    length=st.integers(min_value=1, max_value=3),
)
def test_revoked_member_backdated_add(
    live: LiveNode, revokee: KeyPair, position: float, level: Level, length: int
) -> None:
    """A revoked trusted member's chain of member.added records, dated back into its time
    as a member and placed past its keep_upto, is void: nobody is added, nothing stored."""
    live.ensure_running()
    enrol_revokee(live, revokee)
    added, revoked = live.revokee_span  # type: ignore[attr-defined]
    ts = added + 1 + int(position * max(0, revoked - added - 2))
    chain: list[MembershipRecord] = []
    for seq in range(1, length + 1):
        chain.append(
            MembershipRecord.create(
                revokee,
                "member.added",
                live.community,
                KeyPair.generate().node_id if seq > 1 else live.stranger.node_id,
                now_ms=ts,
                level=level,
                signer_seq=seq,
                prev=chain[-1].digest if chain else None,
            )
        )
    status, body = post_records(live, [record.to_json() for record in chain])
    assert (403, "revoked") == (status, body["error"]), body
    live.check("membership backdated", len(chain))


@budget(80)
@given(
    inviter=st.sampled_from(["stranger", "member"]),
    level=st.sampled_from(list(Level)),
    ttl_ms=st.integers(min_value=-HOUR_MS, max_value=HOUR_MS),
    tamper=st.dictionaries(
        st.sampled_from(["invite", "node", "name", "community", "ts", "sig", "zzz"]),
        st.one_of(odd_text, json_values()),
        max_size=2,
    ),
)
def test_join_requests(
    live: LiveNode, inviter: str, level: Level, ttl_ms: int, tamper: dict[str, Any]
) -> None:
    """Invites from non-anchors and tampered join requests add nobody."""
    live.ensure_running()
    keys = live.stranger if inviter == "stranger" else live.member
    joiner = live.stranger
    issued = now_ms()
    invite = Invite.issue(
        keys,
        community=live.community,
        level=level,
        ttl_ms=max(ttl_ms, 1),
        now_ms=issued if ttl_ms > 0 else issued - HOUR_MS,
        bootstrap=[live.url],
        nonce=new_ulid(),
    )
    request: dict[str, Any] = {
        "invite": invite.encode(),
        "node": joiner.node_id,
        "name": "joiner",
        "community": live.community,
        "ts": now_ms(),
    }
    request["sig"] = joiner.sign_object(request)
    request.update(tamper)
    live.run(
        live.request(
            "POST",
            "/mesh/v1/join",
            data=json_text(request),
            headers={"Content-Type": "application/json"},
        )
    )
    live.check("membership join")


def test_community_show_after_fuzzing(live: LiveNode, revokee: KeyPair) -> None:
    """`hearthnet community show` lists only the members the anchor's own records made."""
    live.ensure_running()
    shown = run_cli("community", "show", "--json", "--data-dir", str(live.data_dir))
    assert 0 == shown.returncode, shown.stderr
    info = json.loads(shown.stdout)
    assert (
        {node: level.label for node, level in live.granted_members.items()},
        sorted(live.granted_revoked),
    ) == ({m["node"]: m["level"] for m in info["members"]}, info["revoked"])
