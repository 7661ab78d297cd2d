"""What the mesh tests share: the relayed set-up of the path-switch and relaying tests, a
relay and two members that reach each other only through it (spec §8), started once for
the session; the same three nodes with the demo model on b, started per test, for the
calls pinned to b; and a loopback WebSocket server for the link-level tests."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from hearthnet.config import Config, load_config
from hearthnet.mesh.addresses import normalize_url
from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import wait_until
from tests.mesh.test_relaying import one_community, path_to, relayed_to


@dataclass
class RelayedTrio:
    """Relay R with members a and b attached to it, each undiallable by the other."""

    relay: Node
    a: Node
    b: Node

    def paths(self) -> tuple[str | None, str | None]:
        """The path from a to b and from b to a."""
        return path_to(self.a, self.b), path_to(self.b, self.a)

    def cut(self) -> None:
        """Cut a's direct link to b at its socket (both ends see it die, no ``bye``), and
        keep a from dialling b's URL again."""
        self.a.mesh.book.addresses.pop(normalize_url(self.b.url), None)
        link = self.a.mesh.links[self.b.keys.node_id]
        sock: socket.socket = link.ws.get_extra_info("socket")  # type: ignore[attr-defined]
        sock.shutdown(socket.SHUT_RDWR)

    async def relayed(self) -> None:
        """Back to a and b relayed to each other (a direct link a test made is cut)."""
        if "direct" in self.paths():
            self.cut()
        await wait_until(lambda: self.paths() == ("relayed", "relayed"), 20, "a, b relayed")


def _config(base: Path, i: int, **mesh: object) -> Config:
    overrides = {
        "node": {"data_dir": str(base / f"node{i}"), "host": "127.0.0.1", "port": 0},
        "mesh": {"zeroconf": False, **mesh},
    }
    return load_config(None, env={}, overrides=overrides)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def relayed_session(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RelayedTrio]:
    """The three nodes, started once."""
    base = tmp_path_factory.mktemp("relayed")
    configs = [_config(base, 0, relay=True), _config(base, 1), _config(base, 2)]
    one_community(configs)
    async with (
        Node(configs[0]) as relay,
        Node(relayed_to(configs[1], relay.url)) as a,
        Node(relayed_to(configs[2], relay.url)) as b,
    ):
        yield RelayedTrio(relay, a, b)


@pytest_asyncio.fixture(loop_scope="session")
async def relayed_trio(relayed_session: RelayedTrio) -> RelayedTrio:
    """The shared nodes, a and b relayed to each other (tests using it run in the
    session's event loop: ``pytest.mark.asyncio(loop_scope="session")``)."""
    await relayed_session.relayed()
    return relayed_session


@pytest.fixture
async def chat_trio(make_config: MakeConfig) -> AsyncIterator[RelayedTrio]:
    """A relay and members a and b relayed to each other, b running the demo model; ready
    when a knows b's capabilities."""
    configs = [make_config(mesh={"relay": True}), make_config(), make_config(llm={"demo": True})]
    one_community(configs)
    async with (
        Node(configs[0]) as relay,
        Node(relayed_to(configs[1], relay.url)) as a,
        Node(relayed_to(configs[2], relay.url)) as b,
    ):
        await wait_until(
            lambda: path_to(a, b) == "relayed" and b.keys.node_id in a.router.remote,
            15,
            "a relayed to b, with b's capabilities",
        )
        yield RelayedTrio(relay, a, b)


WsSession = Callable[[web.WebSocketResponse], Awaitable[None]]
ServeWs = Callable[..., Awaitable[TestServer]]  # (session, **WebSocketResponse options)


@pytest.fixture
async def serve_ws() -> AsyncIterator[ServeWs]:
    """Starts loopback servers (port 0) that run ``session`` on each WebSocket accepted at
    ``/``, made with the given ``web.WebSocketResponse`` options; closed after the test."""
    servers: list[TestServer] = []

    async def start(session: WsSession, **options: Any) -> TestServer:
        async def handler(request: web.Request) -> web.WebSocketResponse:
            ws = web.WebSocketResponse(**options)
            await ws.prepare(request)
            await session(ws)
            return ws

        app = web.Application()
        app.router.add_get("/", handler)
        server = TestServer(app, host="127.0.0.1", port=0)
        await server.start_server()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.close()
