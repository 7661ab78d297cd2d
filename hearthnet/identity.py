"""Ed25519 identities: key pairs, signing JCS objects, and keys on disk (spec §1.1–1.3).

``<data_dir>/keys/node.ed25519`` holds the 32-byte seed (mode 0600); ``node.pub`` the
NodeID. A key file readable by group or others is refused, as ssh does.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nacl.bindings import crypto_sign, crypto_sign_seed_keypair
from nacl.exceptions import BadSignatureError
from nacl.signing import SigningKey, VerifyKey

from hearthnet.canonical import canonicalize, canonicalize_without
from hearthnet.errors import BadRequest, IdentityError, InvalidSignature
from hearthnet.ids import (
    node_id_from_public_key,
    public_key_from_node_id,
    short_id,
    signature_from_str,
    signature_to_str,
)

SEED_FILE = "node.ed25519"
PUBLIC_FILE = "node.pub"


@dataclass(frozen=True, slots=True)
class KeyPair:
    """An ed25519 key pair and its NodeID."""

    signing_key: SigningKey
    node_id: str
    # libsodium's 64-byte secret key (seed and public key) of ``signing_key``: signed with
    # directly, without PyNaCl's SignedMessage and encoder calls around each signature
    # (~3 µs of a ~28 µs signature; a lone publish signs once on the event loop).
    secret: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _, secret = crypto_sign_seed_keypair(bytes(self.signing_key))
        object.__setattr__(self, "secret", secret)  # frozen: set once, here

    @classmethod
    def from_seed(cls, seed: bytes) -> KeyPair:
        """Build from a 32-byte seed."""
        if len(seed) != 32:
            raise IdentityError("an ed25519 seed has 32 bytes")
        key = SigningKey(seed)
        return cls(key, node_id_from_public_key(bytes(key.verify_key)))

    @classmethod
    def generate(cls) -> KeyPair:
        """A fresh random key pair."""
        return cls.from_seed(os.urandom(32))

    @property
    def seed(self) -> bytes:
        """The 32-byte private seed."""
        return bytes(self.signing_key)

    @property
    def short_id(self) -> str:
        """The display id (spec §1.1)."""
        return short_id(self.node_id)

    def sign_bytes(self, message: bytes) -> str:
        """Sign raw bytes; returns the ``ed25519:...`` signature string."""
        return signature_to_str(crypto_sign(message, self.secret)[:64])

    def sign_object(self, obj: dict[str, Any], *omit: str) -> str:
        """Sign the JCS form of ``obj`` without the named fields."""
        return self.sign_bytes(canonicalize_without(obj, *omit) if omit else canonicalize(obj))


_VERIFY_KEYS: dict[str, VerifyKey] = {}
_VERIFY_KEYS_MAX = 4096


def _verify_key(node_id: str) -> VerifyKey:
    # Parsing a NodeID into a VerifyKey costs more than the lookup; callers repeat.
    key = _VERIFY_KEYS.get(node_id)
    if key is None:
        key = VerifyKey(public_key_from_node_id(node_id))
        if len(_VERIFY_KEYS) >= _VERIFY_KEYS_MAX:
            _VERIFY_KEYS.clear()
        _VERIFY_KEYS[node_id] = key
    return key


def verify_bytes(node_id: str, message: bytes, signature: object) -> None:
    """Verify ``signature`` (a signature string) over ``message`` by ``node_id``.

    Raises:
        InvalidSignature: malformed signature, malformed NodeID, or no match.
    """
    try:
        raw = signature_from_str(signature)
        key = _verify_key(node_id)
    except BadRequest as exc:
        raise InvalidSignature(exc.message) from exc
    try:
        key.verify(message, raw)
    except BadSignatureError as exc:
        raise InvalidSignature("signature does not verify") from exc


def verify_object(node_id: str, obj: dict[str, Any], signature: object, *omit: str) -> None:
    """Verify a signature over the JCS form of ``obj`` without the named fields."""
    try:
        message = canonicalize_without(obj, *omit) if omit else canonicalize(obj)
    except BadRequest as exc:
        raise InvalidSignature(f"cannot canonicalize signed object: {exc.message}") from exc
    verify_bytes(node_id, message, signature)


def load_or_create_keys(data_dir: Path) -> KeyPair:
    """Load the node's key pair from ``data_dir/keys``, creating it on first start.

    Raises:
        IdentityError: the seed file is malformed, or readable by group or others
            (fix with ``chmod 600``), or the public file does not match the seed.
    """
    keys_dir = data_dir / "keys"
    seed_path = keys_dir / SEED_FILE
    pub_path = keys_dir / PUBLIC_FILE
    if not seed_path.exists():
        keys_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        pair = KeyPair.generate()
        # O_EXCL: two nodes racing on one data dir must not overwrite each other's key.
        try:
            fd = os.open(seed_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return load_or_create_keys(data_dir)
        with os.fdopen(fd, "wb") as f:
            f.write(pair.seed)
        pub_path.write_text(pair.node_id + "\n", encoding="ascii")
        return pair
    mode = stat.S_IMODE(seed_path.stat().st_mode)
    if mode & 0o077:
        raise IdentityError(
            f"{seed_path} is readable by group or others (mode {mode:o}); "
            f"run: chmod 600 {seed_path}"
        )
    seed = seed_path.read_bytes()
    if len(seed) != 32:
        raise IdentityError(f"{seed_path} must hold a 32-byte ed25519 seed")
    pair = KeyPair.from_seed(seed)
    if pub_path.exists():
        recorded = pub_path.read_text(encoding="ascii").strip()
        if recorded != pair.node_id:
            raise IdentityError(f"{pub_path} does not match {seed_path}")
    else:
        pub_path.write_text(pair.node_id + "\n", encoding="ascii")
    return pair
