"""Topic key rotation (``hearthnet topic rotate``): tokens for the rotated topics issued
until then are void on every node; live sessions get ``auth.expiring`` and a grace."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from hearthnet.clock import now_ms
from hearthnet.community import CommunityStore, Level
from hearthnet.errors import Revoked
from hearthnet.identity import KeyPair, load_or_create_keys
from hearthnet.membership import Membership, Source
from hearthnet.membership_fold import fold
from hearthnet.node import Node
from hearthnet.tokens import CapabilityToken, Scope
from tests.conftest import MakeConfig
from tests.helpers import publish, token_for, wait_until
from tests.pubsub.test_http import RawSse
from tests.pubsub.test_ws import Raw, data_of, session

ISSUER = KeyPair.from_seed(b"\x71" * 32)


def token(scopes: list[str], iat_ms: int | None) -> CapabilityToken:
    """A token issued at ``iat_ms`` (None: as before tokens carried one)."""
    issued = CapabilityToken.issue(
        ISSUER,
        community=ISSUER.node_id,
        scopes=[Scope.parse(s) for s in scopes],
        ttl_ms=60_000,
        now_ms=iat_ms or 1_000,
    )
    if iat_ms is None:
        body = issued.to_json()
        del body["iat_ms"], body["sig"]
        body["sig"] = ISSUER.sign_object(body)
        return CapabilityToken.from_json(body)
    return issued


@pytest.mark.parametrize(
    ("scopes", "iat_ms", "voided"),
    [
        (["sub:chat.**"], 1_000, True),  # issued before
        (["sub:chat.**"], 5_000, True),  # at the same ms
        (["sub:chat.**"], 5_001, False),  # issued after
        (["sub:chat.**"], None, True),  # no iat_ms: before any rotation
        (["pub:chat.room.*"], 1_000, True),  # overlaps chat.**
        (["sub:news.**"], 1_000, False),  # other topics
        (["call:echo"], 1_000, False),  # no topic scope
    ],
)
def test_which_tokens_a_rotation_voids(scopes: list[str], iat_ms: int | None, voided: bool) -> None:
    """A rotation of chat.** at 5,000 ms voids tokens issued at or before it whose pub/sub
    scopes reach a chat topic."""
    assert voided == token(scopes, iat_ms).voided_by_rotation("chat.**", 5_000)


def test_only_anchors_rotate() -> None:
    """topic.rotated by a trusted member has no effect (and is refused when submitted)."""
    view = Membership(ISSUER.node_id)
    view.add(view.sign(ISSUER, "community.created", ISSUER.node_id, now_ms=1))
    other = KeyPair.from_seed(b"\x72" * 32)
    view.add(view.sign(ISSUER, "member.added", other.node_id, now_ms=2, level=Level.TRUSTED))
    by_trusted = view.sign(other, "topic.rotated", "chat.**", now_ms=3)
    refused = view.add_all([by_trusted], Source.SUBMIT)
    by_anchor = view.sign(ISSUER, "topic.rotated", "chat.**", now_ms=4)
    view.add(by_anchor, Source.SUBMIT)
    assert (["forbidden"], (("chat.**", 4),)) == (
        [e.code for _, e in refused.refused],
        view.rotations,
    )
    assert [("chat.**", 4)] == fold(view.community_id, view.records.values()).rotations


async def test_rotation_on_one_node_ends_voided_sessions_on_another(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """Across two linked nodes: node a rotates chat.**; on node b a WebSocket session on a
    token issued before gets auth.expiring and is closed 4401 after the grace, one that
    re-authenticates with a fresh token stays and gets messages, a session on a token for
    other topics is untouched, and the old token opens no new session."""
    fast = {"dial_interval_s": 0.05}
    config_a = make_config(mesh=fast)
    config_b = make_config(mesh=fast, security={"rotation_grace_s": 1.0})
    keys_b = load_or_create_keys(config_b.data_path)
    async with Node(config_a) as a:
        a.add_member(keys_b.node_id)
        CommunityStore(config_b.data_path).replace(list(a.membership.records.values()))
        async with Node(config_b) as b:
            b.mesh.book.add(a.url, node=a.keys.node_id)
            await wait_until(lambda: a.keys.node_id in b.mesh.links, what="a link")
            old = token_for(a, "sub:chat.**", sub="app")
            other = token_for(a, "sub:news.**", sub="news")
            idle = await session(http, b, token=old)
            renewing = await session(http, b, token=old)
            untouched = await session(http, b, token=other)
            for raw, topic in ((idle, "chat.*"), (renewing, "chat.*"), (untouched, "news.*")):
                await raw.send({"type": "subscribe", "topics": [topic]})
                await raw.next("subscribed")
            rotation = a.membership.sign(a.keys, "topic.rotated", "chat.**", now_ms=now_ms())
            assert a.apply_membership(rotation)
            warnings = [await raw.next("auth.expiring", within_s=10) for raw in (idle, renewing)]
            await wait_until(lambda: now_ms() > rotation.ts, what="a later ms")
            fresh = token_for(a, "sub:chat.**", sub="app")
            await renewing.send({"type": "auth", "token": fresh})
            await renewing.next("auth.ok")
            code = await idle.closed(within_s=10)
            with pytest.raises(Revoked):
                b.authenticator.caller_for_token(old, now_ms())
            await publish(b, "chat.a", 1)
            await publish(b, "news.a", 1)
            got = [data_of(await raw.messages(1)) for raw in (renewing, untouched)]
    assert 2 == len([w for w in warnings if w["data"]["expires_ms"] > rotation.ts])
    assert (4401, [[0], [0]]) == (code, got)


async def test_a_session_ended_by_a_rotation_is_told_so_not_token_expired(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """A WebSocket session whose token a rotation voided is closed 4401 at the end of the
    grace with the reason "token voided by a key rotation of chat.**", and an SSE stream
    on it ends with an `expired` event saying the same (both said "token expired", though
    the token itself had an hour left); a session that renewed its token after the
    warning and let the new one run out is closed "token expired"."""
    config = make_config(security={"rotation_grace_s": 3.0})
    async with Node(config) as node:
        hour = token_for(node, "sub:chat.**", sub="app", ttl_ms=3_600_000)
        raws = [await session(http, node, token=hour) for _ in range(2)]
        for raw in raws:
            await raw.send({"type": "subscribe", "topics": ["chat.*"]})
            await raw.next("subscribed")
        sse = await RawSse.open(node, f"/pubsub/v1/subscribe?topics=chat.*&token={hour}")
        assert "subscribed" == (await sse.event())["event"]
        rotation = node.membership.sign(node.keys, "topic.rotated", "chat.**", now_ms=now_ms())
        assert node.apply_membership(rotation)
        for raw in raws:
            await raw.next("auth.expiring")
        await wait_until(lambda: now_ms() > rotation.ts, what="a later ms")
        short = token_for(node, "sub:chat.**", sub="app", ttl_ms=1_500)
        await raws[1].send({"type": "auth", "token": short})
        await raws[1].next("auth.ok")
        ends = [await closed_with_reason(raw, within_s=10) for raw in raws]
        sse_end = await sse.event(within_s=10)
        while sse_end["event"] == "auth.expiring":
            sse_end = await sse.event(within_s=10)
        sse.close()
    voided = "token voided by a key rotation of chat.**"
    assert [(4401, voided), (4401, "token expired")] == ends
    assert ("error", "expired", voided) == (
        sse_end["event"],
        sse_end["data"]["code"],
        sse_end["data"]["message"],
    )


async def closed_with_reason(raw: Raw, within_s: float) -> tuple[int, str]:
    """Wait for the node's close frame: its code and reason."""
    async with asyncio.timeout(within_s):
        while True:
            msg = await raw.ws.receive()
            if msg.type == aiohttp.WSMsgType.CLOSE:
                return int(msg.data), str(msg.extra)
            assert msg.type not in (aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.CLOSING), msg
