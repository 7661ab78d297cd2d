"""hearthnet.js checks message signatures as the node does (spec §1.3, §6.2), run in
Node.js (WebCrypto's Ed25519, its own SHA-256; no browser needed): its JCS text is the
node's canonical form, every message of batches of 1 to 17 (each place in each tree shape)
and of 64 (leaves of every length modulo a SHA-256 block) and messages signed alone verify,
and altered fields, paths and batch statements do not."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import orjson

from hearthnet.canonical import canonicalize
from hearthnet.identity import KeyPair
from hearthnet.pubsub.envelope import Message, canonical_body
from hearthnet.pubsub.envelope_fields import unsigned_fields
from tests.console.nodejs import needs_node, run_module

KEYS = KeyPair.from_seed(b"\x5a" * 32)
VALUES: list[Any] = [
    {"b": 1, "a": [True, None, -0.0, 2.5, 1e21, 1e-7, 123456789012345], "": "x"},
    {"é": 'ü\n\t\u0001\u001f"\\/', "a": {"z": [], "y": {}}, "A": "\u2028 😀"},
    [0.1, -5, 9007199254740991, "\u007f", {"\u00e9": 1, "e": 2, "f": 3}],
]


def _batch(first: int, n: int, pad: bool = False) -> list[dict[str, Any]]:
    """``n`` envelopes from ``first``, committed together (one batch signature when n > 1);
    with ``pad``, message i's data is i bytes longer than message 0's (leaves of every
    length modulo SHA-256's 64-byte block)."""
    bodies = [
        unsigned_fields(
            KEYS.node_id,
            "chat.js",
            "m",
            {"i": i, "text": "héllo\n" + "x" * (i if pad else 0), "list": [1, 2.5, None]},
            first + i,
            1_700_000_000_000 + i,
            60 if i % 3 == 0 else None,
            {"kind": "token", "id": "t1"} if i % 2 else None,
            f"01J00000000000000000000{i:03d}",
        )
        for i in range(n)
    ]
    messages = Message.signed_batch(KEYS, bodies, [canonical_body(b) for b in bodies])
    return [orjson.loads(m.raw) for m in messages]


def _altered(envelopes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Copies of batch members that must not verify: a field, a path hash, the place,
    the batch size, a forged batch signature, no sig at all."""
    good = envelopes[5]
    sig = good["sig"]
    other = _batch(1, 2)[0]["sig"]["batch"]  # a real signature of another statement
    path = [sig["path"][0][:-2] + ("AA" if sig["path"][0][-2:] != "AA" else "AE"), *sig["path"][1:]]
    no_sig = {k: v for k, v in good.items() if k != "sig"}
    return [
        {**good, "data": {"i": 99}},
        {**good, "sig": {**sig, "path": path}},
        {**good, "origin_seq": good["origin_seq"] + 1},
        {**good, "sig": {**sig, "n": sig["n"] + 1}},
        {**good, "sig": {**sig, "batch": other}},
        no_sig,
        {**good, "sig": {**sig, "extra": 1}},
    ]


@needs_node
def test_hearthnet_js_verifies_batches_and_singles_and_refuses_alterations() -> None:
    """canonicalJson is the node's JCS; verifyMessage accepts every real message and
    refuses every altered one with invalid_signature."""
    genuine = [e for n in (1, 2, 3, 4, 5, 7, 8, 9, 16, 17) for e in _batch(100 * n, n)]
    genuine += _batch(5000, 64, pad=True)
    single = orjson.loads(
        Message.create(KEYS, topic="a", msg_type="m", data=VALUES[1], origin_seq=7, ts=1).raw
    )
    altered = _altered(_batch(1, 9))
    source = resources.files("hearthnet") / "static" / "hearthnet.js"
    script = f"""
const hn = await import({json.dumps("file://" + str(source))});
const outcome = (e) => hn.verifyMessage(e).then(() => "ok", (err) => err.code);
const genuine = {json.dumps([*genuine, single])};
const altered = {json.dumps(altered)};
console.log(JSON.stringify({{
  canonical: {json.dumps(VALUES)}.map(hn.canonicalJson),
  genuine: await Promise.all(genuine.map(outcome)),
  again: await Promise.all(genuine.map(outcome)),
  altered: await Promise.all(altered.map(outcome)),
}}));
"""
    got = run_module(script, timeout=60)
    n = len(genuine) + 1
    assert (
        [canonicalize(v).decode() for v in VALUES],
        ["ok"] * n,
        ["ok"] * n,
        ["invalid_signature"] * len(altered),
    ) == (got["canonical"], got["genuine"], got["again"], got["altered"])
