"""Helpers of the browser tests: page servers (origins) and tokens for node processes."""

from __future__ import annotations

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from websockets.sync.client import connect

from hearthnet.clock import now_ms
from hearthnet.identity import load_or_create_keys
from hearthnet.ids import b64url_decode, b64url_encode
from hearthnet.tokens import CapabilityToken, Scope
from tests.helpers import NodeProcess


def process_token(
    node: NodeProcess, *scopes: str, ttl_ms: int = 600_000, sub: str | None = None
) -> str:
    """A token issued by a node process's own key (read from its data dir)."""
    keys = load_or_create_keys(node.data_dir)
    return CapabilityToken.issue(
        keys,
        community=node.fields["community"],
        scopes=[Scope.parse(s) for s in scopes],
        ttl_ms=ttl_ms,
        now_ms=now_ms(),
        sub=sub,
    ).encode()


def forged_token(token: str) -> str:
    """``token`` with its signature altered: a node refuses it (invalid_signature)."""
    claims = json.loads(b64url_decode(token.removeprefix("hnt1:")))
    sig = claims["sig"]
    claims["sig"] = sig[:-8] + ("B" * 8 if sig.endswith("A" * 8) else "A" * 8)
    return "hnt1:" + b64url_encode(json.dumps(claims).encode())


class PageServer:
    """Serves fixed HTML pages from ``http://127.0.0.1:PORT`` (one origin)."""

    def __init__(self, pages: dict[str, str]) -> None:
        self.pages = pages

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = pages.get(self.path.split("?")[0])
                if body is None:
                    self.send_error(404)
                    return
                data = body.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        """Stop serving."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


# A page on another origin that loads hearthnet.js from the node given in ?node=.
CLIENT_PAGE = """<!doctype html><title>client</title><script type="module">
const node = new URLSearchParams(location.search).get("node");
window.hn = await import(node + "/client/hearthnet.js");
window.ready = true;
</script>"""


def publish(node_url: str, token: str, topic: str, msg_type: str, data: Any) -> dict[str, Any]:
    """Publish over HTTP with a token (blocking)."""
    request = urllib.request.Request(
        f"{node_url}/pubsub/v1/topics/{topic}/messages",
        data=json.dumps({"type": msg_type, "data": data}).encode(),
        headers={"Content-Type": "application/json", "X-HearthNet-Token": token},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        answer: dict[str, Any] = json.loads(resp.read())
        return answer


def open_client_page(page: Any, pages: PageServer, node_url: str) -> None:
    """Load CLIENT_PAGE from ``pages`` and wait until hearthnet.js is imported."""
    page.goto(f"{pages.origin}/client?node={node_url}")
    page.wait_for_function("window.ready === true", timeout=15_000)


def publish_burst(node_url: str, token: str, topic: str, count: int) -> list[int]:
    """Publish ``count`` messages back to back on one pub/sub WebSocket, without waiting
    for answers in between (they reach the node together and are committed together);
    their seqs."""
    with connect(node_url.replace("http", "ws", 1) + "/pubsub/v1/subscribe") as ws:
        ws.send(json.dumps({"type": "auth", "token": token}))
        assert "auth.ok" == json.loads(ws.recv(timeout=10))["event"]
        for n in range(count):
            ws.send(
                json.dumps(
                    {"type": "publish", "topic": topic, "msg_type": "note", "data": {"n": n}}
                )
            )
        seqs: list[int] = []
        while len(seqs) < count:
            frame = json.loads(ws.recv(timeout=10))
            if frame["event"] == "published.ok":
                seqs.append(frame["data"]["seq"])
        return sorted(seqs)
