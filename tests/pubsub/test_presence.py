"""Presence table: join, update, leave, silence and remote TTL (spec §6.6). Pure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hearthnet.errors import BadRequest
from hearthnet.pubsub.presence import Member, PresenceTable, validate_presence_fields


def member(client_id: str, now: int, local: bool = True) -> Member:
    """A member joined at ``now``."""
    return Member(
        client_id, f"id-{client_id}", "node-a", now, now, name=client_id.upper(), local=local
    )


def test_join_update_leave_events() -> None:
    """join, then update of the same client, then leave; the snapshot follows."""
    table = PresenceTable()
    events = table.join("chat.a", member("c1", 0))
    events += table.join("chat.a", member("c2", 0))
    events += table.update("c1", {"status": "typing"}, 5)
    snapshot = {m["client_id"]: m.get("status") for m in table.members("chat.a")}
    events += table.leave("c1")
    assert (
        [("join", "c1"), ("join", "c2"), ("update", "c1"), ("leave", "c1")],
        {"c1": "typing", "c2": None},
        ["c2"],
    ) == (
        [(e.kind, e.member["client_id"]) for e in events],
        snapshot,
        [m["client_id"] for m in table.members("chat.a")],
    )


def test_silent_local_members_leave_after_30s_remote_after_45s() -> None:
    """Local members silent 30 s leave; remote ones leave 45 s after their last refresh."""
    table = PresenceTable(silence_ms=30_000, remote_ttl_ms=45_000)
    table.join("t", member("local", 0))
    table.join("t", member("remote", 0, local=False))
    early = table.expire(30_000)
    mid = table.expire(30_001)
    late = table.expire(45_001)
    assert ([], ["local"], ["remote"]) == (
        [e.member["client_id"] for e in early],
        [e.member["client_id"] for e in mid],
        [e.member["client_id"] for e in late],
    )


def test_touch_keeps_a_member() -> None:
    """A pong or frame (touch) resets the silence clock."""
    table = PresenceTable(silence_ms=30_000)
    table.join("t", member("c", 0))
    table.touch("c", 20_000)
    assert ([], 1) == (table.expire(40_000), len(table.members("t")))


OPS = st.lists(
    st.tuples(
        st.sampled_from(["join", "leave_one", "leave_all", "touch", "update", "expire"]),
        st.sampled_from(["c1", "c2", "c3"]),
        st.sampled_from(["t1", "t2", "t3", "t4"]),
    ),
    max_size=40,
)


@given(OPS)
def test_a_clients_topics_are_found_without_scanning_every_topic(
    ops: list[tuple[str, str, str]],
) -> None:
    """Whatever joins, leaves, touches, updates and expiries happen, the table agrees with
    a plain model (topic -> client -> last seen), and its per-client index names exactly
    the topics each client is on."""
    table = PresenceTable(silence_ms=10)
    model: dict[str, dict[str, int]] = {}
    for now, (op, client, topic) in enumerate(ops):
        if op == "join":
            table.join(topic, member(client, now))
            model.setdefault(topic, {})[client] = now
        elif op == "leave_one":
            table.leave(client, topic)
            model.get(topic, {}).pop(client, None)
        elif op == "leave_all":
            table.leave(client)
            for members in model.values():
                members.pop(client, None)
        elif op in ("touch", "update"):
            if op == "touch":
                table.touch(client, now)
            else:
                table.update(client, {"status": "x"}, now)
            for members in model.values():
                if client in members:
                    members[client] = now
        else:
            table.expire(now)
            for members in model.values():
                for c in [c for c, seen in members.items() if now - seen > 10]:
                    del members[c]
        model = {t: m for t, m in model.items() if m}
    index = {c: {t for t, m in model.items() if c in m} for m in model.values() for c in m}
    assert (model, index) == (
        {t: {c: m.last_seen_ms for c, m in ms.items()} for t, ms in table.topics.items()},
        table.by_client,
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"name": 5},
        {"status": "x" * 65},
        {"meta": [1]},
        {"meta": {"x": "y" * 5000}},
        {"colour": "red"},
        "alice",
    ],
)
def test_bad_presence_fields(fields: object) -> None:
    """Wrong types, oversized meta and unknown fields are bad requests."""
    with pytest.raises(BadRequest):
        validate_presence_fields(fields)
