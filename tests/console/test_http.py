"""The console's endpoints on an in-process node: static files, who may read the data,
session tokens, the last mesh-health report."""

from __future__ import annotations

import json

import aiohttp

from hearthnet.clock import now_ms
from hearthnet.console.access import login_token
from hearthnet.node import Node
from hearthnet.tokens import CapabilityToken
from tests.helpers import publish, token_for


async def test_static_files(node: Node, http: aiohttp.ClientSession) -> None:
    """The page, its script and the client are served with their types; the page forbids
    scripts from elsewhere, and names an inline icon (no request for /favicon.ico)."""
    answers = []
    for path in ("/", "/console/console.js", "/client/hearthnet.js", "/console/nothing.js"):
        async with http.get(node.url + path) as resp:
            answers.append((resp.status, resp.content_type))
            if path == "/":
                csp = resp.headers["Content-Security-Policy"]
                page = await resp.text()
    assert (
        [
            (200, "text/html"),
            (200, "text/javascript"),
            (200, "text/javascript"),
            (404, "application/json"),
        ],
        True,
        True,
        True,
    ) == (
        answers,
        "script-src 'self'" in csp,
        '<link rel="icon" href="data:,">' in page,
        "img-src 'self' data:" in csp,
    )


async def test_overview_needs_a_console_token(node: Node, http: aiohttp.ClientSession) -> None:
    """No credential: unauthorized; a token without the console scope: forbidden; a console
    token: the node, its community and topics with rates."""
    await publish(node, "demo.a", 3)
    statuses = []
    for headers in (
        {},
        {"X-HearthNet-Token": token_for(node, "sub:**")},
        {"X-HearthNet-Token": login_token(node.keys, node.membership.community_id, now_ms())},
    ):
        async with http.get(node.url + "/console/v1/overview", headers=headers) as resp:
            statuses.append(resp.status)
            body = await resp.json()
    topics = {t["topic"]: t for t in body["topics"]}
    assert ([401, 403, 200], node.keys.node_id, node.membership.community_id, 3, True) == (
        statuses,
        body["node"]["node"],
        body["community"]["id"],
        topics["demo.a"]["messages"],
        topics["demo.a"]["rate_per_s"] > 0,
    )


async def test_session_token_keeps_the_jti(node: Node, http: aiohttp.ClientSession) -> None:
    """POST /console/v1/token trades a console token for the next one of its session."""
    login = login_token(node.keys, node.membership.community_id, now_ms())
    async with http.post(
        node.url + "/console/v1/token", headers={"X-HearthNet-Token": login}
    ) as resp:
        fresh = CapabilityToken.decode((await resp.json())["token"])
    assert CapabilityToken.decode(login).jti == fresh.jti


async def test_last_health_report(node: Node, http: aiohttp.ClientSession) -> None:
    """The newest summary.json under <data_dir>/health is in the overview."""
    report = node.data_dir / "health" / "today" / "summary.json"
    report.parent.mkdir(parents=True)
    report.write_text(json.dumps({"nodes": 3, "links": 2}))
    headers = {"X-HearthNet-Token": login_token(node.keys, node.membership.community_id, now_ms())}
    async with http.get(node.url + "/console/v1/overview", headers=headers) as resp:
        health = (await resp.json())["health"]
    assert ("health/today/summary.json", {"nodes": 3, "links": 2}) == (
        health["path"],
        health["summary"],
    )
