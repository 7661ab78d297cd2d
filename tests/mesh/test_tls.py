"""TLS bound to NodeIDs (spec §3.1): certificates, one port for TLS and plain, who may dial."""

from __future__ import annotations

import asyncio
import datetime as dt
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from hearthnet.community import CommunityStore
from hearthnet.identity import KeyPair, load_or_create_keys
from hearthnet.mesh.tls import (
    client_context,
    ensure_certificate,
    make_certificate,
    own_certificate_key,
    peer_node_id,
)
from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import wait_until


def test_certificate_carries_the_node_key_and_is_remade_for_another(tmp_path: Path) -> None:
    """The certificate's key is the node's; the key file is 0600; a new key gets a new cert."""
    keys = KeyPair.generate()
    cert, key = ensure_certificate(tmp_path, keys)
    first = cert.read_bytes()
    same = ensure_certificate(tmp_path, keys)[0].read_bytes()
    other = ensure_certificate(tmp_path, KeyPair.generate())[0].read_bytes()
    assert (0o600, first, True) == (key.stat().st_mode & 0o777, same, first != other)


def test_certificate_is_a_self_signed_v3_certificate_of_the_node_key(tmp_path: Path) -> None:
    """cryptography reads the hand-made certificate: v3, issued by itself, the node's key,
    a signature that verifies, and a key file holding the node's seed."""
    keys = KeyPair.generate()
    cert_path, key_path = ensure_certificate(tmp_path, keys)
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    cert.verify_directly_issued_by(cert)  # raises unless the signature verifies
    public = cert.public_key()
    assert isinstance(public, Ed25519PublicKey)
    private = serialization.load_pem_private_key(key_path.read_bytes(), None)
    raw = serialization.Encoding.Raw
    assert (
        x509.Version.v3,
        keys.short_id,
        bytes(keys.signing_key.verify_key),
        keys.seed,
        True,
    ) == (
        cert.version,
        cert.subject.rfc4514_string().removeprefix("CN="),
        public.public_bytes(raw, serialization.PublicFormat.Raw),
        private.private_bytes(raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()),
        cert.not_valid_before_utc < cert.not_valid_after_utc,
    )


def test_own_certificate_key_reads_only_the_shape_it_writes() -> None:
    """The key of a made certificate is read back; truncated or other DER gives None."""
    keys = KeyPair.generate()
    der, _ = make_certificate(keys, dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    assert (bytes(keys.signing_key.verify_key), None, None, None) == (
        own_certificate_key(der),
        own_certificate_key(der[:-10]),
        own_certificate_key(b"\x30\x00"),
        own_certificate_key(der.replace(bytes.fromhex("032100"), bytes.fromhex("032101"), 1)),
    )


@asynccontextmanager
async def pair(make_config: MakeConfig, tls: str) -> AsyncIterator[tuple[Node, Node]]:
    """Two nodes of one community (b added by a offline), TLS mode ``tls``, not yet linked."""
    config_a = make_config(node={"tls": tls}, mesh={"dial_interval_s": 0.05})
    config_b = make_config(node={"tls": tls}, mesh={"dial_interval_s": 0.05})
    keys_b = load_or_create_keys(config_b.data_path)
    async with Node(config_a) as a:
        a.add_member(keys_b.node_id)
        CommunityStore(config_b.data_path).replace(list(a.membership.records.values()))
        async with Node(config_b) as b:
            yield a, b


async def test_tls_on_links_over_tls_and_serves_plain_http_on_the_same_port(
    make_config: MakeConfig,
) -> None:
    """With tls=on the link is TLS (the certificate is the peer's key) and HTTP still works."""
    async with pair(make_config, "on") as (a, b):
        b.mesh.book.add(a.url, node=a.keys.node_id)
        await wait_until(lambda: a.keys.node_id in b.mesh.links, what="a TLS link")
        link = b.mesh.links[a.keys.node_id]
        ssl_object = link.ws.get_extra_info("ssl_object")  # type: ignore[attr-defined]
        async with aiohttp.ClientSession() as http:
            async with http.get(a.url + "/health") as plain:
                plain_status = plain.status
            async with http.get(
                a.url.replace("http:", "https:") + "/health", ssl=client_context()
            ) as secure:
                secure_status = secure.status
        assert (a.keys.node_id, 200, 200) == (peer_node_id(ssl_object), plain_status, secure_status)


async def test_plain_peer_link_refused_when_tls_is_required(make_config: MakeConfig) -> None:
    """A node with tls=on refuses a plain peer link with 426."""
    async with (
        pair(make_config, "on") as (a, _),
        aiohttp.ClientSession() as http,
        http.get(
            a.url + "/mesh/v1/peer",
            headers={
                "Upgrade": "websocket",
                "Connection": "Upgrade",
                "Sec-WebSocket-Version": "13",
                "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
                "Sec-WebSocket-Protocol": "hearthnet-peer.v1",
            },
        ) as resp,
    ):
        body: dict[str, Any] = await resp.json()
    assert (426, "upgrade_required") == (resp.status, body["error"])


async def test_certificate_of_another_node_is_refused(make_config: MakeConfig) -> None:
    """Dialling an address expected to be node X that presents node Y's certificate fails."""
    async with pair(make_config, "on") as (a, b):
        impostor_expected = KeyPair.generate().node_id
        b.mesh.book.succeeded(a.url, impostor_expected, 0)  # as if a dial had found it there
        await wait_until(lambda: b.mesh.refused.get("invalid_signature") >= 1, what="the refusal")
        assert a.keys.node_id not in b.mesh.links


async def test_tls_server_rejects_garbage_handshakes(make_config: MakeConfig) -> None:
    """A connection that starts like TLS but is not is dropped; the node serves on."""
    async with pair(make_config, "on") as (a, _):
        host, port = a.url.removeprefix("http://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"\x16\x03\x01\x00\x05hello")
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError, ssl.SSLError)):
            await asyncio.wait_for(reader.readexactly(10), 5)
        writer.close()
        async with aiohttp.ClientSession() as http, http.get(a.url + "/health") as resp:
            assert 200 == resp.status
