"""What one signed HTTP call costs the node, step by step, in process (spec §11).

Starts a node in this process (loopback, port 0), pre-signs ``--calls`` distinct echo
calls as complete HTTP/1.1 requests (as ``bench_bus`` sends them), then times each step
of the lean call path over all of them, one step at a time, and the whole path
(``BusHttpEndpoints.unary_call`` after the head is read) the same way:

- ``head``: :func:`~hearthnet.transport.callhead.plain_call` on the request head;
- ``headers``: the X-HearthNet-* headers and the envelope built from them;
- ``signature``: the ed25519 check alone (JCS of the envelope, libsodium verify);
- ``authenticate``: ``Authenticator.authenticate_call`` (envelope shape, sender,
  clock window, signature, replay cache);
- ``open``: ``Bus.open`` (routing, rate limits, schema validation);
- ``handler``: ``CallHandle.result`` (deadline, handler, metrics, slot release);
- ``answer``: the JSON answer and its response head;
- ``unary_call``: everything after the head, as the lean path runs it.

The socket side (two system calls, the event loop's wake-ups) is the difference between
``bench_bus``'s node CPU per call and these. Medians of ``--repeat`` passes.

Run: python -m bench.bench_call_steps [--calls 3000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import uvloop

from bench.bench_bus import signed_http_request
from bench.common import save
from hearthnet.clock import now_ms
from hearthnet.config import load_config
from hearthnet.identity import verify_object
from hearthnet.node import Node
from hearthnet.transport import headers as h
from hearthnet.transport.bus_http import BusEndpointDeps, BusHttpEndpoints
from hearthnet.transport.callhead import CallHeadLimits, PlainCall, plain_call
from hearthnet.transport.callpath import answer_bytes


def _time(fn: Callable[[int], Any], n: int) -> float:
    start = time.process_time()
    for i in range(n):
        fn(i)
    return (time.process_time() - start) / n * 1e6


async def one_pass(node: Node, calls: int) -> dict[str, float]:
    """Each step over ``calls`` fresh signed requests; µs of CPU per call."""
    community = node.membership.community_id
    requests = [signed_http_request(node.keys, community, {"n": i}) for i in range(calls)]
    heads = [r.partition(b"\r\n\r\n")[0] for r in requests]
    bodies = [r.partition(b"\r\n\r\n")[2] for r in requests]
    limits = CallHeadLimits()
    endpoints = BusHttpEndpoints(
        BusEndpointDeps(
            node_id=node.keys.node_id,
            transport=node.config.transport,
            authenticator=node.authenticator,
            bus=node.bus,
            metrics=node.server.metrics,
            connections=node.connections,
            streams=node.streams,
            sessions=node.sessions,
        )
    )
    plains: list[PlainCall] = []
    out: dict[str, float] = {}
    out["head"] = _time(lambda i: plains.append(plain_call(heads[i], limits)), calls)  # type: ignore[arg-type]
    envelopes: list[tuple[dict[str, Any], str]] = []

    def headers(i: int) -> None:
        ch = h.read_call_headers(plains[i].headers)
        signed = ch.signed
        envelope = {
            "body": orjson.loads(bodies[i]),
            "capability": ch.capability,
            "version": ch.version,
            "request_id": signed.request_id,
            "community": signed.community,
            "ts": signed.ts,
            "from": signed.sender,
        }
        envelopes.append((envelope, str(signed.signature)))

    out["headers"] = _time(headers, calls)
    sender = node.keys.node_id
    out["signature"] = _time(lambda i: verify_object(sender, *envelopes[i]), calls)
    auth = node.authenticator
    verified = []
    out["authenticate"] = _time(
        lambda i: verified.append(
            auth.authenticate_call(
                envelopes[i][0], signature=envelopes[i][1], token=None, now_ms=now_ms()
            )
        ),
        calls,
    )
    outputs = []
    opened = handled = 0.0
    for call in verified:  # a call holds a slot of the capability until its result
        t0 = time.process_time()
        handle = node.bus.open(call, inline_tools=False)
        t1 = time.process_time()
        outputs.append(await handle.result())
        opened += t1 - t0
        handled += time.process_time() - t1
    out["open"] = opened / calls * 1e6
    out["handler"] = handled / calls * 1e6
    date = b"Date: Thu, 26 Nov 2026 22:00:00 GMT\r\n"
    out["answer"] = _time(
        lambda i: answer_bytes(
            200,
            orjson.dumps({"output": outputs[i], "meta": {"ms": 0, "node": sender}}),
            date,
            close=False,
            retry_after="",
        ),
        calls,
    )
    again = [signed_http_request(node.keys, community, {"n": i}) for i in range(calls)]
    plains2 = [plain_call(r.partition(b"\r\n\r\n")[0], limits) for r in again]
    bodies2 = [r.partition(b"\r\n\r\n")[2] for r in again]

    async def whole(i: int) -> None:
        plain = plains2[i]
        assert plain is not None
        await endpoints.unary_call(plain.headers, bodies2[i])

    start = time.process_time()
    for i in range(calls):
        await whole(i)
    out["unary_call"] = (time.process_time() - start) / calls * 1e6
    return out


async def run(calls: int, repeat: int) -> dict[str, Any]:
    """Start a node in process and time the steps ``repeat`` times."""
    with tempfile.TemporaryDirectory(prefix="hn-steps-") as tmp:
        config = load_config(
            None,
            env={},
            overrides={
                "node": {"data_dir": str(Path(tmp) / "node"), "host": "127.0.0.1", "port": 0},
                "mesh": {"zeroconf": False},
            },
        )
        async with Node(config) as node:
            passes = [await one_pass(node, calls) for _ in range(repeat)]
    steps = {k: round(statistics.median(p[k] for p in passes), 2) for k in passes[0]}
    return {"calls": calls, "repeat": repeat, "us_per_call": steps, "passes": passes}


def main() -> None:
    """Parse arguments, run, save bench/results/call_steps.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--name", default="call_steps", help="result file name under bench/results/"
    )
    args = parser.parse_args()
    result = uvloop.run(run(args.calls, args.repeat))
    save(args.name, result)
    for step, us in result["us_per_call"].items():
        print(f"{step:>14}: {us:8.2f} µs")


if __name__ == "__main__":
    main()
