"""Keys on disk and signatures (spec §1.2–1.3)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hearthnet.errors import IdentityError, InvalidSignature
from hearthnet.identity import KeyPair, load_or_create_keys, verify_object


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
