"""POST /bus/v1/call over real loopback sockets: JSON, SSE, and every refusal (spec §2.2–2.5)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest

from hearthnet.client import Client
from hearthnet.clock import now_ms
from hearthnet.errors import CapacityExceeded, DeadlineExceeded, RateLimited
from hearthnet.identity import KeyPair, verify_object
from hearthnet.ids import new_ulid
from hearthnet.node import Node
from hearthnet.tokens import CapabilityToken, Scope
from hearthnet.transport import headers as h
from hearthnet.transport.codec import SseParser
from tests.conftest import MakeConfig
from tests.helpers import CleanupLog, token_for, wait_until


def signed_call(
    keys: KeyPair,
    community: str,
    cap: str,
    body: dict[str, Any],
    *,
    version: str = "1.0",
    ts: int | None = None,
    request_id: str | None = None,
    accept: str = "application/json",
) -> dict[str, str]:
    """Headers for a call signed by ``keys`` (built by hand, as a non-Python client would)."""
    request_id = request_id or new_ulid()
    ts = now_ms() if ts is None else ts
    envelope = {
        "body": body,
        "capability": cap,
        "version": version,
        "request_id": request_id,
        "from": keys.node_id,
        "community": community,
        "ts": ts,
    }
    return {
        h.CAPABILITY: cap,
        h.VERSION: version,
        h.REQUEST_ID: request_id,
        h.FROM: keys.node_id,
        h.COMMUNITY: community,
        h.TIMESTAMP: str(ts),
        h.SIGNATURE: keys.sign_object(envelope),
        "Accept": accept,
        "Content-Type": "application/json",
    }


async def post(
    http: aiohttp.ClientSession, node: Node, headers: dict[str, str], body: Any
) -> tuple[int, Any]:
    """POST a call, return (status, parsed JSON)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with http.post(node.url + "/bus/v1/call", data=data, headers=headers) as resp:
        return resp.status, await resp.json(content_type=None)


def refused(node: Node, code: str) -> float:
    """How many requests the node refused with ``code`` over HTTP."""
    return node.metrics.counter("hearthnet_requests_refused_total", "", ("code", "transport")).get(
        code, "http"
    )


async def test_unary_call_json(node: Node, http: aiohttp.ClientSession) -> None:
    """A signed echo call answers 200 {"output", "meta": {"ms", "node"}}."""
    body = {"input": {"hello": ["world", 1]}}
    status, answer = await post(
        http, node, signed_call(node.keys, node.membership.community_id, "echo", body), body
    )
    assert (200, {"echo": {"hello": ["world", 1]}}, node.keys.node_id) == (
        status,
        answer["output"],
        answer["meta"]["node"],
    )


async def test_sse_stream_tokens_then_done(node: Node, http: aiohttp.ClientSession) -> None:
    """Accept: text/event-stream streams token events then one done, then the response ends."""
    body = {"input": {"count": 5, "size": 3}}
    headers = signed_call(
        node.keys, node.membership.community_id, "echo.stream", body, accept="text/event-stream"
    )
    async with http.post(node.url + "/bus/v1/call", json=body, headers=headers) as resp:
        assert "text/event-stream" == resp.headers["Content-Type"]
        parser = SseParser()
        events = parser.feed(await resp.read())
    assert [("token", {"i": i, "text": "xxx"}) for i in range(1, 6)] + [("done", {"count": 5})] == [
        (e, json.loads(d)) for e, d, _ in events
    ]


def bad_cases(node: Node) -> list[tuple[str, dict[str, str], Any, int, str]]:
    """(name, headers, body, expected status, expected code) for refusals over HTTP."""
    c = node.membership.community_id
    k = node.keys
    good: dict[str, Any] = {"input": {}}
    stranger = KeyPair.generate()
    replay_headers = signed_call(k, c, "echo", good)
    bad_sig = signed_call(k, c, "echo", good)
    bad_sig[h.SIGNATURE] = signed_call(k, c, "echo", {"input": {"x": 1}})[h.SIGNATURE]
    missing = signed_call(k, c, "echo", good)
    del missing[h.SIGNATURE]
    return [
        ("malformed json", signed_call(k, c, "echo", good), b"{not json", 400, "bad_request"),
        ("body not object", signed_call(k, c, "echo", good), [1, 2], 400, "bad_request"),
        ("missing signature header", missing, good, 400, "bad_request"),
        (
            "bad timestamp header",
            {**signed_call(k, c, "echo", good), h.TIMESTAMP: "soon"},
            good,
            400,
            "bad_request",
        ),
        *(
            (
                f"timestamp {raw!r}",
                {**signed_call(k, c, "echo", good), h.TIMESTAMP: raw},
                good,
                400,
                "bad_request",
            )
            for raw in ("--5", "\u00b2", "1" * 17)
        ),
        (
            "deadline not a number",
            {**signed_call(k, c, "echo", good), h.DEADLINE: "\u0663"},
            good,
            400,
            "bad_request",
        ),
        ("bad signature", bad_sig, good, 401, "invalid_signature"),
        (
            "stale timestamp",
            signed_call(k, c, "echo", good, ts=now_ms() - 61_000),
            good,
            410,
            "expired",
        ),
        ("not a member", signed_call(stranger, c, "echo", good), good, 401, "unauthorized"),
        ("replayed", replay_headers, good, 409, "replayed"),
        ("unknown capability", signed_call(k, c, "nope", good), good, 404, "not_found"),
        (
            "unknown major version",
            signed_call(k, c, "echo", good, version="2.0"),
            good,
            404,
            "not_found",
        ),
        (
            "schema mismatch",
            signed_call(k, c, "echo.stream", {"input": {"count": 0}}, accept="text/event-stream"),
            {"input": {"count": 0}},
            400,
            "schema_mismatch",
        ),
        (
            "stream without SSE accept",
            signed_call(k, c, "echo.stream", {"input": {"count": 1}}),
            {"input": {"count": 1}},
            400,
            "bad_request",
        ),
        ("handler crash", signed_call(k, c, "test.crash", good), good, 500, "internal_error"),
    ]


async def test_every_refusal_has_its_code_and_is_counted(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """Each bad request gets the spec's status and code, is counted, and the node serves on."""
    cases = bad_cases(node)
    replay = next(c for c in cases if c[0] == "replayed")
    await post(http, node, replay[1], replay[2])  # first use succeeds
    results = []
    for name, headers, body, _, code in cases:
        before = refused(node, code)
        status, answer = await post(http, node, headers, body)
        results.append((name, status, answer.get("error"), refused(node, code) - before))
    assert [(n, s, c, 1.0) for n, _, _, s, c in cases] == results
    good = {"input": 1}
    assert (
        200
        == (
            await post(
                http, node, signed_call(node.keys, node.membership.community_id, "echo", good), good
            )
        )[0]
    )


async def test_oversized_body_and_headers(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """Bodies over max_body_bytes get 413, headers over max_header_bytes 431 (too large)."""
    config = make_config(transport={"max_body_bytes": 2048, "max_header_bytes": 4096})
    async with Node(config) as node:
        c = node.membership.community_id
        big = {"input": "x" * 4096}
        status, answer = await post(http, node, signed_call(node.keys, c, "echo", big), big)
        headers = {**signed_call(node.keys, c, "echo", {"input": 1}), "X-Padding": "p" * 5000}
        status2, answer2 = await post(http, node, headers, {"input": 1})
    assert ((413, "payload_too_large"), (431, "payload_too_large")) == (
        (status, answer["error"]),
        (status2, answer2["error"]),
    )


async def test_token_client_scopes(node: Node, http: aiohttp.ClientSession) -> None:
    """A token with call:echo may call echo; echo.stream is unauthorized; a bad token is refused."""
    token = CapabilityToken.issue(
        node.keys,
        community=node.membership.community_id,
        scopes=[Scope.parse("call:echo@1")],
        ttl_ms=60_000,
        now_ms=now_ms(),
    )
    base = {
        h.VERSION: "1.0",
        h.TOKEN: token.encode(),
        "Content-Type": "application/json",
        "Accept": "text/event-stream",
    }
    ok = await post(
        http, node, {**base, h.CAPABILITY: "echo", "Accept": "application/json"}, {"input": 7}
    )
    denied = await post(http, node, {**base, h.CAPABILITY: "echo.stream"}, {"input": {"count": 1}})
    forged = await post(
        http,
        node,
        {**base, h.CAPABILITY: "echo", h.TOKEN: token.encode()[:-3] + "abc"},
        {"input": 7},
    )
    assert ((200, {"echo": 7}), (401, "unauthorized"), (401, "invalid_signature")) == (
        (ok[0], ok[1]["output"]),
        (denied[0], denied[1]["error"]),
        (forged[0], forged[1]["error"]),
    )
    # what to change is said: the token's call scopes
    assert (
        "caller may not call echo.stream@1.0: the token's call scopes (echo@1) do not cover it"
        == denied[1]["message"]
    )


async def test_a_token_in_the_authorization_header(node: Node, http: aiohttp.ClientSession) -> None:
    """``Authorization: Bearer hnt1:...`` carries a token as X-HearthNet-Token does (a JSON
    call, which the lean call path answers, and an SSE one, which the full server does);
    X-HearthNet-Token wins when both are sent; a credential in Authorization that is not a
    HearthNet token (a proxy's own) is left alone, so a signed call still goes through."""
    token = token_for(node, "call:echo", "call:echo.stream")
    plain = {h.VERSION: "1.0", "Content-Type": "application/json", h.CAPABILITY: "echo"}
    json_call = await post(
        http,
        node,
        {**plain, "Authorization": f"Bearer {token}", "Accept": "application/json"},
        {"input": 7},
    )
    sse_headers = {
        **plain,
        h.CAPABILITY: "echo.stream",
        "Authorization": f"bearer  {token} ",
        "Accept": "text/event-stream",
    }
    async with http.post(
        node.url + "/bus/v1/call", json={"input": {"count": 2}}, headers=sse_headers
    ) as response:
        sse = (response.status, response.content_type, (await response.text()).count("event:"))
    both = await post(
        http,
        node,
        {**plain, h.TOKEN: token[:-3] + "abc", "Authorization": f"Bearer {token}"},
        {"input": 7},
    )
    community = node.membership.community_id
    signed = signed_call(node.keys, community, "echo", {"input": 8})
    proxied = await post(
        http, node, {**signed, "Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.e30.x"}, {"input": 8}
    )
    assert ((200, {"echo": 7}), (200, "text/event-stream", 3), 401, (200, {"echo": 8})) == (
        (json_call[0], json_call[1]["output"]),
        sse,
        both[0],
        (proxied[0], proxied[1]["output"]),
    )


async def test_capacity_exceeded_when_provider_is_full(node: Node, client: Client) -> None:
    """test.sleepy has max_concurrent=1: a second concurrent call gets capacity_exceeded."""
    first = asyncio.get_running_loop().create_task(client.call("test.sleepy@1.0", {"ms": 500}))
    await wait_until(lambda: node.router.local.in_flight.get("test.sleepy@1.0", 0) == 1)
    with pytest.raises(CapacityExceeded):
        await client.call("test.sleepy@1.0", {"ms": 0})
    assert {"slept": 500} == await first


async def test_deadline_header(client: Client) -> None:
    """X-HearthNet-Deadline-Ms shorter than the work gives 408 timeout."""
    with pytest.raises(DeadlineExceeded):
        await client.call("test.sleepy@1.0", {"ms": 2000}, deadline_ms=50)


async def test_rate_limited_member(make_config: MakeConfig) -> None:
    """A member over its per-capability budget gets 429 rate_limited with retry_after_ms."""
    async with Node(make_config(limits={"calls_per_s_per_capability": 5})) as node:
        member = KeyPair.generate()
        node.add_member(member.node_id)
        async with Client(node.url, keys=member) as c:
            for _ in range(5):
                await c.call("echo@1.0", 1)
            with pytest.raises(RateLimited) as info:
                await c.call("echo@1.0", 1)
    assert info.value.retry_after_ms is not None
    assert 0 < info.value.retry_after_ms <= 1000


async def test_sse_client_closing_cancels_the_handler(
    node: Node, client: Client, cleanup_log: CleanupLog
) -> None:
    """Closing an SSE stream is its cancel: the handler's cleanup runs promptly (spec §3.6)."""
    async with client.stream("test.slow@1.0", {"interval_ms": 10}, prefer_ws=False) as stream:
        async for frame in stream:
            if frame.data.get("i") == 3:
                closed_at = time.monotonic()
                await stream.cancel()
                break
    await wait_until(lambda: bool(cleanup_log.times("cleanup")), what="handler cleanup")
    assert cleanup_log.times("cleanup")[0] - closed_at < 0.2
    await wait_until(
        lambda: (
            node.metrics.counter("hearthnet_streams_abandoned_total", "", ("transport",)).get("sse")
            == 1.0
        )
    )


async def test_status_endpoints(node: Node, http: aiohttp.ClientSession) -> None:
    """/health, /ready, /status, / and a manifest whose signature verifies."""
    async with http.get(node.url + "/manifest") as resp:
        manifest = await resp.json()
    sig = manifest.pop("sig")
    verify_object(node.keys.node_id, manifest, sig)
    answers = []
    for path in ("/health", "/ready", "/status"):
        async with http.get(node.url + path) as resp:
            answers.append((resp.status, await resp.json()))
    async with http.get(node.url + "/") as resp:
        page = await resp.text()
    assert (
        manifest["expires_ms"] - manifest["issued_ms"],
        200,
        "ready",
        node.keys.node_id,
        True,
    ) == (
        60_000,
        answers[0][0],
        answers[1][1]["status"],
        answers[2][1]["node"],
        "HearthNet node" in page,
    )


async def test_metrics_exposition(node: Node, client: Client, http: aiohttp.ClientSession) -> None:
    """/metrics is Prometheus text with the spec's series, counting real calls."""
    await client.call("echo@1.0", 1)
    async with http.get(node.url + "/metrics") as resp:
        text = await resp.text()
    for series in (
        "hearthnet_calls_total",
        "hearthnet_call_duration_seconds_bucket",
        "hearthnet_streams_active",
        "hearthnet_signature_failures_total",
        "hearthnet_rate_limited_total",
    ):
        assert f"# TYPE {series.removesuffix('_bucket')}" in text
    assert 'hearthnet_calls_total{capability="echo",result="ok"} 1' in text


async def test_unknown_route_is_json_not_found(node: Node, http: aiohttp.ClientSession) -> None:
    """Unknown paths and methods answer the JSON error shape."""
    async with http.get(node.url + "/nope") as resp:
        nf = (resp.status, (await resp.json())["error"])
    async with http.put(node.url + "/bus/v1/call") as resp:
        na = (resp.status, (await resp.json())["error"])
    assert ((404, "not_found"), (400, "bad_request")) == (nf, na)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
async def test_body_that_does_not_decode_is_bad_request(
    node: Node, http: aiohttp.ClientSession, encoding: str
) -> None:
    """A body that is not what its Content-Encoding says is bad_request, counted; not a 500."""
    c = node.membership.community_id
    headers = {**signed_call(node.keys, c, "echo", {"input": 1}), "Content-Encoding": encoding}
    status, answer = await post(http, node, headers, b"not compressed")
    assert (400, "bad_request", 1.0, 0.0) == (
        status,
        answer["error"],
        refused(node, "bad_request"),
        refused(node, "internal_error"),
    )
