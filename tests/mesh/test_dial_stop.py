"""Stopping a node (spec §9): the TLS connection of a link it dialled is closed when the
node has stopped, even when the peer never answers the TLS close."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from pathlib import Path

from hearthnet.community import CommunityStore
from hearthnet.identity import KeyPair, load_or_create_keys
from hearthnet.mesh.tls import ensure_certificate, server_context
from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import closed_by_peer, wait_until


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
            ws = b.mesh.links[a.keys.node_id].ws
            sock = ws.get_extra_info("socket")  # type: ignore[attr-defined]
            assert a.server.gate is not None
            silent = list(a.server.gate.connections)
            for transport in silent:
                transport.pause_reading()  # a answers nothing more, the TLS close included
            b.mesh.dialer.close_grace_s = 0.1
        fd = sock.fileno()
        for transport in silent:
            transport.abort()  # a stops at once too
    assert (True, -1) == (bool(silent), fd)


class MuteTlsPeer:
    """A TLS peer that completes the handshake and then reads nothing and says nothing:
    an upgrade it never answers, a TLS close it never answers."""

    def __init__(self, tmp_path: Path) -> None:
        self.context = server_context(*ensure_certificate(tmp_path, KeyPair.generate()))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.raw: socket.socket | None = None
        self.tls: ssl.SSLSocket | None = None
        self.handshaken = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        self.raw = conn.dup()
        self.tls = self.context.wrap_socket(conn, server_side=True)
        self.handshaken.set()

    def closed_by_dialler(self) -> bool:
        """True when the dialler has closed its socket (EOF or reset)."""
        assert self.raw is not None
        return closed_by_peer(self.raw)

    def close(self) -> None:
        """Close every socket of the peer."""
        for s in (self.tls, self.raw, self.listener):
            if s is not None:
                s.close()


async def test_a_dial_cut_by_the_stop_during_the_upgrade_leaves_no_socket_open(
    make_config: MakeConfig, tmp_path: Path
) -> None:
    """A dial whose TLS is up but whose upgrade is unanswered when the node stops: once
    the node has stopped, its socket is closed."""
    peer = MuteTlsPeer(tmp_path)
    try:
        config = make_config(node={"tls": "on"}, mesh={"dial_interval_s": 0.05})
        async with Node(config) as node:
            node.mesh.dialer.close_grace_s = 0.1
            node.mesh.book.add(f"http://127.0.0.1:{peer.port}")
            handshaken = await asyncio.to_thread(peer.handshaken.wait, 5)
        closed = peer.closed_by_dialler()
    finally:
        peer.close()
    assert (True, True) == (handshaken, closed)
