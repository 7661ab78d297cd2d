"""The console's HTTP side: ``/`` and ``/console/*`` (static pages shipped in the package),
``/client/hearthnet.js`` (the browser client), ``GET /console/v1/overview`` (everything the
console shows, one request) and ``POST /console/v1/token`` (the next token of a console
session).

The static files are public (they hold no data); the data needs a console token or a
signed request of a member.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from hearthnet.auth import Authenticator
from hearthnet.caller import Caller
from hearthnet.clock import now_ms
from hearthnet.console.access import is_console_token, session_token
from hearthnet.console.rates import TopicRates
from hearthnet.errors import Forbidden, NotFound, StorageError
from hearthnet.identity import KeyPair
from hearthnet.issued_tokens import IssuedTokens
from hearthnet.membership import Membership
from hearthnet.mesh.service import Mesh
from hearthnet.pubsub.service import PubSub
from hearthnet.transport.headers import read_signed_headers
from hearthnet.transport.server import json_response

_TYPES = {
    ".html": "text/html",
    ".js": "text/javascript",
    ".css": "text/css",
    ".png": "image/png",
    ".svg": "image/svg+xml",
}
_STATIC_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
# The console loads nothing from elsewhere: no CDN, no inline script.
_PAGE_HEADERS = {
    **_STATIC_HEADERS,
    "Content-Security-Policy": (
        "default-src 'self'; connect-src 'self' ws: wss:; img-src 'self' data:; "
        "style-src 'self'; script-src 'self'; frame-ancestors 'none'"
    ),
    "Referrer-Policy": "no-referrer",
}
log = logging.getLogger("hearthnet.console")
MAX_TOPICS_SHOWN = 200
HEALTH_DIR = "health"  # <data_dir>/health/**/summary.json: the last mesh-health report
HEALTH_RECHECK_S = 10.0


def load_static() -> dict[str, bytes]:
    """Every file under ``hearthnet/static``, by its path there (``console/index.html``)."""
    root = resources.files("hearthnet") / "static"
    out: dict[str, bytes] = {}

    def walk(node: Any, prefix: str) -> None:
        for entry in node.iterdir():
            name = prefix + entry.name
            if entry.is_dir():
                walk(entry, name + "/")
            elif Path(entry.name).suffix in _TYPES:
                out[name] = entry.read_bytes()

    walk(root, "")
    return out


class StatisticsSource(Protocol):
    """What the overview reads from the node itself."""

    data_dir: Path

    def statistics(self) -> Any:
        """A frozen snapshot with ``to_json()``."""


def last_health_report(data_dir: Path) -> dict[str, Any] | None:
    """The newest ``summary.json`` under ``<data_dir>/health`` (``hearthnet mesh health
    --out <data_dir>/health/...``), with the time it was written; None when there is none."""
    base = data_dir / HEALTH_DIR
    if not base.is_dir():
        return None
    found = sorted(base.glob("**/summary.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        return None
    newest = found[-1]
    try:
        summary = json.loads(newest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return {
        "path": str(newest.relative_to(data_dir)),
        "written_ms": int(newest.stat().st_mtime * 1000),
        "summary": summary,
    }


class ConsoleEndpoints:
    """Static console, browser client, console data."""

    def __init__(
        self,
        node: StatisticsSource,
        *,
        keys: KeyPair,
        authenticator: Authenticator,
        membership: Membership,
        pubsub: PubSub,
        mesh: Mesh,
        rates: TopicRates,
        data_dir: Path,
    ) -> None:
        self.node = node
        self.keys = keys
        self.authenticator = authenticator
        self.membership = membership
        self.pubsub = pubsub
        self.mesh = mesh
        self.rates = rates
        self.issued = IssuedTokens(data_dir)
        self.files = load_static()
        # the report is looked for at most every HEALTH_RECHECK_S, not on every poll
        self._health: dict[str, Any] | None = None
        self._health_checked = -HEALTH_RECHECK_S

    def routes(self) -> list[web.RouteDef]:
        """The routes."""
        return [
            web.get("/", self.index),
            web.get("/client/hearthnet.js", self.client),
            web.get("/console/v1/overview", self.overview),
            web.post("/console/v1/token", self.token),
            web.get("/console/{name}", self.static),
        ]

    def _file(self, name: str) -> web.Response:
        body = self.files.get(name)
        if body is None:
            raise NotFound(f"no console file {name[:64]}")
        kind = _TYPES[Path(name).suffix]
        headers = _PAGE_HEADERS if kind == "text/html" else _STATIC_HEADERS
        return web.Response(body=body, content_type=kind, headers=headers)

    async def index(self, request: web.Request) -> web.Response:
        """The console page."""
        return self._file("console/index.html")

    async def client(self, request: web.Request) -> web.Response:
        """``hearthnet.js``."""
        return self._file("hearthnet.js")

    async def static(self, request: web.Request) -> web.Response:
        """The console's scripts, style and pictures."""
        return self._file("console/" + request.match_info["name"])

    def _caller(self, request: web.Request, body: Any) -> Caller:
        caller = self.authenticator.authenticate_headers(
            method=request.method,
            path=request.raw_path,
            body=body,
            signed=read_signed_headers(request.headers),
            now_ms=now_ms(),
        )
        if caller.token is not None and not is_console_token(caller.token):
            raise Forbidden("this token does not open the console (hearthnet console)")
        return caller

    async def token(self, request: web.Request) -> web.Response:
        """The next token of the console session the request's token belongs to."""
        caller = self._caller(request, None)
        if caller.token is None:
            raise Forbidden("console sessions are refreshed with their console token")
        now = now_ms()
        fresh = session_token(self.keys, caller.token, now)
        try:  # the session's row lives on (the CLI recorded its login under this jti)
            await asyncio.to_thread(self.issued.record, fresh, "console", now)
        except StorageError as exc:  # the session goes on: the token is valid without it
            log.warning("console token %s not recorded: %s", fresh.jti, exc)
        return json_response({"token": fresh.encode(), "exp_ms": fresh.exp_ms})

    def _health_report(self, now_s: float) -> dict[str, Any] | None:
        if now_s - self._health_checked >= HEALTH_RECHECK_S:
            self._health_checked = now_s
            self._health = last_health_report(self.node.data_dir)
        return self._health

    async def overview(self, request: web.Request) -> web.Response:
        """Identity, community, peers, topics, relays and the last mesh-health report."""
        caller = self._caller(request, None)
        stats = self.node.statistics().to_json()
        now_s = time.monotonic()
        topics = self.pubsub.topics(caller, "", MAX_TOPICS_SHOWN)
        for topic in topics:
            topic["rate_per_s"] = round(self.rates.rate(topic["topic"], now_s), 2)
        members = [
            {"node": node, "name": info.name, "level": info.level.name.lower(), "role": info.role}
            for node, info in sorted(self.membership.members.items())
        ]
        return json_response(
            {
                "node": stats,
                "community": {"id": self.membership.community_id, "members": members},
                "peers": self.mesh.peers_status(),
                "topics": topics,
                "relays": {
                    "attached": list(self.mesh.relaying.relay_urls),
                    **stats.get("relaying", {}),
                },
                "health": self._health_report(now_s),
                "you": {"identity": caller.identity, "kind": caller.kind},
                "links": {
                    "metrics": "/metrics",
                    "status": "/status",
                    "manifest": "/manifest",
                    "capabilities": "/bus/v1/capabilities",
                },
            }
        )
