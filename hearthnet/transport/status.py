"""Operational endpoints (spec §3.2, §9): ``/health``, ``/ready``, ``/manifest``,
``/metrics`` and ``/status`` (JSON). The page for people at ``/`` is the console
(:mod:`hearthnet.console.http`)."""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from hearthnet.metrics import MetricsRegistry
from hearthnet.transport.server import json_response


class StatusSource(Protocol):
    """What the status endpoints read from the node."""

    metrics: MetricsRegistry

    def statistics(self) -> Any:
        """A frozen snapshot with ``to_json()``."""

    def manifest(self) -> dict[str, Any]:
        """The signed manifest."""


class StatusEndpoints:
    """Health, readiness, manifest, metrics and status."""

    def __init__(self, node: StatusSource) -> None:
        self.node = node

    def routes(self) -> list[web.RouteDef]:
        """The routes."""
        return [
            web.get("/health", self.health),
            web.get("/ready", self.ready),
            web.get("/manifest", self.manifest),
            web.get("/metrics", self.metrics),
            web.get("/status", self.status),
        ]

    async def health(self, request: web.Request) -> web.Response:
        """Liveness: the event loop answers."""
        return json_response({"status": "ok"})

    async def ready(self, request: web.Request) -> web.Response:
        """Readiness: storage open and bus up (the node only serves once both are)."""
        stats = self.node.statistics()
        return json_response(
            {"status": "ready", "node": stats.node, "capabilities": len(stats.capabilities)}
        )

    async def manifest(self, request: web.Request) -> web.Response:
        """The signed node manifest (spec §7.1)."""
        return json_response(self.node.manifest())

    async def metrics(self, request: web.Request) -> web.Response:
        """Prometheus text format."""
        return web.Response(
            text=self.node.metrics.render(),
            content_type="text/plain",
            charset="utf-8",
            headers={"X-Content-Type-Options": "nosniff"},
        )

    async def status(self, request: web.Request) -> web.Response:
        """The statistics snapshot as JSON (``hearthnet node status``)."""
        return json_response(self.node.statistics().to_json())
