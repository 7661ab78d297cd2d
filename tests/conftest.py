"""Fixtures: configurations on temporary data dirs, in-process nodes, clients."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import settings

from hearthnet.client import Client
from hearthnet.config import Config, load_config
from hearthnet.node import Node
from tests.helpers import CleanupLog, Crash, Sleepy, SlowStream

MakeConfig = Callable[..., Config]

# Hypothesis's per-example deadline is a wall-clock assert; on a shared 2-core CI machine it
# fails tests whose property holds. Speed is measured in bench/, not here.
settings.register_profile("hearthnet", deadline=None)
settings.load_profile("hearthnet")

_EMPTY_HOME: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    """Run every test, and every process a test starts, with an empty home directory: no
    test may pass because this machine's ``~/.local/share/hearthnet`` holds keys, ..."""
    home = tempfile.mkdtemp(prefix="hearthnet-test-home-")
    _EMPTY_HOME.append(home)
    os.environ["HOME"] = home
    # nor because of the environment it was started from (HEARTHNET_<SECTION>_<KEY>);
    # HEARTHNET_FUZZ_* are the fuzz suite's own knobs (tests/fuzz/budget.py), no section's
    for name in [n for n in os.environ if n.startswith(("HEARTHNET_", "XDG_"))]:
        if not name.startswith("HEARTHNET_FUZZ_"):
            del os.environ[name]


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove the empty home made for the run."""
    for home in _EMPTY_HOME:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def make_config(tmp_path: Path) -> MakeConfig:
    """Build a loopback, port-0 configuration; keyword args are ``section={key: value}``."""
    counter = iter(range(1000))

    def make(**sections: dict[str, Any]) -> Config:
        overrides: dict[str, dict[str, Any]] = {
            "node": {
                "data_dir": str(tmp_path / f"node{next(counter)}"),
                "host": "127.0.0.1",
                "port": 0,
                "name": "test",
            },
            # In-process test nodes stay off the LAN; discovery has its own tests.
            "mesh": {"zeroconf": False},
        }
        for name, values in sections.items():
            overrides.setdefault(name, {}).update(values)
        return load_config(None, env={}, overrides=overrides)

    return make


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A plain aiohttp session (not our client), for raw HTTP and WebSocket requests."""
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.fixture
def cleanup_log() -> CleanupLog:
    """Where test capabilities record their cleanup."""
    return CleanupLog()


@pytest.fixture
def test_capabilities(cleanup_log: CleanupLog) -> list[Any]:
    """Capabilities the transport tests exercise."""
    return [SlowStream(cleanup_log), Crash(), Sleepy()]


@pytest.fixture
async def node(make_config: MakeConfig, test_capabilities: list[Any]) -> AsyncIterator[Node]:
    """A running in-process node on a free loopback port."""
    async with Node(make_config(), extra_capabilities=test_capabilities) as n:
        yield n


@pytest.fixture
async def client(node: Node) -> AsyncIterator[Client]:
    """A client signing with the node's own key (a member, not rate limited)."""
    async with Client(node.url, keys=node.keys) as c:
        yield c
