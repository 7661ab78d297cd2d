"""RFC 6962 Merkle trees: known answers, the RFC's recursive definitions, round trips."""

from __future__ import annotations

from hashlib import sha256

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hearthnet.pubsub.merkle import EMPTY_ROOT, MerkleTree, leaf_hash, node_hash, root_from_path

# The eight leaves of the Certificate Transparency reference tests, and the tree heads of
# their first 1..8 leaves (computed by the CT reference implementation, not by this code).
CT_LEAVES = [
    "",
    "00",
    "10",
    "2021",
    "3031",
    "40414243",
    "5051525354555657",
    "606162636465666768696a6b6c6d6e6f",
]
CT_ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]


def _mth(leaves: list[bytes]) -> bytes:
    """RFC 6962 §2.1 MTH, written from the definition (k: largest power of two < n)."""
    n = len(leaves)
    if n == 0:
        return sha256(b"").digest()
    if n == 1:
        return sha256(b"\x00" + leaves[0]).digest()
    k = 1
    while k * 2 < n:
        k *= 2
    return sha256(b"\x01" + _mth(leaves[:k]) + _mth(leaves[k:])).digest()


def _path(m: int, leaves: list[bytes]) -> list[bytes]:
    """RFC 6962 §2.1.1 PATH(m, D[n]), from the definition."""
    n = len(leaves)
    if n == 1:
        return []
    k = 1
    while k * 2 < n:
        k *= 2
    if m < k:
        return [*_path(m, leaves[:k]), _mth(leaves[k:])]
    return [*_path(m - k, leaves[k:]), _mth(leaves[:k])]


def _tree(leaves: list[bytes]) -> MerkleTree:
    return MerkleTree([leaf_hash(x) for x in leaves])


def test_ct_known_roots() -> None:
    """The tree heads of the CT reference leaves are the published ones."""
    leaves = [bytes.fromhex(x) for x in CT_LEAVES]
    expected = CT_ROOTS
    actual = [_tree(leaves[:n]).root.hex() for n in range(1, 9)]
    assert expected == actual


def test_ct_known_paths() -> None:
    """Audit paths in the 8-leaf CT tree match the RFC's PATH definition, and verify."""
    leaves = [bytes.fromhex(x) for x in CT_LEAVES]
    for n in range(1, 9):
        tree = _tree(leaves[:n])
        for m in range(n):
            assert _path(m, leaves[:n]) == tree.path(m)
            assert tree.root == root_from_path(leaf_hash(leaves[m]), m, n, tree.path(m))


def test_empty_root_and_prefixes() -> None:
    """The empty tree is SHA-256 of nothing; leaf and node hashes carry 0x00 and 0x01."""
    expected = (
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        sha256(b"\x00abc").digest(),
        sha256(b"\x01" + b"a" * 32 + b"b" * 32).digest(),
    )
    actual = (EMPTY_ROOT.hex(), leaf_hash(b"abc"), node_hash(b"a" * 32, b"b" * 32))
    assert expected == actual


def test_no_leaves_refused() -> None:
    """A tree of no leaves is refused (a batch always holds a message)."""
    with pytest.raises(ValueError, match="at least one leaf"):
        MerkleTree([])


@settings(max_examples=60)
@given(st.lists(st.binary(max_size=40), min_size=1, max_size=70), st.data())
def test_matches_rfc_definition_and_round_trips(leaves: list[bytes], data: st.DataObject) -> None:
    """For any leaves: the root is RFC 6962 MTH, each path is PATH, and each path verifies."""
    tree = _tree(leaves)
    m = data.draw(st.integers(0, len(leaves) - 1))
    assert (_mth(leaves), _path(m, leaves)) == (tree.root, tree.path(m))
    assert tree.root == root_from_path(leaf_hash(leaves[m]), m, len(leaves), tree.path(m))


@settings(max_examples=60)
@given(st.lists(st.binary(max_size=8), min_size=2, max_size=40), st.data())
def test_wrong_proofs_fail(leaves: list[bytes], data: st.DataObject) -> None:
    """A path with another leaf, a hash changed, dropped or added, or a bad index fails."""
    n = len(leaves)
    tree = _tree(leaves)
    m = data.draw(st.integers(0, n - 1))
    path = tree.path(m)
    assert tree.root != root_from_path(leaf_hash(leaves[m] + b"!"), m, n, path)
    assert tree.root != root_from_path(leaf_hash(leaves[m]), m, n, [*path, b"\0" * 32])
    assert tree.root != root_from_path(leaf_hash(leaves[m]), m, n, path[:-1])
    if path:
        bad = [*path]
        bad[0] = bytes(32)
        assert tree.root != root_from_path(leaf_hash(leaves[m]), m, n, bad)
    assert root_from_path(leaf_hash(leaves[m]), n, n, path) is None
