"""What a page pays to check signatures (spec §6.2): hearthnet.js's ``verifyMessage``
against the Python client's ``Message.parse``, per message, on the same envelopes.

Builds ``--batches`` batches of ``--batch`` messages (one batch signature each, a Merkle
path per message, as the node signs a group commit) and ``--singles`` messages signed
alone, 256-byte payloads, then checks every one:

- hearthnet.js in Node.js (WebCrypto's SHA-256 and Ed25519, as in a browser): half the
  batches one message at a time (``await`` each), the other half a batch at a time (every
  check of a batch started together, as a subscription with ``verify: true`` starts them
  while frames arrive), then every batch again (its root known: leaf hash and path
  only), then the singles;
- the Python client's ``Message.parse`` with a fresh verifier (one ed25519 check per
  batch), the batches twice, then the singles.

Reports µs of CPU time per message (the process's, all its threads: WebCrypto may run
Ed25519 on Node's thread pool).

Run: python -m bench.bench_js_verify [--batches 40 --batch 125 --singles 500]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

from bench.common import save
from hearthnet.identity import KeyPair
from hearthnet.pubsub.batchsig import BatchVerifier
from hearthnet.pubsub.envelope import Message, canonical_body
from hearthnet.pubsub.envelope_fields import unsigned_fields

PAYLOAD = "x" * 256


def envelopes(keys: KeyPair, batches: int, size: int, singles: int) -> dict[str, Any]:
    """``batches`` batches of ``size`` messages and ``singles`` messages signed alone, as
    parsed envelopes, and one more batch (``warm``) to run before anything is counted."""
    out: dict[str, Any] = {"batches": [], "singles": []}
    seq = 1
    for b in range(batches + 1):  # the first one warms the checker up, not counted
        bodies = [
            unsigned_fields(
                keys.node_id,
                "bench.verify",
                "token",
                PAYLOAD,
                seq + i,
                1_700_000_000_000 + b,
                None,
                None,
                f"01J{b:05d}{i:018d}",
            )
            for i in range(size)
        ]
        seq += size
        messages = Message.signed_batch(keys, bodies, [canonical_body(x) for x in bodies])
        parsed = [orjson.loads(m.raw) for m in messages]
        if b:
            out["batches"].append(parsed)
        else:
            out["warm"] = parsed
    for i in range(singles):
        message = Message.create(
            keys, topic="bench.verify", msg_type="token", data=PAYLOAD, origin_seq=seq + i, ts=1
        )
        out["singles"].append(orjson.loads(message.raw))
    return out


NODE_SCRIPT = """
import fs from "node:fs";
const hn = await import(process.argv[1]);
const { warm, batches, singles } = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
for (const m of warm) await hn.verifyMessage(m);  // compiled before anything is counted
const half = Math.ceil(batches.length / 2);
const count = (list) => list.reduce((n, b) => n + b.length, 0);
const now = () => { const c = process.cpuUsage(); return c.user + c.system; };  // CPU µs
const us = (t0, n) => (now() - t0) / n;
let t0 = now();
for (const batch of batches.slice(0, half)) for (const m of batch) await hn.verifyMessage(m);
const oneByOne = us(t0, count(batches.slice(0, half)));
t0 = now();
for (const batch of batches.slice(half)) await Promise.all(batch.map((m) => hn.verifyMessage(m)));
const together = us(t0, count(batches.slice(half)));
t0 = now();  // every batch's statement checked already: leaf and path only
for (const batch of batches) for (const m of batch) await hn.verifyMessage(m);
const known = us(t0, count(batches));
t0 = now();
for (const m of singles) await hn.verifyMessage(m);
const single = us(t0, singles.length);
console.log(JSON.stringify({ batch_one_by_one_us: oneByOne, batch_together_us: together,
  batch_known_us: known, single_us: single }));
"""


def run_node(node: str, data: Path) -> dict[str, float]:
    """hearthnet.js's costs per message, measured in Node.js."""
    source = resources.files("hearthnet") / "static" / "hearthnet.js"
    out = subprocess.run(
        [node, "--input-type=module", "-e", NODE_SCRIPT, "file://" + str(source), str(data)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


def run_python(data: dict[str, Any]) -> dict[str, float]:
    """The Python client's costs per message (``Message.parse``, a fresh verifier)."""
    verifier = BatchVerifier()
    for m in data["warm"]:
        Message.parse(m, verifier=verifier)
    messages = [m for batch in data["batches"] for m in batch]
    out: dict[str, float] = {}
    for key in ("batch_one_by_one_us", "batch_known_us"):  # the second pass: roots known
        t0 = time.process_time()
        for m in messages:
            Message.parse(m, verifier=verifier)
        out[key] = (time.process_time() - t0) * 1e6 / len(messages)
    t0 = time.process_time()
    for m in data["singles"]:
        Message.parse(m, verifier=verifier)
    out["single_us"] = (time.process_time() - t0) * 1e6 / max(1, len(data["singles"]))
    return out


def measure(opts: argparse.Namespace) -> dict[str, Any]:
    """Both checkers' costs on the same envelopes."""
    node = shutil.which("node")
    if node is None:
        raise SystemExit("needs Node.js (apt-get install nodejs)")
    data = envelopes(KeyPair.generate(), opts.batches, opts.batch, opts.singles)
    with tempfile.TemporaryDirectory(prefix="hn-js-verify-") as tmp:
        path = Path(tmp) / "envelopes.json"
        path.write_bytes(orjson.dumps(data))
        js = run_node(node, path)
    return {"options": vars(opts), "hearthnet_js": js, "python": run_python(data)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=40)
    p.add_argument("--batch", type=int, default=125, help="messages per batch")
    p.add_argument("--singles", type=int, default=500)
    p.add_argument("--name", default="js_verify")
    opts = p.parse_args(argv)
    result = measure(opts)
    js, py = result["hearthnet_js"], result["python"]
    print(
        "| checker (CPU µs per message) | batch member, its batch's check included"
        " | the same, a batch at a time | batch member, root known | signed alone |"
    )
    print("|---|---:|---:|---:|---:|")
    print(
        f"| hearthnet.js (Node.js) | {js['batch_one_by_one_us']:.1f} "
        f"| {js['batch_together_us']:.1f} | {js['batch_known_us']:.1f} "
        f"| {js['single_us']:.1f} |"
    )
    print(
        f"| Python client | {py['batch_one_by_one_us']:.1f} | – "
        f"| {py['batch_known_us']:.1f} | {py['single_us']:.1f} |"
    )
    save(opts.name, result)


if __name__ == "__main__":
    main()
