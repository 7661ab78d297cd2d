"""Capability bus benchmark (spec §11): a node started by the CLI, measured from outside.

Measures:
- ``hearthnet node start`` to ready, and idle RSS;
- signed call round trip (p50/p99) at concurrency 1, and calls/s with many keep-alive
  connections, over HTTP (echo@1.0), with the node's CPU per call in both;
- the same over WebSocket, where one socket carries one call (connect, signed call
  frame, frames, close);
- one flow-controlled token stream (window 16, ack every 8) in frames/s, JSON and CBOR,
  read by ``websockets`` and again by a lean client of raw frames (whose own CPU per
  frame is low enough that the node, not the load generator, is the limit).

The load generator pre-signs its requests (signing is the client's cost, not the
node's) and speaks raw HTTP/1.1 from an asyncio protocol (:class:`RawCallClient`); its
own CPU time is reported so it can be checked that it was not the bottleneck.

Placement (``--node-cpus``, ``--loadgen-cpus``, ``--fifo``): the node's threads and the
load generator pinned to CPUs, and/or run ``SCHED_FIFO`` (root): with ``--fifo`` the two
get a core whenever they are runnable, as on a quiet machine, even while other work runs
on a shared one (which waits meanwhile; the phases are bounded). The call phases report
the node's CPU and voluntary context switches per call by thread (``node_threads``): a
thread that sleeps and is woken per call (an event loop waiting in ``epoll``, a thread
waiting for the GIL) shows there.

Run: python -m bench.bench_bus [--quick] [--skip ws,stream,raw] [--name NAME]
     [--node-cpus 0] [--loadgen-cpus 1] [--fifo]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from typing import Any

import cbor2
import orjson
import uvloop
from websockets.asyncio.client import connect
from websockets.protocol import State
from websockets.typing import Subprotocol

from bench.common import proc_cpu_s, proc_rss_mb, save, self_cpu_s, start_node, summarize_latencies
from hearthnet.clock import now_ms
from hearthnet.identity import KeyPair, load_or_create_keys
from hearthnet.ids import new_ulid

# The node refuses a signature whose timestamp is more than [security] clock_window_s
# (60 s) from its clock (spec §1.4). Pre-signed calls are sent within this many seconds
# of being signed; on a busy machine a phase ends early, with the calls it made.
SIGNED_FOR_S = 45.0


def signed_http_request(keys: KeyPair, community: str, value: Any) -> bytes:
    """One complete pre-signed HTTP/1.1 request for echo@1.0."""
    body = {"input": value}
    envelope = {
        "body": body,
        "capability": "echo",
        "version": "1.0",
        "request_id": new_ulid(),
        "from": keys.node_id,
        "community": community,
        "ts": now_ms(),
    }
    sig = keys.sign_object(envelope)
    payload = orjson.dumps(body)
    head = (
        "POST /bus/v1/call HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Accept: application/json\r\nX-HearthNet-Capability: echo\r\n"
        "X-HearthNet-Capability-Version: 1.0\r\n"
        f"X-HearthNet-Request-Id: {envelope['request_id']}\r\nX-HearthNet-From: {keys.node_id}\r\n"
        f"X-HearthNet-Community: {community}\r\nX-HearthNet-Timestamp: {envelope['ts']}\r\n"
        f"X-HearthNet-Signature: {sig}\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


def cpus_arg(spec: str) -> set[int] | None:
    """CPUs from "0,1" (None: not pinned)."""
    return {int(c) for c in spec.split(",")} if spec else None


def _family(pid: int) -> list[tuple[int, int]]:
    """(process, thread) ids of ``pid``'s threads and of its child processes' threads."""
    out: list[tuple[int, int]] = []
    pids = [pid]
    for proc in pids:
        with contextlib.suppress(FileNotFoundError):
            for tid in os.listdir(f"/proc/{proc}/task"):
                out.append((proc, int(tid)))
                with (
                    contextlib.suppress(FileNotFoundError),
                    open(f"/proc/{proc}/task/{tid}/children", encoding="ascii") as f,
                ):
                    pids += [int(c) for c in f.read().split()]
    return out


def place(pid: int, cpus: set[int] | None, fifo: bool, child_cpus: set[int] | None = None) -> None:
    """Pin every thread of process ``pid`` (0: this one) and of its child processes to
    ``cpus`` (the child processes to ``child_cpus`` if given) and/or run it
    ``SCHED_FIFO`` at priority 1 (threads started later inherit both)."""
    for proc, tid in [(0, 0)] if pid == 0 else _family(pid):
        with contextlib.suppress(ProcessLookupError):
            pin = child_cpus if child_cpus is not None and proc != pid else cpus
            if pin is not None:
                os.sched_setaffinity(tid, pin)
            if fifo:
                os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(1))


def thread_stats(pid: int) -> dict[str, tuple[int, int]]:
    """Per thread of ``pid`` and of its child processes (``name:tid``): CPU ns
    (``schedstat``) and voluntary context switches so far."""
    out: dict[str, tuple[int, int]] = {}
    for proc, tid in _family(pid):
        task = f"/proc/{proc}/task/{tid}"
        try:
            with open(f"{task}/comm", encoding="utf-8") as f:
                name = f.read().strip()
            with open(f"{task}/schedstat", encoding="ascii") as f:
                run_ns = int(f.read().split()[0])
            with open(f"{task}/status", encoding="utf-8") as f:
                switches = next(
                    int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt")
                )
        except (FileNotFoundError, ProcessLookupError):
            continue
        out[f"{name}:{tid}"] = (run_ns, switches)
    return out


def per_thread(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]], calls: int
) -> dict[str, dict[str, float]]:
    """CPU µs and voluntary switches per call of each thread that used ≥ 1 % of the
    node's CPU between two :func:`thread_stats`."""
    spent = {
        k: (v[0] - before.get(k, (0, 0))[0], v[1] - before.get(k, (0, 0))[1])
        for k, v in after.items()
    }
    total = sum(ns for ns, _ in spent.values()) or 1
    return {
        k: {
            "cpu_us_per_call": round(ns / 1e3 / calls, 1),
            "switches_per_call": round(sw / calls, 3),
        }
        for k, (ns, sw) in spent.items()
        if ns >= total / 100
    }


class RawCallClient(asyncio.Protocol):
    """One keep-alive connection sending pre-built requests one at a time: each answer's
    head and ``Content-Length`` body are split from the socket's bytes here (no stream
    reader, no future per read), then the next request goes out."""

    def __init__(self, requests: list[bytes], latencies: list[float], until: float) -> None:
        self.requests = requests
        self.latencies = latencies
        self.until = until
        self.next = 0
        self.errors = 0
        self.buf = b""
        self.sent_at = 0.0
        self.transport: asyncio.Transport | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Send the first request."""
        self.transport = transport  # type: ignore[assignment]
        self._send()

    def _send(self) -> None:
        now = time.perf_counter()
        if self.next >= len(self.requests) or now > self.until:
            if not self.done.done():
                self.done.set_result(None)
            return
        self.sent_at = now
        assert self.transport is not None
        self.transport.write(self.requests[self.next])
        self.next += 1

    def data_received(self, data: bytes) -> None:
        """Complete answers: record, then send the next request."""
        buf = self.buf + data if self.buf else data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            at = buf.find(b"Content-Length: ", 0, end)
            if at < 0:
                at = buf.lower().find(b"content-length: ", 0, end)
            length = int(buf[at + 16 : buf.index(b"\r\n", at)])
            if len(buf) < end + 4 + length:
                break
            if not buf.startswith(b"HTTP/1.1 200"):
                self.errors += 1
            buf = buf[end + 4 + length :]
            self.latencies.append(time.perf_counter() - self.sent_at)
            self._send()
        self.buf = buf

    def connection_lost(self, exc: Exception | None) -> None:
        """The end, early if requests were left."""
        if not self.done.done():
            self.errors += len(self.requests) - self.next
            self.done.set_result(None)


async def http_worker(
    host: str,
    port: int,
    requests: list[bytes],
    latencies: list[float],
    until: float = float("inf"),
) -> int:
    """Send requests one at a time on one keep-alive connection, until they are all sent
    or ``until`` (perf_counter) passes; record round trips. Returns the errors."""
    loop = asyncio.get_running_loop()
    transport, client = await loop.create_connection(
        lambda: RawCallClient(requests, latencies, until), host, port
    )
    try:
        await client.done
    finally:
        transport.close()
    return client.errors


async def http_phase(
    url: str, keys: KeyPair, community: str, total: int, conns: int
) -> dict[str, Any]:
    """Run ``total`` pre-signed calls over ``conns`` keep-alive connections."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    signed = time.perf_counter()
    requests = [signed_http_request(keys, community, {"n": i}) for i in range(total)]
    per = [requests[i::conns] for i in range(conns)]
    latencies: list[float] = []
    until = signed + SIGNED_FOR_S
    cpu0 = self_cpu_s()
    t0 = time.perf_counter()
    errors = sum(
        await asyncio.gather(*(http_worker(host, int(port), p, latencies, until) for p in per))
    )
    wall = time.perf_counter() - t0
    return {
        "connections": conns,
        "calls": len(latencies),
        "errors": errors,
        "calls_per_s": round(len(latencies) / wall),
        "wall_s": round(wall, 3),
        "loadgen_cpu_s": round(self_cpu_s() - cpu0, 3),
        **summarize_latencies(latencies),
    }


def ws_call_frame(
    keys: KeyPair, community: str, value: Any, cap: str = "echo.stream"
) -> dict[str, Any]:
    """A signed first frame."""
    envelope = {
        "body": {"input": value},
        "capability": cap,
        "version": "1.0",
        "request_id": new_ulid(),
        "from": keys.node_id,
        "community": community,
        "ts": now_ms(),
    }
    return {"type": "call", "envelope": envelope, "signature": keys.sign_object(envelope)}


async def ws_one_call(url: str, frame: bytes) -> float:
    """Connect, send a pre-signed call frame, read to the end; return the round trip."""
    t0 = time.perf_counter()
    async with connect(
        url,
        subprotocols=[Subprotocol("hearthnet-bus.v2")],
        compression=None,
        proxy=None,
        ping_interval=None,
    ) as ws:
        await ws.send(frame.decode())
        async for raw in ws:
            if b'"done"' in (raw if isinstance(raw, bytes) else raw.encode()):
                break
    return time.perf_counter() - t0


async def ws_call_phase(
    url: str, keys: KeyPair, community: str, total: int, conc: int
) -> dict[str, Any]:
    """WS calls of echo.stream{count:1}: one socket per call, ``conc`` at a time."""
    ws_url = "ws" + url[4:] + "/bus/v1/call"
    signed = time.perf_counter()
    frames = [orjson.dumps(ws_call_frame(keys, community, {"count": 1})) for _ in range(total)]
    latencies: list[float] = []

    async def worker(mine: list[bytes]) -> None:
        for f in mine:
            if time.perf_counter() > signed + SIGNED_FOR_S:
                break
            latencies.append(await ws_one_call(ws_url, f))

    cpu0 = self_cpu_s()
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(frames[i::conc]) for i in range(conc)))
    wall = time.perf_counter() - t0
    return {
        "concurrency": conc,
        "calls": len(latencies),
        "calls_per_s": round(len(latencies) / wall),
        "loadgen_cpu_s": round(self_cpu_s() - cpu0, 3),
        **summarize_latencies(latencies),
    }


async def ws_stream_phase(
    url: str, keys: KeyPair, community: str, count: int, cbor: bool
) -> dict[str, Any]:
    """One echo.stream of ``count`` frames with acks every 8; frames/s."""
    ws_url = "ws" + url[4:] + "/bus/v1/call"
    proto = "hearthnet-bus.v2+cbor" if cbor else "hearthnet-bus.v2"
    first = ws_call_frame(keys, community, {"count": count, "size": 16})
    received = 0
    cpu0 = self_cpu_s()
    async with connect(
        ws_url,
        subprotocols=[Subprotocol(proto)],
        compression=None,
        proxy=None,
        ping_interval=None,
        max_queue=64,
    ) as ws:
        await ws.send(cbor2.dumps(first) if cbor else orjson.dumps(first).decode())
        t0 = time.perf_counter()
        async for raw in ws:
            frame = cbor2.loads(raw) if isinstance(raw, bytes) else orjson.loads(raw)
            seq = frame.get("seq", 0)
            if frame["event"] != "token":
                if frame["event"] != "done":
                    raise RuntimeError(f"stream ended with {frame}")
                break
            received += 1
            if seq % 8 == 0 and ws.state is State.OPEN:  # the node may have sent done and closed
                await ws.send(
                    cbor2.dumps({"type": "ack", "upto": seq})
                    if cbor
                    else b'{"type":"ack","upto":%d}'.decode() % seq
                )
        wall = time.perf_counter() - t0
    return {
        "subprotocol": proto,
        "frames": received,
        "frames_per_s": round(received / wall),
        "wall_s": round(wall, 3),
        "loadgen_cpu_s": round(self_cpu_s() - cpu0, 3),
    }


class RawStreamClient(asyncio.Protocol):
    """A lean WebSocket client for one token stream: server frames are split from the
    socket's bytes here (no per-message future or task as in ``websockets``), each is
    decoded (CBOR or JSON) to read its event and seq, and an ack goes out every 8 frames.
    Client frames are masked with an all-zero key (RFC 6455 asks for a random one; the
    node does not care, and XOR with zero costs nothing)."""

    def __init__(self, first: bytes, cbor: bool) -> None:
        self.first = first
        self.cbor = cbor
        self.buf = b""
        self.upgraded = False
        self.received = 0
        self.error: str | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport."""
        self.transport = transport  # type: ignore[assignment]

    def send(self, payload: bytes) -> None:
        """One masked client frame (zero key), binary for CBOR, text for JSON."""
        assert self.transport is not None
        self.transport.write(self._frame(payload))

    def data_received(self, data: bytes) -> None:
        """Split frames, count tokens, ack every 8."""
        buf = self.buf + data if self.buf else data
        pos = 0
        if not self.upgraded:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self.buf = buf
                return
            if not buf.startswith(b"HTTP/1.1 101"):
                self._finish(buf[:end].decode("latin-1"))
                return
            self.upgraded = True
            pos = end + 4
            assert self.transport is not None
            self.transport.write(self._frame(self.first))
        loads = cbor2.loads if self.cbor else orjson.loads
        size = len(buf)
        while size - pos >= 2:
            length = buf[pos + 1] & 0x7F
            head = 2
            if length == 126:
                if size - pos < 4:
                    break
                length = int.from_bytes(buf[pos + 2 : pos + 4], "big")
                head = 4
            elif length == 127:
                if size - pos < 10:
                    break
                length = int.from_bytes(buf[pos + 2 : pos + 10], "big")
                head = 10
            if size - pos - head < length:
                break
            opcode = buf[pos] & 0x0F
            payload = buf[pos + head : pos + head + length]
            pos += head + length
            if opcode == 0x8:  # close
                self._finish("closed before done")
                return
            frame = loads(payload)
            if frame["event"] != "token":
                self._finish(None if frame["event"] == "done" else f"stream ended with {frame}")
                return
            self.received += 1
            seq = frame["seq"]
            if seq % 8 == 0:
                ack = {"type": "ack", "upto": seq}
                self.send(cbor2.dumps(ack) if self.cbor else orjson.dumps(ack))
        self.buf = buf[pos:]

    def _frame(self, payload: bytes) -> bytes:
        opcode = 0x82 if self.cbor else 0x81
        size = len(payload)
        if size < 126:
            head = bytes((opcode, 0x80 | size))
        else:
            head = bytes((opcode, 0x80 | 126)) + size.to_bytes(2, "big")
        return head + b"\0\0\0\0" + payload

    def _finish(self, error: str | None) -> None:
        self.error = error
        if not self.done.done():
            self.done.set_result(None)
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        """The end, if it came before done."""
        if not self.done.done():
            self.error = f"connection lost: {exc}"
            self.done.set_result(None)


async def raw_stream_phase(
    url: str, keys: KeyPair, community: str, count: int, cbor: bool
) -> dict[str, Any]:
    """:func:`ws_stream_phase` with :class:`RawStreamClient`: the load generator's CPU per
    frame is a fraction of ``websockets``', so the node is the limit."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    proto = "hearthnet-bus.v2+cbor" if cbor else "hearthnet-bus.v2"
    first = ws_call_frame(keys, community, {"count": count, "size": 16})
    client = RawStreamClient(cbor2.dumps(first) if cbor else orjson.dumps(first), cbor)
    cpu0 = self_cpu_s()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(lambda: client, host, int(port))
    t0 = time.perf_counter()
    transport.write(
        (
            f"GET /bus/v1/call HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            f"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {proto}\r\n\r\n"
        ).encode()
    )
    try:
        await asyncio.wait_for(client.done, SIGNED_FOR_S + 60)
    finally:
        transport.close()
    wall = time.perf_counter() - t0
    if client.error is not None:
        raise RuntimeError(client.error)
    return {
        "subprotocol": proto,
        "client": "raw",
        "frames": client.received,
        "frames_per_s": round(client.received / wall),
        "wall_s": round(wall, 3),
        "loadgen_cpu_s": round(self_cpu_s() - cpu0, 3),
    }


async def run(
    quick: bool,
    skip: frozenset[str] = frozenset(),
    node_cpus: set[int] | None = None,
    loadgen_cpus: set[int] | None = None,
    fifo: bool = False,
) -> dict[str, Any]:
    """All phases against one node."""
    node = start_node()
    place(0, loadgen_cpus, fifo)
    try:
        keys = load_or_create_keys(node.data_dir)
        community = node.fields["community"]
        await asyncio.sleep(1.0)  # let the node settle before reading idle RSS
        result: dict[str, Any] = {
            "node_ready_s": round(node.ready_s, 3),
            "node_idle_rss_mb": round(proc_rss_mb(node.pid), 1),
        }
        scale = 0.2 if quick else 1.0
        result["placement"] = {
            "node_cpus": sorted(node_cpus or ()),
            "loadgen_cpus": sorted(loadgen_cpus or ()),
            "fifo": fifo,
        }
        await http_phase(node.url, keys, community, 500, 4)  # warm-up
        for key, total, conns in (("http_latency", 3000, 1), ("http_throughput", 30000, 32)):
            place(node.pid, node_cpus, fifo)
            threads0 = thread_stats(node.pid)
            cpu0 = proc_cpu_s(node.pid)
            phase = await http_phase(node.url, keys, community, int(total * scale), conns)
            node_cpu = proc_cpu_s(node.pid) - cpu0
            phase["node_cpu_s"] = round(node_cpu, 3)
            phase["node_cpu_us_per_call"] = round(node_cpu / phase["calls"] * 1e6, 1)
            phase["node_threads"] = per_thread(threads0, thread_stats(node.pid), phase["calls"])
            result[key] = phase
        if "ws" not in skip:
            result["ws_call_latency"] = await ws_call_phase(
                node.url, keys, community, int(1000 * scale), 1
            )
            result["ws_call_throughput"] = await ws_call_phase(
                node.url, keys, community, int(5000 * scale), 16
            )
        for cbor in () if "stream" in skip else (False, True):
            cpu0 = proc_cpu_s(node.pid)
            phase = await ws_stream_phase(node.url, keys, community, int(200_000 * scale), cbor)
            phase["node_cpu_s"] = round(proc_cpu_s(node.pid) - cpu0, 3)
            result["ws_stream_cbor" if cbor else "ws_stream_json"] = phase
        for cbor in () if "raw" in skip else (False, True):
            cpu0 = proc_cpu_s(node.pid)
            phase = await raw_stream_phase(node.url, keys, community, int(200_000 * scale), cbor)
            phase["node_cpu_s"] = round(proc_cpu_s(node.pid) - cpu0, 3)
            result["raw_stream_cbor" if cbor else "raw_stream_json"] = phase
        result["node_rss_after_mb"] = round(proc_rss_mb(node.pid), 1)
        return result
    finally:
        node.stop()
        if fifo:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def main() -> None:
    """Parse arguments, run, save bench/results/bus.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a fifth of the work, for a smoke run")
    parser.add_argument(
        "--skip",
        default="",
        help="phases to leave out, comma-separated: ws (WS calls), stream (token streams "
        "over websockets), raw (token streams over a lean client)",
    )
    parser.add_argument("--name", default="bus", help="result file name under bench/results/")
    parser.add_argument("--node-cpus", default="", help="pin the node's threads, e.g. 0")
    parser.add_argument("--loadgen-cpus", default="", help="pin the load generator, e.g. 1")
    parser.add_argument(
        "--fifo", action="store_true", help="node and load generator SCHED_FIFO (root)"
    )
    args = parser.parse_args()
    skip = frozenset(p for p in args.skip.split(",") if p)
    result = run(args.quick, skip, cpus_arg(args.node_cpus), cpus_arg(args.loadgen_cpus), args.fifo)
    save(args.name, uvloop.run(result))


if __name__ == "__main__":
    main()
