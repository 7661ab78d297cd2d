"""What one publish costs the node before any socket: signature, envelope, durable log.

Spec §11 asks for server CPU per delivery no higher than NATS's. Per delivery, a node
pays its per-message work divided by the number of subscribers, plus the cost of the
delivery itself. This measures the per-message part that no network work can avoid, in
one process, on the real code:

- ``sign``: the ed25519 signature over the JCS bytes of a 256-byte publish's envelope
  (PyNaCl, libsodium's C code);
- ``envelope``: ``Message.signed``, the signature with the envelope around it (canonical
  JSON, the signature string, the stored bytes);
- ``batch envelope``: ``Message.signed_batch`` over ``--batch`` messages, per message
  (JCS, the Merkle tree, one signature per batch; spec §6.2), and apart from it each
  message's proof and envelope bytes, made when it is first sent with ``sig`` (gossip, a
  subscriber that verifies);
- ``verify``: ``Message.parse`` of a received envelope, per message, signed alone and
  batch-signed (one signature check per batch, then a leaf hash and a path per message);
- ``frames``: fan-out's encoding of a committed batch-signed message, per message, in
  each transport form with ``sig`` (subscribers that asked to verify) and without (the
  default, spec §6.2), and the frame sizes;
- ``binary``: a 256-byte binary payload sent as bytes over the CBOR subprotocol against
  the same bytes as base64 text in JSON frames (what a client had to do before binary
  payloads): the publish frame and the delivered message frame (without ``sig``) in
  bytes, and CPU µs per message for the publisher to encode its frame (base64 included),
  the node to decode and check it and build the envelope body, the node to encode the
  delivered frame, and the subscriber to decode it back to bytes;
- ``edge``: the WebSocket publish path's steps before the log, per publish: the client
  frame read and unmasked, decoded with its canonical-JSON checks, parsed, its size
  checked, a token client's rate limit spent, and the ``published.ok`` answers of a
  commit's group queued (``--edge-only`` measures only these, in a few seconds);
- ``log``: ``MessageLog.publish`` for batches of ``--batch`` publishes until every one is
  committed, each batch awaited three ways (``--await``): ``gather`` (a future per
  publish, ``asyncio.gather``), ``ws`` (``publish_many`` with an ``answer`` callback: one
  pending entry and one answer per batch, as the WebSocket publish path queues a
  session's publishes of a loop turn), ``many`` (``publish_many``, one future per
  batch): numbering, signing in the writer thread (no proof is made: the log stores the
  batch once and its messages without ``sig``), deduplication, insert, group commit
  (with ``--sync full``, the node's default, the commit includes the WAL fsync), and the
  future each publisher awaits. CPU is the whole process's (event loop and writer
  thread), so it is what the node spends per publish with no subscriber and no socket.
  The garbage collector is set as the node process sets it (``--gc node``, the default
  since 2026-11-27; ``--gc default`` for Python's own thresholds, as measured before).

Run: python -m bench.bench_publish_cost [--messages 20000 --batch 125 --sync full,normal
     --await gather,ws,many --gc node --edge-only]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import cbor2
import orjson

from bench.common import save
from hearthnet.caller import Caller
from hearthnet.commands.node import collect_after_start
from hearthnet.community import Level
from hearthnet.identity import KeyPair
from hearthnet.ids import new_ulid
from hearthnet.pubsub import envelope_fields, ws_publish
from hearthnet.pubsub.batchsig import BatchVerifier
from hearthnet.pubsub.channel import SubscriberChannel
from hearthnet.pubsub.envelope import Message, StoredMessage, canonical_body, encoded_payload
from hearthnet.pubsub.frames import Publish, parse_client_frame
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.subscriber import Subscriber
from hearthnet.pubsub.wire import FORMS, NOSIG, EncodedMessage
from hearthnet.pubsub.ws_frames import GAP_FRAME
from hearthnet.pubsub.wsupgrade import compiled_unmask
from hearthnet.ratelimit import RateLimiter
from hearthnet.tokens import CapabilityToken, Scope
from hearthnet.transport.codec import SUBPROTOCOL_CBOR, SUBPROTOCOL_JSON, FrameCodec
from hearthnet.transport.websocket import FrameReader

PAYLOAD = "x" * 256
TOPIC = "bench.cost"


def _per_message(fn: Any, count: int) -> tuple[float, float]:
    """(CPU µs, wall µs) per call of ``fn`` over ``count`` calls."""
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(count):
        fn()
    return (
        (time.process_time() - c0) / count * 1e6,
        (time.perf_counter() - w0) / count * 1e6,
    )


def measure_signing(keys: KeyPair, count: int) -> dict[str, float]:
    """The signature alone and with the envelope around it, per message."""
    body = Message.unsigned(
        keys.node_id,
        topic=TOPIC,
        msg_type="bench",
        data=PAYLOAD,
        origin_seq=1,
        ts=int(time.time() * 1000),
        sender={"kind": "node", "id": keys.node_id},
    )
    sign_cpu, _ = _per_message(lambda: keys.sign_object(body), count)
    env_cpu, _ = _per_message(lambda: Message.signed(keys, body), count)
    return {"sign_cpu_us": sign_cpu, "envelope_cpu_us": env_cpu}


def _bodies(keys: KeyPair, count: int, first: int) -> list[dict[str, Any]]:
    ts = int(time.time() * 1000)
    sender = {"kind": "node", "id": keys.node_id}
    return [
        Message.unsigned(
            keys.node_id,
            topic=TOPIC,
            msg_type="bench",
            data=PAYLOAD,
            origin_seq=first + i,
            ts=ts,
            sender=sender,
        )
        for i in range(count)
    ]


def measure_batches(keys: KeyPair, count: int, batch: int) -> dict[str, float]:
    """Batch signing and verifying (single and batch form), CPU µs per message."""
    rounds = max(1, count // batch)
    todo = [_bodies(keys, batch, 1 + r * batch) for r in range(rounds)]
    c0 = time.process_time()
    signed = [Message.signed_batch(keys, b, [canonical_body(x) for x in b]) for b in todo]
    batch_cpu = (time.process_time() - c0) / (rounds * batch) * 1e6
    c0 = time.process_time()
    for ms in signed:
        for m in ms:
            m.raw  # noqa: B018 - makes the proof (sig and raw are made on first use)
    proof_cpu = (time.process_time() - c0) / (rounds * batch) * 1e6
    received = [[(orjson.loads(m.raw), m.raw) for m in ms] for ms in signed]
    c0 = time.process_time()
    for pairs in received:
        verifier = BatchVerifier()  # a node that has seen none of these batches
        for obj, raw in pairs:
            Message.parse(obj, raw=raw, verifier=verifier)
    verify_batch = (time.process_time() - c0) / (rounds * batch) * 1e6
    singles = [Message.signed(keys, b) for b in _bodies(keys, min(count, 2000), 1)]
    objs = [(orjson.loads(m.raw), m.raw) for m in singles]
    c0 = time.process_time()
    for obj, raw in objs:
        Message.parse(obj, raw=raw)
    verify_single = (time.process_time() - c0) / len(objs) * 1e6
    return {
        "batch_envelope_cpu_us": batch_cpu,
        "batch_proof_cpu_us": proof_cpu,
        "verify_single_cpu_us": verify_single,
        "verify_batch_cpu_us": verify_batch,
    }


def measure_frames(keys: KeyPair, count: int, batch: int) -> dict[str, Any]:
    """Per form, signed and unsigned: CPU µs to encode one message, and its frame bytes."""
    rounds = max(1, count // batch)
    signed: list[Message] = []
    for r in range(rounds):
        bodies = _bodies(keys, batch, 1 + r * batch)
        signed += Message.signed_batch(keys, bodies, [canonical_body(x) for x in bodies])
    for m in signed:
        m.raw  # noqa: B018 - each proof made once, as for the first subscriber that verifies
    stored = [StoredMessage(1000 + i, m) for i, m in enumerate(signed)]
    out: dict[str, Any] = {}
    for form in FORMS:
        for name in (form, form + NOSIG):
            items = [EncodedMessage(s) for s in stored]
            c0 = time.process_time()
            frames = [item.form(name) for item in items]
            out[name] = {
                "cpu_us": (time.process_time() - c0) / len(items) * 1e6,
                "bytes": statistics.median(len(f) for f in frames),
            }
    return out


def _ws_payload(frame: bytes) -> bytes:
    """The payload of one unmasked WebSocket frame from the node."""
    size = frame[1] & 0x7F
    return frame[{126: 4, 127: 10}.get(size, 2) :]


def _least_cpu(fn: Any, count: int, rounds: int = 3) -> float:
    """The least CPU µs per call over ``rounds`` runs (steps of a few µs are noisy on a
    shared machine)."""
    return min(_per_message(fn, count)[0] for _ in range(rounds))


def measure_binary(keys: KeyPair, count: int, batch: int) -> dict[str, Any]:
    """A 256-byte binary payload as bytes over CBOR, and as base64 text in JSON: frame
    sizes, and CPU µs per message at each step from publisher to subscriber."""
    raw = os.urandom(256)
    out: dict[str, Any] = {}
    # cbor_bytes: bytes both ways; json_base64: the application's own base64 text as a
    # JSON string; json_data_enc: bytes published and delivered over JSON (data_enc).
    for name, proto, marked in (
        ("cbor_bytes", SUBPROTOCOL_CBOR, True),
        ("json_base64", SUBPROTOCOL_JSON, False),
        ("json_data_enc", SUBPROTOCOL_JSON, True),
    ):
        cbor = proto == SUBPROTOCOL_CBOR
        codec = FrameCodec(proto)
        form = "ws_cbor" + NOSIG if cbor else "ws_text" + NOSIG

        def encode_publish(cbor: bool = cbor, marked: bool = marked) -> bytes:
            frame = {"type": "publish", "topic": TOPIC, "msg_type": "bench", "ref": "1"}
            if cbor:
                return cbor2.dumps({**frame, "data": raw})
            text = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
            if marked:
                return orjson.dumps({**frame, "data": text, "data_enc": "base64url"})
            return orjson.dumps({**frame, "data": text})

        wire = encode_publish()

        def node_ingest(wire: bytes = wire, codec: FrameCodec = codec) -> dict[str, Any]:
            frame = parse_client_frame(codec.decode(wire, binary=codec.binary, max_bytes=1 << 20))
            assert isinstance(frame, Publish)
            encoded_payload(frame.data)
            return Message.unsigned(
                keys.node_id, topic=TOPIC, msg_type="bench", data=frame.data, origin_seq=1, ts=1
            )

        # batch-signed as the log signs (the with-sig frame carries a batch proof)
        bodies = [{**node_ingest(), "origin_seq": 1 + i} for i in range(batch)]
        message = Message.signed_batch(keys, bodies, [canonical_body(b) for b in bodies])[-1]
        stored = StoredMessage(1000, message)
        delivered = EncodedMessage(stored).form(form)
        signed = EncodedMessage(stored).form(form.removesuffix(NOSIG))

        def subscriber_decode(cbor: bool = cbor, delivered: bytes = delivered) -> bytes:
            if cbor:
                data: bytes = cbor2.loads(_ws_payload(delivered))["data"]["data"]
                return data
            text = orjson.loads(_ws_payload(delivered))["data"]["data"]
            return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))

        assert raw == subscriber_decode()
        publish_cpu = _least_cpu(encode_publish, count)
        ingest_cpu = _least_cpu(node_ingest, count)
        fanout_cpu = _least_cpu(
            lambda stored=stored, form=form: EncodedMessage(stored).form(form), count
        )
        decode_cpu = _least_cpu(subscriber_decode, count)
        out[name] = {
            "publish_frame_bytes": len(wire),
            "message_frame_bytes": len(delivered),
            "message_frame_with_sig_bytes": len(signed),
            "publisher_encode_cpu_us": publish_cpu,
            "node_ingest_cpu_us": ingest_cpu,
            "node_encode_cpu_us": fanout_cpu,
            "subscriber_decode_cpu_us": decode_cpu,
        }
    return out


def measure_edge(keys: KeyPair, count: int, batch: int) -> dict[str, float]:
    """CPU µs per publish of the WebSocket publish path's steps before the log, each on
    the real code, least of 3 runs: the frame read and unmasked (``FrameReader.feed``,
    one masked 330-byte text frame), decoded and checked (``FrameCodec.decode``), parsed
    (``parse_client_frame``), its size checked, a token client's rate limit spent
    (``RateLimiter.check`` keyed by ``Caller.owner``, as ``authorize_publish`` does), and
    the ``published.ok`` answers of a group of ``batch`` queued on a ``ws_text``
    subscriber (``ws_publish.answer``)."""
    wire = orjson.dumps({"type": "publish", "topic": TOPIC, "msg_type": "bench", "data": PAYLOAD})
    mask = os.urandom(4)
    head = bytes((0x81, 0xFE)) + len(wire).to_bytes(2, "big")
    masked = head + mask + bytes(b ^ mask[i & 3] for i, b in enumerate(wire))
    reader = FrameReader(1 << 20, compiled_unmask)
    assert [wire] == [event.payload for event in reader.feed(masked)]  # type: ignore[union-attr]
    codec = FrameCodec(SUBPROTOCOL_JSON)
    obj = codec.decode(wire, binary=False, max_bytes=1 << 20)
    frame = parse_client_frame(obj)
    assert isinstance(frame, Publish)
    size_check = getattr(envelope_fields, "check_payload", encoded_payload)
    # A commit's messages as the log makes them (of_batch), answered as the log answers
    # a WebSocket session's group.
    ts = int(time.time() * 1000)
    bodies = [
        {
            **Message.unsigned(
                keys.node_id, topic=TOPIC, msg_type="bench", data=PAYLOAD, origin_seq=1 + i, ts=ts
            ),
            "id": new_ulid(ts),
        }
        for i in range(batch)
    ]
    leaves = [canonical_body(body) for body in bodies]
    signed = Message.signed_batch(keys, bodies, leaves)[0].batch
    assert signed is not None
    stored = [
        StoredMessage.of_batch(1 + i, body, leaf, signed)
        for i, (body, leaf) in enumerate(zip(bodies, leaves, strict=True))
    ]
    sub = Subscriber(
        caller=Caller(keys.node_id, "node", Level.MEMBER),
        client_id="cl_bench",
        form="ws_text",
        channel=SubscriberChannel(window=None, queue_max=1 << 20, encode_gap=GAP_FRAME["ws_text"]),
        sink=None,
    )
    refs: list[str | None] = [None] * batch

    def answer_group() -> None:
        ws_publish.answer(sub, refs, stored)  # type: ignore[arg-type]
        sub.channel.out.clear()

    token = CapabilityToken.issue(
        keys, community=keys.node_id, scopes=[Scope("pub", "bench.**")], ttl_ms=3_600_000, now_ms=ts
    )
    client = Caller(token.identity, "token", Level.MEMBER, token=token)
    limiter = RateLimiter(1e12)  # always tokens left: the usual call

    rounds = max(1, count // batch)
    return {
        "read_cpu_us": _least_cpu(lambda: reader.feed(masked), count),
        "decode_cpu_us": _least_cpu(
            lambda: codec.decode(wire, binary=False, max_bytes=1 << 20), count
        ),
        "parse_cpu_us": _least_cpu(lambda: parse_client_frame(obj), count),
        "size_check_cpu_us": _least_cpu(lambda: size_check(PAYLOAD, 256 * 1024), count),
        "rate_check_cpu_us": _least_cpu(
            lambda: limiter.check(client.owner, time.monotonic()), count
        ),
        "answer_cpu_us": _least_cpu(answer_group, rounds) / batch,
    }


# How a batch of publishes is awaited (see measure_log).
AWAIT_MODES = ("gather", "ws", "many")


async def _answered(log: MessageLog, group: list[Any]) -> None:
    """Queue as the WebSocket publish path does: the batch as one group with one answer
    (``publish_many(..., answer=...)``), called in the loop turn of the commit."""
    done: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
    log.publish_many(group, answer=done.set_result)
    await done


async def measure_log(
    keys: KeyPair,
    sync: str,
    count: int,
    batch: int,
    *,
    many: bool = False,
    mode: str = "gather",
) -> dict[str, Any]:
    """Publishes through the real log, ``batch`` at a time, each batch awaited: ``mode``
    ``gather``, a future per ``MessageLog.publish`` and ``asyncio.gather`` over them
    (what an application awaiting each publish pays); ``ws``, each batch as one
    ``MessageLog.publish_many`` group with an ``answer`` callback, as the WebSocket
    publish path queues a session's publishes of a loop turn; ``many`` (or
    ``many=True``), each batch as one ``MessageLog.publish_many`` and its one future."""
    if many:
        mode = "many"
    if mode not in AWAIT_MODES:
        raise ValueError(f"mode is one of {AWAIT_MODES}")
    with tempfile.TemporaryDirectory(prefix="hn-publish-cost-") as tmp:
        log = MessageLog(Path(tmp) / "log.db", keys, synchronous=sync)
        await log.open()
        flush = asyncio.get_running_loop().create_task(log.run())
        try:
            # One batch first: the connection, the schema and the first pages.
            sender = {"kind": "node", "id": keys.node_id}
            await asyncio.gather(
                *[
                    log.publish(topic=TOPIC, msg_type="bench", data=PAYLOAD, sender=sender)
                    for _ in range(batch)
                ]
            )
            rounds = max(1, count // batch)
            batch_ms = []
            c0, w0 = time.process_time(), time.perf_counter()
            group = [(TOPIC, "bench", PAYLOAD, None, sender)] * batch
            for _ in range(rounds):
                t0 = time.perf_counter()
                if mode == "many":
                    await log.publish_many(group)
                elif mode == "ws":
                    await _answered(log, group)
                else:
                    await asyncio.gather(
                        *[
                            log.publish(topic=TOPIC, msg_type="bench", data=PAYLOAD, sender=sender)
                            for _ in range(batch)
                        ]
                    )
                batch_ms.append((time.perf_counter() - t0) * 1000)
            n = rounds * batch
            return {
                "sync": sync,
                "mode": mode,
                "messages": n,
                "batch": batch,
                "cpu_us_per_message": (time.process_time() - c0) / n * 1e6,
                "wall_us_per_message": (time.perf_counter() - w0) / n * 1e6,
                "batch_ms_p50": statistics.median(batch_ms),
            }
        finally:
            await log.close()
            flush.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await flush


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    keys = KeyPair.generate()
    edge = measure_edge(keys, opts.messages, opts.batch)
    print(
        "WebSocket publish before the log, CPU µs per publish: "
        + ", ".join(f"{k.removesuffix('_cpu_us')} {v:.2f}" for k, v in edge.items())
        + f"; in all {sum(edge.values()):.2f}"
    )
    if getattr(opts, "edge_only", False):
        return {"payload_bytes": len(PAYLOAD), "edge": edge}
    signing = measure_signing(keys, opts.messages)
    print(
        f"ed25519 signature: {signing['sign_cpu_us']:.1f} µs CPU; "
        f"with the envelope: {signing['envelope_cpu_us']:.1f} µs"
    )
    batches = measure_batches(keys, opts.messages, opts.batch)
    print(
        f"batch-signed envelope ({opts.batch} per signature): "
        f"{batches['batch_envelope_cpu_us']:.1f} µs CPU per message, and its proof when "
        f"first sent with sig {batches['batch_proof_cpu_us']:.1f} µs; verify: "
        f"{batches['verify_single_cpu_us']:.1f} µs signed alone, "
        f"{batches['verify_batch_cpu_us']:.1f} µs batch-signed"
    )
    frames = measure_frames(keys, opts.messages, opts.batch)
    for form in FORMS:
        a, b = frames[form], frames[form + NOSIG]
        print(
            f"frame {form}: with sig {a['bytes']} bytes, {a['cpu_us']:.2f} µs CPU; "
            f"without {b['bytes']} bytes, {b['cpu_us']:.2f} µs"
        )
    binary = measure_binary(keys, opts.messages, opts.batch)
    for name, row in binary.items():
        print(
            f"binary 256 B as {name}: publish frame {row['publish_frame_bytes']} B, "
            f"message frame {row['message_frame_bytes']} B "
            f"({row['message_frame_with_sig_bytes']} B with sig); CPU µs: publisher "
            f"{row['publisher_encode_cpu_us']:.2f}, node in {row['node_ingest_cpu_us']:.2f}, "
            f"node out {row['node_encode_cpu_us']:.2f}, subscriber "
            f"{row['subscriber_decode_cpu_us']:.2f}"
        )
    if opts.gc == "node":
        # The node process's collector (hearthnet.commands.node): what start-up made
        # frozen, the young generation collected every 10,000 allocations, not 700.
        collect_after_start()
    logs = []
    for sync in opts.sync:
        for mode in opts.modes:
            row = await measure_log(keys, sync, opts.messages, opts.batch, mode=mode)
            row["gc"] = opts.gc
            logs.append(row)
            print(
                f"log, sync={sync}, batches of {row['batch']} awaited by {mode} "
                f"(collector: {opts.gc}): "
                f"{row['cpu_us_per_message']:.1f} µs CPU, {row['wall_us_per_message']:.1f} µs "
                f"wall per message; batch p50 {row['batch_ms_p50']:.2f} ms"
            )
    return {
        "payload_bytes": len(PAYLOAD),
        **signing,
        **batches,
        "frames": frames,
        "binary": binary,
        "edge": edge,
        "log": logs,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=20_000, help="per measurement")
    p.add_argument("--batch", type=int, default=125, help="publishes committed together")
    p.add_argument("--sync", default="full,normal", help="comma list: full, normal")
    p.add_argument(
        "--await",
        dest="modes",
        default="gather,ws,many",
        help="comma list of how each batch is awaited: gather (a future per publish, "
        "asyncio.gather), ws (publish_many with one answer callback per batch, as the "
        "WebSocket publish path), many (publish_many, one future per batch)",
    )
    p.add_argument(
        "--gc",
        choices=("node", "default"),
        default="node",
        help="the garbage collector during the log measurements: as the node process sets "
        "it (node: start-up objects frozen, young generation every 10,000 allocations) "
        "or Python's default (700)",
    )
    p.add_argument(
        "--edge-only",
        action="store_true",
        help="only the WebSocket publish path's steps before the log (read, decode, "
        "parse, size check, answers)",
    )
    p.add_argument("--name", default="publish_cost")
    opts = p.parse_args()
    opts.modes = [m.strip() for m in opts.modes.split(",") if m.strip()]
    for m in opts.modes:
        if m not in AWAIT_MODES:
            p.error(f"--await: {m!r} is not one of {', '.join(AWAIT_MODES)}")
    opts.sync = [s.strip() for s in opts.sync.split(",") if s.strip()]
    for s in opts.sync:
        if s not in ("full", "normal"):
            p.error(f"--sync: {s!r} is not full or normal")
    if opts.messages < 1 or opts.batch < 1:
        p.error("--messages and --batch must be at least 1")
    save(opts.name, asyncio.run(run(opts)))


if __name__ == "__main__":
    main()
