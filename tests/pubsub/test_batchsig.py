"""Batch signatures (spec §6.2): one signature per group commit, each message verifiable
alone, one signature check per batch and node, old single signatures still valid."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import orjson
import pytest

from hearthnet.errors import InvalidSignature
from hearthnet.identity import KeyPair
from hearthnet.pubsub.batchsig import BatchVerifier, sign_batch
from hearthnet.pubsub.envelope import Message, StoredMessage, canonical_body
from tests.pubsub.test_log import opened

ORIGIN = KeyPair.from_seed(b"\x61" * 32)
OTHER = KeyPair.from_seed(b"\x62" * 32)


def batch(n: int, first: int = 1, keys: KeyPair = ORIGIN) -> list[Message]:
    """``n`` messages of consecutive origin_seq signed together."""
    bodies = [
        Message.unsigned(
            keys.node_id, topic="chat.b", msg_type="m", data={"i": i}, origin_seq=first + i, ts=7
        )
        for i in range(n)
    ]
    return Message.signed_batch(keys, bodies, [canonical_body(b) for b in bodies])


def parsed(message: Message, verifier: BatchVerifier) -> Message:
    """A message as a peer gets it: parsed from its bytes."""
    return Message.parse(orjson.loads(message.raw), raw=message.raw, verifier=verifier)


def test_each_message_of_a_batch_verifies_alone_with_one_signature_check() -> None:
    """Every message of a batch parses back from its own bytes; the verifier checked one
    ed25519 signature for all of them."""
    messages = batch(13, first=40)
    verifier = BatchVerifier()
    back = [parsed(m, verifier) for m in reversed(messages)]
    sig = messages[5].sig
    assert (list(reversed(messages)), [m.body() for m in messages]) == (
        back,
        [orjson.loads(m.raw) for m in messages],
    )
    assert (1, (40, 13), True) == (
        verifier.signatures_checked,
        (sig["first"], sig["n"]) if isinstance(sig, dict) else None,
        all(isinstance(m.sig, dict) and m.sig["batch"] == sig["batch"] for m in messages),  # type: ignore[index]
    )


def test_a_single_message_keeps_the_single_signature_and_mixes_with_batches() -> None:
    """A batch of one is signed the old way; single and batch signatures verify side by side."""
    single = batch(1, first=1)[0]
    created = Message.create(ORIGIN, topic="chat.b", msg_type="m", data=1, origin_seq=2, ts=7)
    verifier = BatchVerifier()
    mixed = [single, created, *batch(3, first=3)]
    assert (True, mixed, 1) == (
        isinstance(single.sig, str),
        [parsed(m, verifier) for m in mixed],
        verifier.signatures_checked,
    )


def _tampered(message: Message, change: dict[str, Any]) -> dict[str, Any]:
    obj: dict[str, Any] = orjson.loads(message.raw)
    sig = dict(obj["sig"])
    for key, value in change.items():
        if key.startswith("sig."):
            sig[key[4:]] = value
        else:
            obj[key] = value
    obj["sig"] = sig
    return obj


@pytest.mark.parametrize(
    "change",
    [
        {"data": {"i": 99}},  # another payload: another leaf
        {"origin_seq": 3},  # another place in the tree
        {"origin": OTHER.node_id},  # another origin did not sign this root
        {"sig.first": 2},
        {"sig.n": 4},
        {"sig.n": 0},
        {"sig.path": []},
        {"sig.path": ["A" * 43]},
        {"sig.path": ["not base64!"] * 3},
        {"sig.batch": "ed25519:" + "A" * 86},
        {"sig.extra": 1},
    ],
)
def test_tampered_batch_messages_are_refused(change: dict[str, Any]) -> None:
    """A changed field, path, place or batch signature does not verify."""
    message = batch(5, first=1)[1]
    verifier = BatchVerifier()
    parsed(message, verifier)  # the genuine batch is known: the cache must not help forgers
    with pytest.raises(InvalidSignature):
        Message.parse(_tampered(message, change), verifier=verifier)


def test_a_forged_batch_signature_is_never_remembered() -> None:
    """A bad batch signature fails for every message of the batch, each time."""
    forged = [_tampered(m, {"sig.batch": batch(2, keys=OTHER)[0].sig["batch"]}) for m in batch(4)]  # type: ignore[index]
    verifier = BatchVerifier()
    failures = 0
    for obj in forged * 2:
        with contextlib.suppress(InvalidSignature):
            Message.parse(obj, verifier=verifier)
            continue
        failures += 1
    assert (8, 0) == (failures, verifier.signatures_checked)


def test_the_verified_batches_are_bounded() -> None:
    """The verifier keeps at most ``capacity`` batches, dropping the least recently used."""
    verifier = BatchVerifier(capacity=2)
    batches = [batch(2, first=1 + 2 * i) for i in range(3)]
    for messages in batches:
        parsed(messages[0], verifier)
    parsed(batches[0][1], verifier)  # dropped: checked again
    parsed(batches[2][1], verifier)  # kept: not checked again
    assert (4, 2) == (verifier.signatures_checked, len(verifier._verified))


async def test_the_log_signs_one_root_per_commit_and_serves_verifiable_messages(
    tmp_path: Path,
) -> None:
    """Publishes committed together share one batch signature over consecutive
    origin_seqs; a publish JCS cannot sign splits the run; what history reads back
    verifies alone."""
    async with opened(tmp_path / "log.db", keys=ORIGIN) as log:
        futures = [log.publish(topic="chat.b", msg_type="m", data={"i": i}) for i in range(5)]
        futures.append(log.publish(topic="chat.b", msg_type="m", data=2**53 + 1))
        futures += [log.publish(topic="chat.b", msg_type="m", data={"i": i}) for i in range(3)]
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        rows, _ = await log.reader.history("chat.b", since_seq=0, limit=50)
    stored = [o for o in outcomes if isinstance(o, StoredMessage)]
    sigs = [s.message.sig for s in stored]
    verifier = BatchVerifier()
    back = [parsed(r.message, verifier) for r in rows]
    assert (
        [(1, 5)] * 5 + [(7, 3)] * 3,
        [s.message for s in stored],
        2,
    ) == (
        [(s["first"], s["n"]) if isinstance(s, dict) else s for s in sigs],
        back,
        verifier.signatures_checked,
    )


@pytest.mark.parametrize("n", [1, 2, 3, 8, 125])
def test_each_sig_json_is_what_orjson_gives_for_the_sig(n: int) -> None:
    """sign_batch's pre-built sig JSON equals orjson.dumps of the sig object."""
    sigs, encoded = sign_batch(KeyPair.generate(), 1, [b'{"i":%d}' % i for i in range(n)])
    assert [orjson.dumps(sig) for sig in sigs] == encoded
