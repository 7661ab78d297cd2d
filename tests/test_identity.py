"""Keys on disk and signatures (spec §1.2–1.3)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hearthnet.errors import IdentityError, InvalidSignature
from hearthnet.identity import KeyPair, load_or_create_keys, verify_object
from hearthnet.ids import signature_to_str


def test_keys_created_on_first_start_with_mode_0600(tmp_path: Path) -> None:
    """First start creates a 32-byte seed readable only by its owner, and node.pub."""
    keys = load_or_create_keys(tmp_path)
    seed = tmp_path / "keys" / "node.ed25519"
    assert (0o600, 32, keys.node_id + "\n") == (
        seed.stat().st_mode & 0o777,
        len(seed.read_bytes()),
        (tmp_path / "keys" / "node.pub").read_text(),
    )


def test_keys_survive_restart(tmp_path: Path) -> None:
    """The same data dir gives the same identity."""
    assert load_or_create_keys(tmp_path).node_id == load_or_create_keys(tmp_path).node_id


def test_group_readable_key_refused(tmp_path: Path) -> None:
    """A seed file readable by group or others stops the node (like ssh)."""
    load_or_create_keys(tmp_path)
    os.chmod(tmp_path / "keys" / "node.ed25519", 0o640)
    with pytest.raises(IdentityError, match="chmod 600"):
        load_or_create_keys(tmp_path)


def test_mismatched_public_file_refused(tmp_path: Path) -> None:
    """A node.pub that does not match the seed is refused."""
    load_or_create_keys(tmp_path)
    (tmp_path / "keys" / "node.pub").write_text(KeyPair.generate().node_id)
    with pytest.raises(IdentityError, match="does not match"):
        load_or_create_keys(tmp_path)


def test_signature_verifies_and_tampering_fails() -> None:
    """A signature over an object verifies; any change to the object breaks it."""
    keys = KeyPair.generate()
    obj = {"a": 1, "b": [1, 2, {"c": "d"}]}
    sig = keys.sign_object(obj)
    verify_object(keys.node_id, obj, sig)
    with pytest.raises(InvalidSignature):
        verify_object(keys.node_id, {**obj, "a": 2}, sig)
    with pytest.raises(InvalidSignature):
        verify_object(KeyPair.generate().node_id, obj, sig)
    with pytest.raises(InvalidSignature):
        verify_object(keys.node_id, obj, "ed25519:short")


def test_sig_field_left_out_before_signing() -> None:
    """sign_object(obj, 'sig') signs the object without its sig field."""
    keys = KeyPair.generate()
    obj: dict[str, object] = {"x": 1}
    obj["sig"] = keys.sign_object(obj)
    verify_object(keys.node_id, obj, obj["sig"], "sig")


# RFC 8032 §7.1, tests 1 and 2: (secret key, message, signature), hex.
RFC8032 = [
    (
        "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
        "",
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
    ),
    (
        "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
        "72",
        "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
    ),
]


@pytest.mark.parametrize(("seed", "message", "signature"), RFC8032)
def test_sign_bytes_gives_rfc8032_signatures(seed: str, message: str, signature: str) -> None:
    """Signing with the key pair's libsodium secret gives RFC 8032's signatures, and the
    secret stays out of the key pair's repr."""
    keys = KeyPair.from_seed(bytes.fromhex(seed))
    assert keys.sign_bytes(bytes.fromhex(message)) == signature_to_str(bytes.fromhex(signature))
    assert (keys.secret.hex() in repr(keys), seed in repr(keys)) == (False, False)
