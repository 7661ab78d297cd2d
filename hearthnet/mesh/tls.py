"""TLS bound to NodeIDs (spec §3.1): no certificate authority, no trust on first use.

A node's certificate is self-signed with the node's own ed25519 key (the key behind its
NodeID), so a peer checks the certificate by comparing its public key with the NodeID it
expects: the handshake of :mod:`hearthnet.mesh.protocol` proves the same key again.

The certificate and its key live in ``<data_dir>/tls/`` (the key 0600); they are made on
first use and remade if they no longer match the node's key.

The node's own certificate is written and checked here in DER by hand (one fixed shape,
signed with the node's key), so that starting a node does not load ``cryptography``
(about 8 MiB of an idle node's memory, spec §11); a peer's certificate, which may be
anything, is read by ``cryptography``, imported when the first TLS link is checked.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import secrets
import ssl
import stat
from pathlib import Path

from hearthnet.errors import IdentityError, InvalidSignature
from hearthnet.identity import KeyPair
from hearthnet.ids import node_id_from_public_key

VALID_DAYS = 3650

# DER pieces of RFC 8410: the ed25519 AlgorithmIdentifier, the SubjectPublicKeyInfo up to
# the 32 key bytes, and the PKCS #8 private key up to the 32 seed bytes.
_ED25519 = bytes.fromhex("300506032b6570")
_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")
_PKCS8_PREFIX = bytes.fromhex("302e020100300506032b657004220420")
_COMMON_NAME = bytes.fromhex("0603550403")  # OID 2.5.4.3
_V3 = bytes.fromhex("a003020102")  # [0] EXPLICIT INTEGER 2


def _der(tag: int, content: bytes) -> bytes:
    size = len(content)
    if size < 0x80:
        return bytes((tag, size)) + content
    raw = size.to_bytes((size.bit_length() + 7) // 8, "big")
    return bytes((tag, 0x80 | len(raw))) + raw + content


def _time(when: dt.datetime) -> bytes:
    # RFC 5280 §4.1.2.5: UTCTime through 2049, GeneralizedTime from 2050
    if when.year < 2050:
        return _der(0x17, when.strftime("%y%m%d%H%M%SZ").encode("ascii"))
    return _der(0x18, when.strftime("%Y%m%d%H%M%SZ").encode("ascii"))


def _name(common_name: str) -> bytes:
    attribute = _der(0x30, _COMMON_NAME + _der(0x0C, common_name.encode("utf-8")))
    return _der(0x30, _der(0x31, attribute))


def _pem(label: str, der: bytes) -> bytes:
    text = base64.b64encode(der).decode("ascii")
    lines = [text[i : i + 64] for i in range(0, len(text), 64)]
    return "\n".join([f"-----BEGIN {label}-----", *lines, f"-----END {label}-----", ""]).encode(
        "ascii"
    )


def _unpem(data: bytes, label: str) -> bytes | None:
    begin, end = f"-----BEGIN {label}-----".encode(), f"-----END {label}-----".encode()
    start, stop = data.find(begin), data.find(end)
    if start < 0 or stop < start:
        return None
    try:
        return base64.b64decode(b"".join(data[start + len(begin) : stop].split()), validate=True)
    except ValueError:
        return None


def _children(der: bytes, start: int, stop: int) -> list[tuple[int, int, int]]:
    """The DER elements between ``start`` and ``stop``: (tag, content start, content end).

    Raises:
        ValueError: not well-formed DER.
    """
    out = []
    at = start
    while at < stop:
        if at + 2 > stop:
            raise ValueError("truncated DER")
        tag, size = der[at], der[at + 1]
        at += 2
        if size & 0x80:
            width = size & 0x7F
            if not 1 <= width <= 4 or at + width > stop:
                raise ValueError("bad DER length")
            size = int.from_bytes(der[at : at + width], "big")
            at += width
        if at + size > stop:
            raise ValueError("truncated DER")
        out.append((tag, at, at + size))
        at += size
    return out


def own_certificate_key(der: bytes) -> bytes | None:
    """The 32-byte ed25519 public key of a certificate of the shape
    :func:`make_certificate` writes, or None for any other shape (remade then)."""
    try:
        (cert,) = _children(der, 0, len(der))
        tbs = _children(der, cert[1], cert[2])[0]
        fields = _children(der, tbs[1], tbs[2])
    except (ValueError, IndexError):
        return None
    # version, serial, signature algorithm, issuer, validity, subject, key
    if len(fields) < 7 or fields[0][0] != 0xA0:
        return None
    _, key_start, key_end = fields[6]
    spki = der[key_start - 2 : key_end]
    if len(spki) != len(_SPKI_PREFIX) + 32 or not spki.startswith(_SPKI_PREFIX):
        return None
    return spki[len(_SPKI_PREFIX) :]


def make_certificate(keys: KeyPair, now: dt.datetime) -> tuple[bytes, bytes]:
    """A self-signed X.509 v3 certificate of ``keys`` (DER) and its PKCS #8 key (DER)."""
    name = _name(keys.short_id)
    serial = bytearray(secrets.token_bytes(20))
    serial[0] = (serial[0] & 0x7F) | 0x40  # positive, 20 bytes: RFC 5280 §4.1.2.2
    validity = _der(
        0x30,
        _time(now - dt.timedelta(days=1)) + _time(now + dt.timedelta(days=VALID_DAYS)),
    )
    public = bytes(keys.signing_key.verify_key)
    tbs = _der(
        0x30,
        _V3 + _der(0x02, bytes(serial)) + _ED25519 + name + validity + name + _SPKI_PREFIX + public,
    )
    signature = keys.signing_key.sign(tbs).signature
    cert = _der(0x30, tbs + _ED25519 + _der(0x03, b"\x00" + signature))
    return cert, _PKCS8_PREFIX + keys.seed


def ensure_certificate(data_dir: Path, keys: KeyPair) -> tuple[Path, Path]:
    """The node's certificate and key files, made (or remade) to match ``keys``.

    Raises:
        IdentityError: the key file is readable by group or others: it holds the node's
            seed, refused there as in ``keys/`` (spec §1.1).
    """
    directory = data_dir / "tls"
    cert_path, key_path = directory / "node.crt", directory / "node.key"
    if key_path.exists() and (mode := stat.S_IMODE(key_path.stat().st_mode)) & 0o077:
        raise IdentityError(
            f"{key_path} is readable by group or others (mode {mode:o}) and holds the node's"
            f" private key; run: chmod 600 {key_path}"
        )
    if cert_path.exists() and key_path.exists():
        cert = _unpem(cert_path.read_bytes(), "CERTIFICATE")
        key = _unpem(key_path.read_bytes(), "PRIVATE KEY")
        public = own_certificate_key(cert) if cert is not None else None
        if (
            public is not None
            and node_id_from_public_key(public) == keys.node_id
            and key == _PKCS8_PREFIX + keys.seed
        ):
            return cert_path, key_path
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    cert, key = make_certificate(keys, dt.datetime.now(dt.UTC))
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(_pem("PRIVATE KEY", key))
    cert_path.write_bytes(_pem("CERTIFICATE", cert))
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
    # imported on the first TLS link, not at start (see the module's docstring)
    from cryptography import x509  # noqa: PLC0415
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PublicKey,
    )

    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    if not der:
        raise InvalidSignature("the peer presented no certificate")
    public = x509.load_der_x509_certificate(der).public_key()
    if not isinstance(public, Ed25519PublicKey):
        raise InvalidSignature("the peer's certificate is not an ed25519 key")
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return node_id_from_public_key(raw)
