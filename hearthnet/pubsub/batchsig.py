"""Batch signatures for pub/sub messages (spec §6.2). Pure.

The origin signs once per group commit: the messages of a run of consecutive
``origin_seq`` values are the leaves of an RFC 6962 Merkle tree (leaf = JCS of the message
without ``sig``), and the origin signs the JCS form of
``{"origin", "first_origin_seq", "n", "root"}`` (``root`` in base64url). Each message then
carries ``sig: {"batch": "ed25519:...", "first", "n", "path": [base64url hashes]}`` and
stays verifiable alone: its leaf and path give the root, the root and the batch signature
the origin. A message's place in the tree is ``origin_seq - first``.

:class:`SignedBatch` is one signed batch: its signature and leaf hashes, from which each
message's proof is made when it is first needed (the log stores a batch once and its
messages without ``sig``).

:class:`BatchVerifier` remembers the batch statements whose signature it checked (bounded),
so a node pays for one ed25519 verification per batch, not per message; each message
still costs its leaf hash and path (a few SHA-256).
"""

from __future__ import annotations

import re
import threading
from binascii import a2b_base64, b2a_base64
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from hearthnet.canonical import canonicalize
from hearthnet.errors import InvalidSignature
from hearthnet.identity import KeyPair, verify_bytes
from hearthnet.ids import b64url_encode
from hearthnet.pubsub.merkle import MerkleTree, leaf_hash, root_from_path

MAX_BATCH = 65_536  # messages under one batch signature (a path of at most 16 hashes)
MAX_PATH = 16
VERIFIED_BATCHES = 4096  # batch statements a verifier remembers (LRU)
_SIG_FIELDS = frozenset({"batch", "first", "n", "path"})
_HASH_TEXT = re.compile(r"[A-Za-z0-9_-]{43}")
_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")
_TO_URLSAFE = bytes.maketrans(b"+/", b"-_")


def batch_statement(origin: str, first: int, n: int, root: bytes) -> bytes:
    """The bytes the origin signs for a batch: JCS of the statement object."""
    return canonicalize(
        {"origin": origin, "first_origin_seq": first, "n": n, "root": b64url_encode(root)}
    )


class SignedBatch:
    """One batch signature with the leaf hashes of its tree: each message's proof (its
    ``sig`` object and that object's JSON) is made on demand, from the tree built once.

    The log stores a batch once (origin, first, n, root, signature, leaf hashes) and its
    messages without ``sig``; a proof is made only when a message goes out with ``sig``
    (gossip, subscribers that verify, history with ``sig``). Safe to share between
    threads: building the tree twice in a race gives the same tree.
    """

    __slots__ = ("_head", "_paths", "_tree", "first", "leaves", "n", "origin", "signature")

    def __init__(
        self,
        origin: str,
        first: int,
        signature: str,
        leaves: Sequence[bytes],
        tree: MerkleTree | None = None,
    ) -> None:
        if not 1 <= len(leaves) <= MAX_BATCH:
            raise ValueError(f"a batch holds 1 to {MAX_BATCH} messages")
        self.origin = origin
        self.first = first
        self.n = len(leaves)
        self.signature = signature
        self.leaves = leaves
        self._tree = tree
        self._head = f'{{"batch":"{signature}","first":{first},"n":{self.n},"path":'
        self._paths: list[list[str]] | None = None

    @classmethod
    def sign(cls, keys: KeyPair, first: int, leaves: Sequence[bytes]) -> SignedBatch:
        """Sign the batch of these leaf hashes (:func:`leaf_hash` of each message's JCS
        without ``sig``, in ``origin_seq`` order from ``first``). One ed25519 signature."""
        if not 1 <= len(leaves) <= MAX_BATCH:
            raise ValueError(f"a batch holds 1 to {MAX_BATCH} messages")
        tree = MerkleTree(leaves)
        signature = keys.sign_bytes(batch_statement(keys.node_id, first, tree.size, tree.root))
        return cls(keys.node_id, first, signature, leaves, tree)

    @property
    def tree(self) -> MerkleTree:
        """The Merkle tree over the leaves (built on first use)."""
        if self._tree is None:
            self._tree = MerkleTree(self.leaves)
        return self._tree

    @property
    def root(self) -> bytes:
        """The tree head the signature covers."""
        return self.tree.root

    def _all_paths(self) -> list[list[str]]:
        """Every leaf's audit path as base64url text, made at once for the batch: each tree
        node is encoded once, and every leaf under a node gets that node's sibling
        appended, level by level from the leaves up (the path's order)."""
        paths = self._paths
        if paths is None:
            n = self.n
            paths = [[] for _ in range(n)]
            for depth, level in enumerate(self.tree.levels[:-1]):
                width = len(level)
                for pos in range(width):
                    sibling = pos ^ 1
                    if sibling < width:
                        # 32 bytes: one "=" of padding to drop
                        b64 = b2a_base64(level[sibling], newline=False)[:-1]
                        text = b64.translate(_TO_URLSAFE).decode()
                        for leaf in range(pos << depth, min((pos + 1) << depth, n)):
                            paths[leaf].append(text)
            self._paths = paths
        return paths

    def proof(self, origin_seq: int) -> tuple[dict[str, Any], bytes]:
        """Message ``origin_seq``'s ``sig`` object and its JSON bytes (what ``orjson.dumps``
        gives). The first proof asked for makes every path of the batch (cheaper than one
        path at a time once a few are needed: gossip and verifying subscribers take them
        all)."""
        index = origin_seq - self.first
        if not 0 <= index < self.n:
            raise IndexError(f"origin_seq {origin_seq} is not in this batch")
        path = self._all_paths()[index]
        sig = {"batch": self.signature, "first": self.first, "n": self.n, "path": path}
        # base64url text needs no JSON escape
        tail = '["' + '","'.join(path) + '"]}' if path else "[]}"
        return sig, (self._head + tail).encode()


def sign_batch(
    keys: KeyPair, first: int, leaves: Sequence[bytes]
) -> tuple[list[dict[str, Any]], list[bytes]]:
    """The ``sig`` object of each message of a batch, given the JCS bytes of each (without
    ``sig``), in ``origin_seq`` order from ``first``, and each one's JSON bytes (what
    ``orjson.dumps`` gives). One ed25519 signature in all."""
    batch = SignedBatch.sign(keys, first, [leaf_hash(leaf) for leaf in leaves])
    proofs = [batch.proof(first + i) for i in range(batch.n)]
    return [sig for sig, _ in proofs], [text for _, text in proofs]


def _proof(sig: dict[str, Any], origin_seq: int) -> tuple[str, int, int, list[bytes]]:
    """The checked fields of a batch ``sig``: signature, first, n, path hashes."""
    if set(sig) != _SIG_FIELDS:
        raise InvalidSignature("a batch sig is {batch, first, n, path}")
    batch, first, n, path = sig["batch"], sig["first"], sig["n"], sig["path"]
    if (
        not isinstance(batch, str)
        or type(first) is not int
        or type(n) is not int
        or not isinstance(path, list)
        or not 1 <= n <= MAX_BATCH
        or first < 0
        or not first <= origin_seq < first + n
        or len(path) > MAX_PATH
    ):
        raise InvalidSignature("a batch sig's first, n or path does not fit the message")
    hashes: list[bytes] = []
    for item in path:
        # 43 base64url characters; decoded without the general decoder's checks and
        # copies (a path has up to 16 of them, and every received message has one).
        if type(item) is not str or not _HASH_TEXT.fullmatch(item):
            raise InvalidSignature("a batch path holds base64url SHA-256 hashes")
        hashes.append(a2b_base64((item + "=").encode().translate(_FROM_URLSAFE)))
    return batch, first, n, hashes


class BatchVerifier:
    """Verifies batch-signed messages; one ed25519 check per batch statement (bounded LRU
    of :data:`VERIFIED_BATCHES`). Safe to share between threads."""

    def __init__(self, capacity: int = VERIFIED_BATCHES) -> None:
        self.capacity = capacity
        self._verified: OrderedDict[tuple[str, int, int, bytes, str], None] = OrderedDict()
        self._lock = threading.Lock()
        self.signatures_checked = 0  # batch statements checked (ed25519)
        self.batch_messages = 0  # batch-signed messages whose path was checked
        self.singles_checked = 0  # messages signed alone, checked (ed25519 each)

    def verify(self, origin: str, leaf: bytes, origin_seq: int, sig: dict[str, Any]) -> None:
        """Check that ``leaf`` (JCS of the message without ``sig``) is message ``origin_seq``
        of a batch ``origin`` signed.

        Raises:
            InvalidSignature: malformed proof, a path that leads to no root of that size,
                or a batch signature that does not verify.
        """
        batch, first, n, path = _proof(sig, origin_seq)
        root = root_from_path(leaf_hash(leaf), origin_seq - first, n, path)
        if root is None:
            raise InvalidSignature("the batch path does not fit a tree of n messages")
        with self._lock:
            self.batch_messages += 1
        self.verify_root(origin, first, n, root, batch)

    def verify_root(self, origin: str, first: int, n: int, root: bytes, batch: str) -> None:
        """Check that ``origin`` signed the batch of ``n`` messages from ``first`` whose
        Merkle root is ``root`` (once per batch: a statement checked before passes).

        Raises:
            InvalidSignature: the batch signature does not verify.
        """
        key = (origin, first, n, root, batch)
        with self._lock:
            if key in self._verified:
                self._verified.move_to_end(key)
                return
        verify_bytes(origin, batch_statement(origin, first, n, root), batch)
        with self._lock:
            self.signatures_checked += 1
            self._verified[key] = None
            if len(self._verified) > self.capacity:
                self._verified.popitem(last=False)

    def count_batch(self, n: int) -> None:
        """Count ``n`` messages proved by a tree rebuilt from a whole batch."""
        with self._lock:
            self.batch_messages += n

    def count_single(self) -> None:
        """Count a message signed alone that verified."""
        with self._lock:
            self.singles_checked += 1

    def counts(self) -> dict[str, int]:
        """What this verifier checked: ``batch_signatures`` (one ed25519 check per batch
        root), ``batch_messages`` (messages proved by a path), ``single_signatures``."""
        with self._lock:
            return {
                "batch_signatures": self.signatures_checked,
                "batch_messages": self.batch_messages,
                "single_signatures": self.singles_checked,
            }


# One per process: a node verifies a given batch root once, whichever path the message
# came by (gossip, a client's verify=True).
VERIFIER = BatchVerifier()
