"""Stopping a node (spec §9): the TLS connection of a link it dialled is closed when the
node has stopped, even when the peer never answers the TLS close."""

from __future__ import annotations

import asyncio

from hearthnet.community import CommunityStore
from hearthnet.identity import load_or_create_keys
from hearthnet.mesh.linkread import connection_of
from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import wait_until


async def test_a_dialled_link_whose_tls_close_goes_unanswered_is_closed_at_stop(
    make_config: MakeConfig,
) -> None:
    """b dials a over TLS; a stops reading; once b has stopped, b's socket is closed
    (its TLS close aborted after the grace, not left to the garbage collector)."""
    config_a = make_config(node={"tls": "on"}, mesh={"dial_interval_s": 0.05})
    config_b = make_config(node={"tls": "on"}, mesh={"dial_interval_s": 0.05})
    keys_b = load_or_create_keys(config_b.data_path)
    silent: list[asyncio.Transport] = []
    async with Node(config_a) as a:
        a.add_member(keys_b.node_id)
        CommunityStore(config_b.data_path).replace(list(a.membership.records.values()))
        async with Node(config_b) as b:
            b.mesh.book.add(a.url, node=a.keys.node_id)
            await wait_until(lambda: a.keys.node_id in b.mesh.links, what="a TLS link")
            connection = connection_of(b.mesh.links[a.keys.node_id].ws)
            assert connection is not None
            sock = connection[0].get_extra_info("socket")
            assert a.server.gate is not None
            silent = list(a.server.gate.connections)
            for transport in silent:
                transport.pause_reading()  # a answers nothing more, the TLS close included
            b.mesh.dialer.close_grace_s = 0.1
        fd = sock.fileno()
        for transport in silent:
            transport.abort()  # a stops at once too
    assert (1, -1) == (len(silent), fd)
