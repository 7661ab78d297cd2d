"""Browser subscriber benchmark: hearthnet.js in a real Chromium, over WebSocket and SSE.

A node process (``hearthnet node start``) and one page (served from a second loopback
origin that the node allows) that subscribes with hearthnet.js. The publisher is this
process, on one pub/sub WebSocket signed as the node (not rate limited), pipelining its
publishes.

- **burst**: N messages published as fast as the node takes them; messages per second
  from the first publish until the page has seen all N, each either in ``onMessage`` or
  in an ``onGap`` range (acks on, default window 1,024 over WebSocket; TCP pacing over SSE;
  a subscriber whose queue of 1,024 overflows is told what it lost, spec §6.7);
- **paced**: messages at a fixed rate; publish-to-``onMessage`` latency, from the
  envelope's ``ts`` (set by the node at publish, ms resolution) to ``Date.now()`` in the
  page (one machine, one clock).

Needs /usr/bin/chromium and playwright (the test extra).

Run: python -m bench.bench_browser [--burst 5000] [--rate 200] [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from playwright.sync_api import Page, sync_playwright
from websockets.sync.client import ClientConnection, connect

from bench.common import percentile, save, start_node
from hearthnet.clock import now_ms
from hearthnet.identity import KeyPair, load_or_create_keys
from hearthnet.tokens import CapabilityToken, Scope

CHROMIUM = "/usr/bin/chromium"
PAGE = b"""<!doctype html><script type="module">
const node = new URLSearchParams(location.search).get("node");
window.hn = await import(node + "/client/hearthnet.js");
window.ready = true;
</script>"""
SUBSCRIBE = """([node, token, transport, topic, win]) => {
  window.got = 0; window.gapped = 0; window.lat = [];
  const client = new hn.HearthNet(node, {token, transport, window: win});
  window.sub = client.subscribe([topic], {onMessage: (m) => {
    got++; lat.push(Date.now() - m.ts); },
    onGap: (g) => { gapped += g.to_seq - g.from_seq + 1; }});
}"""


def serve_page() -> tuple[ThreadingHTTPServer, str]:
    """The page's origin."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(PAGE)))
            self.end_headers()
            self.wfile.write(PAGE)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def authenticate(ws: ClientConnection, keys: KeyPair) -> None:
    """Authenticate a pub/sub WebSocket as the node itself (not rate limited)."""
    proof: dict[str, Any] = {
        "identity": keys.node_id,
        "ts": now_ms(),
        "nonce": os.urandom(8).hex(),
        "node": keys.node_id,
    }
    sig = keys.sign_object(proof)
    ws.send(
        json.dumps(
            {"type": "auth", **{k: proof[k] for k in ("identity", "ts", "nonce")}, "sig": sig}
        )
    )
    assert json.loads(ws.recv(timeout=10))["event"] == "auth.ok"


def publish(ws: ClientConnection, topic: str, count: int, start: int = 0) -> None:
    """Send ``count`` publishes, then wait for their answers."""
    for n in range(start, start + count):
        ws.send(json.dumps({"type": "publish", "topic": topic, "msg_type": "b", "data": {"n": n}}))
    answered = 0
    while answered < count:
        if json.loads(ws.recv(timeout=30))["event"] == "published.ok":
            answered += 1


def wait_for(page: Page, count: int, timeout_s: float = 120) -> None:
    """Until the page has seen ``count`` messages or gap reports for them."""
    deadline = time.monotonic() + timeout_s
    while page.evaluate("got + gapped") < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"page saw {page.evaluate('got')} of {count}")
        time.sleep(0.01)


def run_transport(
    page: Page, url: str, token: str, ws: ClientConnection, transport: str, opts: Any
) -> dict[str, Any]:
    """Burst, then paced, on a fresh topic for one transport."""
    topic = f"bench.browser.{transport}"
    page.evaluate(SUBSCRIBE, [url, token, transport, topic, opts.window])
    page.wait_for_function("sub.state === 'live'", timeout=20_000)
    started = time.monotonic()
    publish(ws, topic, opts.burst)
    wait_for(page, opts.burst)
    burst_s = time.monotonic() - started
    delivered, gapped = page.evaluate("[got, gapped]")
    page.evaluate("lat = []")
    interval = 1 / opts.rate
    total = int(opts.rate * opts.seconds)
    next_at = time.monotonic()
    for i in range(total):
        next_at += interval
        publish(ws, topic, 1, opts.burst + i)
        time.sleep(max(0.0, next_at - time.monotonic()))
    wait_for(page, opts.burst + total)
    lat = page.evaluate("lat")
    return {
        "burst_msgs": opts.burst,
        "burst_delivered": delivered,
        "burst_reported_as_gap": gapped,
        "burst_msgs_per_s": round(opts.burst / burst_s),
        "paced_rate": opts.rate,
        "paced_latency_ms": {
            "p50": percentile(lat, 50),
            "p90": percentile(lat, 90),
            "p99": percentile(lat, 99),
            "n": len(lat),
        },
        "transport_used": page.evaluate("sub.transport"),
    }


def main() -> None:
    """Run both transports against one node and one browser."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--burst", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--seconds", type=float, default=5)
    parser.add_argument("--window", type=int, default=1024, help="pub/sub ack window (WS)")
    opts = parser.parse_args()
    httpd, origin = serve_page()
    node = start_node(env={"HEARTHNET_SECURITY_ALLOWED_ORIGINS": origin})
    try:
        keys = load_or_create_keys(node.data_dir)
        token = CapabilityToken.issue(
            keys,
            community=node.fields["community"],
            scopes=[Scope("sub", "bench.**")],
            ttl_ms=3_600_000,
            now_ms=now_ms(),
        ).encode()
        results: dict[str, Any] = {}
        ws_url = node.url.replace("http", "ws", 1) + "/pubsub/v1/subscribe"
        with sync_playwright() as p, connect(ws_url, max_size=None) as ws:
            authenticate(ws, keys)
            browser = p.chromium.launch(executable_path=CHROMIUM)
            for transport in ("ws", "sse"):
                page = browser.new_page()
                page.goto(f"{origin}/?node={node.url}")
                page.wait_for_function("window.ready === true", timeout=20_000)
                results[transport] = run_transport(page, node.url, token, ws, transport, opts)
                page.close()
            results["chromium"] = browser.version
            browser.close()
        results["load_average"] = os.getloadavg()
        save("browser", results)
    finally:
        node.stop()
        httpd.shutdown()


if __name__ == "__main__":
    main()
