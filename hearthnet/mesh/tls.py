"""TLS bound to NodeIDs (spec §3.1): no certificate authority, no trust on first use.

A node's certificate is self-signed with the node's own ed25519 key (the key behind its
NodeID), so a peer checks the certificate by comparing its public key with the NodeID it
expects: the handshake of :mod:`hearthnet.mesh.protocol` proves the same key again.

The certificate and its key live in ``<data_dir>/tls/`` (the key 0600); they are made on
first use and remade if they no longer match the node's key.
"""

from __future__ import annotations

import datetime as dt
import os
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import NameOID

from hearthnet.errors import InvalidSignature
from hearthnet.identity import KeyPair
from hearthnet.ids import node_id_from_public_key

VALID_DAYS = 3650


def _raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def ensure_certificate(data_dir: Path, keys: KeyPair) -> tuple[Path, Path]:
    """The node's certificate and key files, made (or remade) to match ``keys``."""
    directory = data_dir / "tls"
    cert_path, key_path = directory / "node.crt", directory / "node.key"
    if cert_path.exists() and key_path.exists():
        try:
            cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
            public = cert.public_key()
            if (
                isinstance(public, Ed25519PublicKey)
                and node_id_from_public_key(_raw_public(public)) == keys.node_id
            ):
                return cert_path, key_path
        except ValueError:
            pass  # unreadable: make a new one below
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    private = Ed25519PrivateKey.from_private_bytes(keys.seed)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, keys.short_id)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=VALID_DAYS))
        .sign(private, None)
    )
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(
            private.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def server_context(cert_path: Path, key_path: Path) -> ssl.SSLContext:
    """TLS 1.3 server context with the node's certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(cert_path, key_path)
    return ctx


def client_context() -> ssl.SSLContext:
    """TLS 1.3 client context that defers the identity check to :func:`peer_node_id`."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False  # peers are known by key, not by host name
    ctx.verify_mode = ssl.CERT_NONE  # checked by key below: no CA, no TOFU
    return ctx


def peer_node_id(ssl_object: ssl.SSLObject | ssl.SSLSocket | None) -> str:
    """The NodeID whose key the peer's certificate carries.

    Raises:
        InvalidSignature: no certificate, or not an ed25519 one.
    """
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        raise InvalidSignature("the peer presented no certificate")
    public = x509.load_der_x509_certificate(der).public_key()
    if not isinstance(public, Ed25519PublicKey):
        raise InvalidSignature("the peer's certificate is not an ed25519 key")
    return node_id_from_public_key(_raw_public(public))
