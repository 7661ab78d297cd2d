"""What a WebSocket publish costs the node's event loop (spec §6.4, §11; issue 17).

A token client publishes over a real loopback WebSocket to a node running in this
process; the client is a thread with a blocking socket that sends ``--batch`` publish
frames in one write, then reads their ``published.ok`` answers, ``--messages`` times in
all. Measured in the node: CPU seconds of the event-loop thread (``time.thread_time``
inside the loop) and of the log's writer thread (``/proc``), per publish, so the client's
own CPU (another thread) is left out. That is the per-message work of the publish path:
frame read and unmask, decode and parse, the checks (token scope, rate limit, size), the
log's queueing, the commit hand-off and the answer; no subscriber.

With ``--keyed`` every publish carries an ``idempotency_key`` of its own (the node then
claims and remembers one key per publish: the cost of idempotent publishing).

Run: python -m bench.bench_ws_publish [--messages 20000 --batch 64 --form json,cbor
     --sync normal --repeat 5 --keyed]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import struct
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import cbor2
import orjson
import uvloop

from bench.common import save
from hearthnet.clock import now_ms
from hearthnet.config import load_config
from hearthnet.node import Node
from hearthnet.tokens import CapabilityToken, Scope
from hearthnet.transport.websocket import OP_BINARY, OP_TEXT

TOPIC = "bench.wspub"
KEY = "dGhlIHNhbXBsZSBub25jZQ=="


def masked(payload: bytes, opcode: int) -> bytes:
    """A client frame (RFC 6455 §5.3) with a random mask."""
    n = len(payload)
    head = (
        bytes((0x80 | opcode, 0x80 | n)) if n < 126 else struct.pack("!BBH", 0x80 | opcode, 0xFE, n)
    )
    key = os.urandom(4)
    body = bytes(b ^ key[i & 3] for i, b in enumerate(payload))
    return head + key + body


class Client:
    """A blocking WebSocket client: sends prepared frames, counts answers."""

    def __init__(self, host: str, port: int, form: str) -> None:
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        protocol = "hearthnet-bus.v2+cbor" if form == "cbor" else "hearthnet-bus.v2"
        self.sock.sendall(
            (
                f"GET /pubsub/v1/subscribe HTTP/1.1\r\nHost: {host}:{port}\r\n"
                "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n"
                f"Sec-WebSocket-Protocol: {protocol}\r\n\r\n"
            ).encode()
        )
        self.buf = b""
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        self.buf = self.buf.split(b"\r\n\r\n", 1)[1]
        self.form = form
        self.opcode = OP_BINARY if form == "cbor" else OP_TEXT

    def encode(self, obj: dict[str, Any]) -> bytes:
        """One frame as this client's subprotocol carries it."""
        return masked(cbor2.dumps(obj) if self.form == "cbor" else orjson.dumps(obj), self.opcode)

    def frames(self, count: int) -> list[bytes]:
        """Read ``count`` server frames (payloads)."""
        out: list[bytes] = []
        while len(out) < count:
            if len(self.buf) >= 2:
                n = self.buf[1] & 0x7F
                start = 2
                if n == 126:
                    (n,) = struct.unpack("!H", self.buf[2:4])
                    start = 4
                elif n == 127:
                    (n,) = struct.unpack("!Q", self.buf[2:10])
                    start = 10
                if len(self.buf) >= start + n:
                    # A control frame (the node's keepalive ping, sent when a run is slow,
                    # as under valgrind) answers nothing: skipped, not counted.
                    if not self.buf[0] & 0x08:
                        out.append(self.buf[start : start + n])
                    self.buf = self.buf[start + n :]
                    continue
            chunk = self.sock.recv(262144)
            if not chunk:
                raise ConnectionError("the node closed the connection")
            self.buf += chunk
        return out

    def decode(self, payload: bytes) -> dict[str, Any]:
        """A server frame's object."""
        obj: dict[str, Any] = cbor2.loads(payload) if self.form == "cbor" else orjson.loads(payload)
        return obj


def thread_cpu_s(name_prefix: str) -> float:
    """CPU seconds of this process's threads whose name starts with ``name_prefix``."""
    total = 0.0
    for thread in threading.enumerate():
        if thread.name.startswith(name_prefix) and thread.native_id is not None:
            stat = Path(f"/proc/self/task/{thread.native_id}/stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


async def one_run(
    node: Node, token: str, form: str, messages: int, batch: int, keyed: bool = False
) -> dict[str, Any]:
    """Publish ``messages`` in writes of ``batch``; the node's CPU per publish. With
    ``keyed`` every publish carries an idempotency_key of its own (made before the
    clock starts)."""
    loop = asyncio.get_running_loop()

    def connect() -> Client:  # blocking: never on the loop's thread
        client = Client(node.server.host, node.server.port, form)
        client.sock.sendall(client.encode({"type": "auth", "token": token}))
        auth = client.decode(client.frames(1)[0])
        if auth.get("event") != "auth.ok":
            raise RuntimeError(f"auth refused: {auth}")
        return client

    client = await loop.run_in_executor(None, connect)
    payload = "x" * 200
    base = {"type": "publish", "topic": TOPIC, "msg_type": "bench", "data": payload}
    run_id = os.urandom(6).hex()
    blobs = [
        b"".join(
            client.encode(
                {**base, "ref": str(i), "idempotency_key": f"{run_id}-{n}-{i}"}
                if keyed
                else {**base, "ref": str(i)}
            )
            for i in range(batch)
        )
        for n in range(messages // batch if keyed else 1)
    ]
    errors: list[dict[str, Any]] = []

    def drive() -> None:
        for n in range(messages // batch):
            client.sock.sendall(blobs[n % len(blobs)])
            for raw in client.frames(batch):
                obj = client.decode(raw)
                if obj.get("event") != "published.ok" or "duplicate" in obj["data"]:
                    errors.append(obj)

    loop_cpu0, writer0, wall0 = (
        time.thread_time(),
        thread_cpu_s("hearthnet-log"),
        time.perf_counter(),
    )
    await loop.run_in_executor(None, drive)
    loop_cpu = time.thread_time() - loop_cpu0  # the executor's thread is another thread
    wall = time.perf_counter() - wall0
    writer = thread_cpu_s("hearthnet-log") - writer0
    client.sock.close()
    sent = messages // batch * batch
    return {
        "form": form,
        "messages": sent,
        "batch": batch,
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "loop_cpu_us_per_publish": loop_cpu / sent * 1e6,
        "writer_cpu_us_per_publish": writer / sent * 1e6,
        "publishes_per_s": sent / wall,
    }


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    """Start the node, then the runs (forms alternated), medians per form."""
    with tempfile.TemporaryDirectory(prefix="hn-wspub-") as tmp:
        return await _run_in(Path(tmp), opts)


async def _run_in(data: Path, opts: argparse.Namespace) -> dict[str, Any]:
    config = load_config(
        None,
        env={},
        overrides={
            "node": {"data_dir": str(data), "host": "127.0.0.1", "port": 0, "name": "bench"},
            "mesh": {"zeroconf": False},
            "pubsub": {"sync": opts.sync, "publish_per_s_token": 1_000_000.0},
        },
    )
    runs: list[dict[str, Any]] = []
    async with Node(config) as node:
        token = CapabilityToken.issue(
            node.keys,
            community=node.membership.community_id,
            scopes=[Scope.parse(f"pub:{TOPIC}")],
            ttl_ms=3_600_000,
            now_ms=now_ms(),
            sub="bench-publisher",
        ).encode()
        forms = opts.form.split(",")
        await one_run(node, token, forms[0], opts.batch * 20, opts.batch)  # warm-up
        for r in range(opts.repeat):
            for form in forms:
                result = await one_run(node, token, form, opts.messages, opts.batch, opts.keyed)
                result["round"] = r
                runs.append(result)
                print(
                    f"  {form:4s} round {r}: loop {result['loop_cpu_us_per_publish']:6.2f} µs, "
                    f"writer {result['writer_cpu_us_per_publish']:6.2f} µs per publish, "
                    f"{result['publishes_per_s']:8.0f}/s, errors {result['errors']}",
                    flush=True,
                )
    summary = {}
    for form in opts.form.split(","):
        mine = [r for r in runs if r["form"] == form]
        summary[form] = {
            key: statistics.median(r[key] for r in mine)
            for key in ("loop_cpu_us_per_publish", "writer_cpu_us_per_publish", "publishes_per_s")
        }
    return {
        "sync": opts.sync,
        "keyed": opts.keyed,
        "load1": os.getloadavg()[0],
        "runs": runs,
        "median": summary,
    }


def main() -> None:
    """Parse options, run, save under bench/results/."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20000, help="publishes per run")
    parser.add_argument("--batch", type=int, default=64, help="publish frames per write")
    parser.add_argument("--form", default="json,cbor", help="comma list of: json, cbor")
    parser.add_argument("--sync", default="normal", help="pubsub.sync: full or normal")
    parser.add_argument("--repeat", type=int, default=5, help="runs per form (medians kept)")
    parser.add_argument(
        "--keyed", action="store_true", help="every publish with an idempotency_key of its own"
    )
    parser.add_argument("--name", default="ws_publish")
    opts = parser.parse_args()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:  # as the node runs
        result = runner.run(run(opts))
    print(orjson.dumps(result["median"], option=orjson.OPT_INDENT_2).decode())
    save(opts.name, result)


if __name__ == "__main__":
    main()
