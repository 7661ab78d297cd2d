"""Starting a node that fails part-way leaves nothing behind (real sockets, real SQLite)."""

from __future__ import annotations

import dataclasses
import socket

import pytest

from hearthnet.errors import HearthNetError
from hearthnet.node import Node
from tests.conftest import MakeConfig


async def test_a_failed_start_releases_the_data_dir_and_the_port(make_config: MakeConfig) -> None:
    """A bad advertise URL fails after the server listens; a port in use fails before.
    Either way the same data dir starts right after, with a good configuration. (Loading
    a configuration refuses such a URL already: it is put in place of a loaded one.)"""
    good = make_config()
    bad_url = dataclasses.replace(
        good, mesh=dataclasses.replace(good.mesh, advertise_url="not a url")
    )
    with pytest.raises(HearthNetError):
        async with Node(bad_url):
            pass
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = make_config(node={"data_dir": str(good.data_path), "port": taken.getsockname()[1]})
        with pytest.raises(HearthNetError, match="cannot listen"):
            async with Node(busy):
                pass
    async with Node(good) as node:
        assert node.url.startswith("http://127.0.0.1:")


async def test_a_second_node_on_a_port_a_node_listens_on_does_not_start(
    make_config: MakeConfig,
) -> None:
    """The listener shares its port with hole punching (SO_REUSEPORT), not with another node."""
    async with Node(make_config()) as first:
        port = int(first.url.rsplit(":", 1)[1])
        with pytest.raises(HearthNetError, match=f"cannot listen on 127.0.0.1:{port}"):
            async with Node(make_config(node={"port": port})):
                pass
        alive = first.server.port
    assert port == alive
