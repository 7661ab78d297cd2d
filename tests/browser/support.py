"""Helpers of the browser tests: page servers (origins) and tokens for node processes."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from hearthnet.clock import now_ms
from hearthnet.identity import load_or_create_keys
from hearthnet.tokens import CapabilityToken, Scope
from tests.helpers import NodeProcess


def process_token(node: NodeProcess, *scopes: str, ttl_ms: int = 600_000) -> str:
    """A token issued by a node process's own key (read from its data dir)."""
    keys = load_or_create_keys(node.data_dir)
    return CapabilityToken.issue(
        keys,
        community=node.fields["community"],
        scopes=[Scope.parse(s) for s in scopes],
        ttl_ms=ttl_ms,
        now_ms=now_ms(),
    ).encode()


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
