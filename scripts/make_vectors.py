"""Regenerate tests/vectors/signatures.json: signed-object vectors for other implementations.

Canonical bytes are checked separately against RFC 8785's own examples
(tests/vectors/jcs_rfc8785.json), and ed25519 is deterministic, so these vectors pin
the whole chain: object -> JCS bytes -> signature. Run: python scripts/make_vectors.py
"""

from __future__ import annotations

import json
from pathlib import Path

from hearthnet.canonical import canonicalize
from hearthnet.identity import KeyPair

DESCRIPTION = (
    "HearthNet signature vectors: object -> RFC 8785 canonical bytes -> ed25519 signature "
    "(seed = 32-byte private seed, signature = 'ed25519:' + base64url_nopad(64 bytes))."
)

SEEDS = [
    bytes(range(32)),
    bytes.fromhex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60"),
]

OBJECTS = [
    {
        "body": {"input": {"hello": "world"}},
        "capability": "echo",
        "version": "1.0",
        "request_id": "01JD0000000000000000000000",
        "community": None,
        "ts": 1763800000123,
    },
    {
        "method": "POST",
        "path": "/pubsub/v1/topics/chat.room/messages?x=1",
        "body": {
            "type": "message.complete",
            "data": {"text": "Grüße 👋", "n": [1, 2.5, -0.0, 1e21]},
        },
        "request_id": "01JD0000000000000000000001",
        "from": None,
        "community": None,
        "ts": 1763800000456,
    },
    {"identity": None, "ts": 1763800000789, "nonce": "0123456789abcdef", "node": None},
    {"z": {"b": [True, False, None], "a": '\u20ac\r\n\t"\\'}, "\U0001f600": 1, "\ufb33": 2, "": 0},
]


def main() -> None:
    """Write the vectors file."""
    vectors = []
    for seed in SEEDS:
        keys = KeyPair.from_seed(seed)
        for template in OBJECTS:
            obj = json.loads(json.dumps(template))
            for field in ("community", "from", "identity", "node"):
                if field in obj and obj[field] is None:
                    obj[field] = keys.node_id
            canonical = canonicalize(obj)
            vectors.append(
                {
                    "seed_hex": seed.hex(),
                    "node_id": keys.node_id,
                    "object": obj,
                    "canonical_hex": canonical.hex(),
                    "canonical_utf8": canonical.decode("utf-8"),
                    "signature": keys.sign_bytes(canonical),
                }
            )
    out = Path(__file__).resolve().parent.parent / "tests" / "vectors" / "signatures.json"
    out.write_text(
        json.dumps({"description": DESCRIPTION, "vectors": vectors}, indent=2, ensure_ascii=False)
        + "\n",
        encoding="utf-8",
    )
    print(f"wrote {len(vectors)} vectors to {out}")


if __name__ == "__main__":
    main()
