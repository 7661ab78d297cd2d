"""Shared test helpers: real capabilities for tests, waiting on conditions, node processes."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hearthnet.bus.capability import CallContext
from hearthnet.bus.descriptor import CapabilityDescriptor
from hearthnet.caller import Caller
from hearthnet.clock import now_ms
from hearthnet.community import Level
from hearthnet.frames import Frame
from hearthnet.node import Node
from hearthnet.subscription import Delivery
from hearthnet.tokens import CapabilityToken, Scope


@dataclass
class CleanupLog:
    """Records when handlers start and finish their cleanup, with monotonic times."""

    events: list[tuple[str, float]] = field(default_factory=list)

    def note(self, what: str) -> None:
        """Record one event."""
        self.events.append((what, time.monotonic()))

    def times(self, what: str) -> list[float]:
        """Times of one kind of event."""
        return [t for w, t in self.events if w == what]


class SlowStream:
    """``test.slow@1.0``: tokens every ``interval_ms`` until cancelled; logs its cleanup."""

    def __init__(self, log: CleanupLog, max_concurrent: int = 64) -> None:
        self.log = log
        self.descriptor = CapabilityDescriptor(
            name="test.slow",
            version="1.0",
            stream_schema={},
            max_concurrent=max_concurrent,
            request_schema={
                "type": "object",
                "properties": {"interval_ms": {"type": "integer"}, "count": {"type": "integer"}},
            },
        )

    async def stream(self, ctx: CallContext, value: Any) -> AsyncIterator[Frame]:
        """Stream slowly; the finally block is the cleanup the tests look for."""
        self.log.note("start")
        try:
            for i in range(value.get("count", 1_000_000)):
                yield Frame("token", {"i": i + 1})
                await asyncio.sleep(value.get("interval_ms", 20) / 1000)
        finally:
            self.log.note("cleanup")


class Crash:
    """``test.crash@1.0``: a unary capability with a bug."""

    descriptor = CapabilityDescriptor(name="test.crash", version="1.0")

    async def call(self, ctx: CallContext, value: Any) -> dict[str, Any]:
        """Fail."""
        raise RuntimeError("a bug in a capability")


class Sleepy:
    """``test.sleepy@1.0``: a unary capability that sleeps ``ms`` (for deadlines)."""

    descriptor = CapabilityDescriptor(name="test.sleepy", version="1.0", max_concurrent=1)

    async def call(self, ctx: CallContext, value: Any) -> dict[str, Any]:
        """Sleep, then answer."""
        await asyncio.sleep(value.get("ms", 0) / 1000)
        return {"slept": value.get("ms", 0)}


# Ports handed out by free_port come from below the kernel's range for the local ports of
# outgoing connections (net.ipv4.ip_local_port_range, 32768-60999 by default): a port from
# inside it could be taken by any connection made before the node binds it.
_FREE_PORT_LOW = 20_000
_FREE_PORT_TRIES = 200


def _outgoing_ports_start() -> int:
    """The lowest local port the kernel gives outgoing connections (Linux; else 32768)."""
    try:
        text = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
        return int(text.split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768


def free_port() -> int:
    """A loopback port free now that no outgoing connection will take before a node binds
    it (for nodes that must know each other's URL before either starts, and for a node
    restarted on its port): chosen at random below the outgoing connections' range, and
    bound once without ``SO_REUSEADDR`` (which fails while any socket, in ``TIME_WAIT``
    too, holds it). Falls back to a port the kernel picks when that range is too small."""
    high = _outgoing_ports_start()
    if high - _FREE_PORT_LOW >= 1_000:
        for _ in range(_FREE_PORT_TRIES):
            port = random.randrange(_FREE_PORT_LOW, high)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_until(
    condition: Callable[[], bool],
    within_s: float = 5.0,
    what: str = "condition",
    *,
    every_s: float = 0.005,
) -> None:
    """Wait until ``condition()`` is true, looking every ``every_s`` (0: at every turn of
    the event loop, for a state that lasts only milliseconds); fail after ``within_s``."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within_s} s waiting for {what}")
        await asyncio.sleep(every_s)


@dataclass
class NodeProcess:
    """A ``hearthnet node start`` process on port 0, stopped by PID."""

    proc: subprocess.Popen[str]
    ready_line: str
    data_dir: Path

    @property
    def fields(self) -> dict[str, str]:
        """The key=value pairs of the ready line."""
        return dict(part.split("=", 1) for part in self.ready_line.split()[2:])

    @property
    def url(self) -> str:
        """The node's URL."""
        return self.fields["url"]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        """Signal the process and wait for it; kill it if it does not exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode


def hearthnet_cmd(*args: str) -> list[str]:
    """The command line for the CLI with this interpreter."""
    return [sys.executable, "-m", "hearthnet.cli", *args]


def run_cli(
    *args: str, stdin: str | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the CLI to completion (bounded), capturing its output."""
    return subprocess.run(
        hearthnet_cmd(*args),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_node_process(
    data_dir: Path,
    *extra: str,
    timeout: float = 20.0,
    env: dict[str, str] | None = None,
    preexec_fn: Callable[[], None] | None = None,
) -> NodeProcess:
    """Start a node with ``--port 0`` and wait for its ready line (``preexec_fn`` runs in
    the child before the node, e.g. to lower its RLIMIT_NOFILE)."""
    proc = subprocess.Popen(
        hearthnet_cmd(
            "node",
            "start",
            "--data-dir",
            str(data_dir),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            *extra,
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **(env or {})},
        preexec_fn=preexec_fn,  # noqa: PLW1509 - only sets resource limits, no locks taken
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = ""
    os.set_blocking(proc.stdout.fileno(), True)
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("hearthnet ready") or proc.poll() is not None:
            break
    if not line.startswith("hearthnet ready"):
        proc.kill()
        proc.wait(5)
        raise AssertionError(f"node did not become ready (exit {proc.returncode}): {line!r}")
    return NodeProcess(proc, line.strip(), data_dir)


async def refused_upgrade(
    http: Any, url: str, protocol: str | None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any], Any]:
    """Attempt a WebSocket upgrade that the node is expected to refuse, as a plain GET
    (aiohttp's ws_connect leaks the connection of a refused handshake).

    Returns (status, JSON body, response headers).
    """
    all_headers = {
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Version": "13",
        "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
        **(headers or {}),
    }
    if protocol is not None:
        all_headers["Sec-WebSocket-Protocol"] = protocol
    async with http.get(url, headers=all_headers) as resp:
        return resp.status, await resp.json(), resp.headers


async def eventually(
    fetch: Callable[[], Awaitable[Any]],
    predicate: Callable[[Any], bool],
    within_s: float = 10.0,
    what: str = "condition",
) -> Any:
    """Await ``fetch()`` until ``predicate`` holds for its result; return that result."""
    deadline = time.monotonic() + within_s
    while True:
        value = await fetch()
        if predicate(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {within_s} s waiting for {what}; last: {value!r}"
            )
        await asyncio.sleep(0.05)


# --- pub/sub on an in-process node ----------------------------------------------------


def token_for(node: Node, *scopes: str, ttl_ms: int = 600_000, sub: str | None = None) -> str:
    """A capability token issued by an in-process node."""
    return CapabilityToken.issue(
        node.keys,
        community=node.membership.community_id,
        scopes=[Scope.parse(s) for s in scopes],
        ttl_ms=ttl_ms,
        now_ms=now_ms(),
        sub=sub,
    ).encode()


def _node_caller(node: Node) -> Caller:
    return Caller(node.keys.node_id, "node", Level.ANCHOR, None, True)


async def publish(node: Node, topic: str, n: int, start: int = 0) -> list[int]:
    """Publish n messages ``{"i": start..}`` as the node, one after another; their seqs."""
    me = _node_caller(node)
    return [(await node.pubsub.publish(me, topic, "m", {"i": start + i})).seq for i in range(n)]


async def publish_at_once(node: Node, topic: str, n: int, start: int = 0) -> list[int]:
    """Publish n messages as the node, queued together (group commit); their seqs."""
    me = _node_caller(node)
    stored = await asyncio.gather(
        *(node.pubsub.publish(me, topic, "m", {"i": start + i}) for i in range(n))
    )
    return [s.seq for s in stored]


async def collect_numbers(sub: AsyncIterable[Any], into: list[int], until: int | None) -> None:
    """Append each delivery's ``data["i"]`` to ``into`` (a gap fails) until it holds
    ``until`` items (None: until cancelled)."""
    async for item in sub:
        assert isinstance(item, Delivery), item
        into.append(item.data["i"])
        if until is not None and len(into) >= until:
            return


def apply_signed_record(node: Node, kind: str, subject: str, **fields: Any) -> None:
    """A membership record signed by ``node`` (an anchor of its own community), applied
    and gossiped as if an admin had submitted it."""
    node.apply_membership(node.membership.sign(node.keys, kind, subject, now_ms=now_ms(), **fields))


def closed_by_peer(raw: socket.socket) -> bool:
    """True when the other end of ``raw`` has closed (EOF, or a reset after what it sent);
    reads and drops whatever is waiting."""
    raw.setblocking(False)
    try:
        while raw.recv(65536):
            pass
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    return True
