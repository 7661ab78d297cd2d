"""Browser pages on other origins (spec §3.2, docs/security.md): an allowed origin may use
fetch (with a preflight), EventSource and WebSocket; any other origin is refused."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.support import PageServer, process_token
from tests.helpers import NodeProcess, start_node_process

# What a third-party page does with a node: publish (a preflighted fetch, for the token
# header), read it back over SSE, and open a pub/sub WebSocket.
PAGE = """<!doctype html><script type="module">
const node = new URLSearchParams(location.search).get("node");
const token = new URLSearchParams(location.search).get("token");
window.results = {};
try {
  const r = await fetch(node + "/pubsub/v1/topics/demo.cors/messages", {
    method: "POST",
    headers: {"Content-Type": "application/json", "X-HearthNet-Token": token},
    body: JSON.stringify({type: "note", data: {from: location.origin}})});
  results.fetch = r.status;
} catch (e) { results.fetch = "refused"; }
const es = new EventSource(node + "/pubsub/v1/subscribe?topics=demo.cors&last=1&token=" +
                           encodeURIComponent(token));
es.addEventListener("message", (e) => { results.sse = JSON.parse(e.data).data.from; es.close(); });
es.onerror = () => { if (!results.sse) { results.sse = "refused"; es.close(); } };
const ws = new WebSocket(node.replace("http", "ws") + "/pubsub/v1/subscribe");
ws.onopen = () => ws.send(JSON.stringify({type: "auth", token}));
ws.onmessage = (e) => { results.ws = JSON.parse(e.data).event; ws.close(); };
ws.onclose = () => { if (!results.ws) results.ws = "refused"; };
</script>"""

DONE = "window.results && results.fetch && results.sse && results.ws"


@pytest.fixture(scope="module")
def origins() -> Iterator[tuple[PageServer, PageServer]]:
    """Two origins on loopback: the first is allowed, the second is not."""
    allowed, other = PageServer({"/": PAGE}), PageServer({"/": PAGE})
    try:
        yield allowed, other
    finally:
        allowed.close()
        other.close()


@pytest.fixture(scope="module")
def cors_node(
    origins: tuple[PageServer, PageServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeProcess]:
    """A node that allows the first origin."""
    proc = start_node_process(
        tmp_path_factory.mktemp("cors") / "node",
        env={"HEARTHNET_SECURITY_ALLOWED_ORIGINS": origins[0].origin},
    )
    try:
        yield proc
    finally:
        proc.stop()


def _run(page: Any, origin: str, node: NodeProcess) -> dict[str, Any]:
    token = process_token(node, "pub:demo.**", "sub:demo.**")
    query = json.dumps({"node": node.url, "token": token})
    params = "&".join(f"{k}={v}" for k, v in json.loads(query).items())
    page.goto(f"{origin}/?{params}")
    page.wait_for_function(DONE, timeout=15_000)
    results: dict[str, Any] = page.evaluate("window.results")
    return results


def test_allowed_origin_uses_fetch_eventsource_and_websocket(
    page: Any, origins: tuple[PageServer, PageServer], cors_node: NodeProcess
) -> None:
    """From an allowed origin: the preflighted publish, the SSE read and the WS auth work."""
    allowed = origins[0].origin
    assert {"fetch": 200, "sse": allowed, "ws": "auth.ok"} == _run(page, allowed, cors_node)


def test_other_origin_is_refused(
    page: Any, origins: tuple[PageServer, PageServer], cors_node: NodeProcess
) -> None:
    """From an origin not listed: fetch, EventSource and WebSocket all fail in the page."""
    other = origins[1].origin
    assert {"fetch": "refused", "sse": "refused", "ws": "refused"} == _run(page, other, cors_node)


def test_refusals_and_preflight_on_the_wire(
    origins: tuple[PageServer, PageServer], cors_node: NodeProcess, tmp_path: Path
) -> None:
    """Raw HTTP: preflight answered for the allowed origin, 403 forbidden for another, and
    a WebSocket upgrade from another origin gets no 101."""
    import http.client  # noqa: PLC0415 - only this test speaks raw HTTP

    host, port = cors_node.url.removeprefix("http://").split(":")

    def ask(method: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            conn.request(method, path, headers=headers)
            resp = conn.getresponse()
            resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}
        finally:
            conn.close()

    allowed, other = origins[0].origin, origins[1].origin
    pre_status, pre = ask(
        "OPTIONS",
        "/pubsub/v1/topics/demo.x/messages",
        {
            "Origin": allowed,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, x-hearthnet-token, x-evil",
        },
    )
    refused_status, _ = ask("GET", "/health", {"Origin": other})
    same_status, same = ask("GET", "/health", {"Origin": cors_node.url})
    ws_status, _ = ask(
        "GET",
        "/pubsub/v1/subscribe",
        {
            "Origin": other,
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version": "13",
        },
    )
    assert (204, allowed, "content-type, x-hearthnet-token", 403, 200, cors_node.url, 403) == (
        pre_status,
        pre.get("access-control-allow-origin"),
        pre.get("access-control-allow-headers"),
        refused_status,
        same_status,
        same.get("access-control-allow-origin"),
        ws_status,
    )
