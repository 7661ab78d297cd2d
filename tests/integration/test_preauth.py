"""Pre-authentication bounds (spec §2.5) against a real node process over real sockets:
slowloris heads and bodies, descriptors held by an attacker, the per-source cap, and
oversized or malformed heads answered in JSON."""

from __future__ import annotations

import asyncio
import contextlib
import resource
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from hearthnet.client import Client
from hearthnet.identity import load_or_create_keys
from tests.helpers import NodeProcess, start_node_process, wait_until

StartNode = Callable[..., NodeProcess]
NOFILE = 400  # the node's descriptor limit: small, so the attack fits in a test


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


@pytest.fixture
def start_node(tmp_path: Path) -> Iterator[StartNode]:
    """Start node processes with ``[transport]`` overrides; all are stopped at the end."""
    started: list[NodeProcess] = []

    def start(*, low_nofile: bool = False, **transport: str) -> NodeProcess:
        env = {f"HEARTHNET_TRANSPORT_{k.upper()}": v for k, v in transport.items()}
        env["HEARTHNET_MESH_ZEROCONF"] = "false"
        proc = start_node_process(
            tmp_path / f"node{len(started)}",
            env=env,
            preexec_fn=_low_nofile if low_nofile else None,
        )
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.stop()


class Sockets:
    """Raw client connections from chosen loopback source addresses, all closed at the end."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.writers: list[asyncio.StreamWriter] = []
        self.tasks: list[asyncio.Task[Any]] = []

    async def open(
        self, source: str, data: bytes = b""
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Connect from ``source`` and send ``data``."""
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", self.port, local_addr=(source, 0)
        )
        self.writers.append(writer)
        if data:
            writer.write(data)
            await writer.drain()
        return reader, writer

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        """A task cancelled at the end."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.append(task)
        return task

    async def close(self) -> None:
        """Cancel the tasks, close every socket."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for writer in self.writers:
            writer.close()


@pytest.fixture
async def sockets() -> AsyncIterator[Callable[[int], Sockets]]:
    """A :class:`Sockets` factory; every socket is closed also when the test fails."""
    made: list[Sockets] = []

    def make(port: int) -> Sockets:
        made.append(Sockets(port))
        return made[-1]

    try:
        yield make
    finally:
        for s in made:
            await s.close()


async def until_closed(reader: asyncio.StreamReader, within_s: float = 5.0) -> bytes:
    """Everything the node sends before it closes the connection (fails after ``within_s``)."""
    data = b""
    async with asyncio.timeout(within_s):
        with contextlib.suppress(ConnectionResetError):
            while chunk := await reader.read(65536):
                data += chunk
    return data


async def read_response(reader: asyncio.StreamReader) -> tuple[int, Any]:
    """One HTTP response with a Content-Length body: (status, JSON body or the raw text)."""
    async with asyncio.timeout(5.0):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    status = int(lines[0].split(" ")[1])
    if headers.get("content-type", "").startswith("application/json"):
        return status, orjson.loads(body)
    return status, body


def parse_response(raw: bytes) -> tuple[int, Any]:
    """Status and JSON body of a whole response read until the close."""
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), orjson.loads(body)


async def refused_counts(s: Sockets) -> dict[str, float]:
    """``hearthnet_connections_refused_total`` by limit, from ``/metrics``."""
    reader, _ = await s.open(
        "127.0.0.1", b"GET /metrics HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n"
    )
    raw = await until_closed(reader)
    counts: dict[str, float] = {}
    for line in raw.decode().splitlines():
        if line.startswith('hearthnet_connections_refused_total{limit="'):
            label, value = line.split(" ")
            counts[label.split('"')[1]] = float(value)
    return counts


def port_of(node: NodeProcess) -> int:
    """The node's port."""
    return int(node.url.rsplit(":", 1)[1])


async def test_slowloris_heads_and_bodies_are_closed_by_their_deadlines(
    start_node: StartNode, sockets: Callable[[int], Sockets]
) -> None:
    """Incomplete heads on every path get 408 at the deadline, trickled bodies close; counted."""
    node = start_node(head_timeout_s="1.0", body_grace_s="1.0", body_min_bytes_per_s="1024")
    s = sockets(port_of(node))
    heads = [
        b"G",
        b"GET /health HTTP/1.1\r\nHost: node\r\n",
        b"GET /mesh/v1/peer HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n",
        b"GET /pubsub/v1/subscribe HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n",
    ]
    head_readers = [(await s.open("127.0.0.2", head))[0] for head in heads]
    body_head = (
        b"POST /bus/v1/call HTTP/1.1\r\nHost: node\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n\r\n"
    )

    async def trickle(writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while not writer.is_closing():  # the attack: 100 bytes a second
                writer.write(b"x" * 10)
                await writer.drain()
                await asyncio.sleep(0.1)

    body_readers = []
    for _ in range(2):
        reader, writer = await s.open("127.0.0.3", body_head)
        s.spawn(trickle(writer))
        body_readers.append(reader)

    answers = [parse_response(await until_closed(r)) for r in head_readers]
    for reader in body_readers:
        await until_closed(reader)
    counts = await refused_counts(s)
    assert ([(408, "timeout")] * 4, {"head_timeout": 4.0, "body_rate": 2.0}) == (
        [(status, body["error"]) for status, body in answers],
        counts,
    )


async def test_member_is_served_while_an_attacker_holds_the_descriptors(
    start_node: StartNode, sockets: Callable[[int], Sockets]
) -> None:
    """With the node's descriptors held by half-open requests, a member's signed call works."""
    node = start_node(low_nofile=True, head_timeout_s="60")
    s = sockets(port_of(node))
    closed: list[int] = []

    async def hold(reader: asyncio.StreamReader, i: int) -> None:
        await reader.read()  # blocks until the node closes it
        closed.append(i)

    for i in range(NOFILE):
        reader, _ = await s.open(f"127.0.0.{2 + i % 2}", b"GET / HTTP/1.1\r\nHost: node\r\n")
        s.spawn(hold(reader, i))
    keys = load_or_create_keys(node.data_dir)
    async with asyncio.timeout(10), Client(node.url, keys=keys) as client:
        answer = await client.call("echo@1", "from a member")
    counts = await refused_counts(s)
    # shed by the budget: the oldest; taken off the backlog when the process ran out of
    # descriptors anyway (it opened files after the budget was taken): the newest waiting
    shed, exhausted = (int(counts.get(k, 0.0)) for k in ("fd_reserve", "out_of_descriptors"))
    await wait_until(
        lambda: len(closed) >= shed + exhausted and shed > 0,
        within_s=5,
        what="shed connections closed",
    )
    oldest = sorted(closed)[:shed]
    assert ({"echo": "from a member"}, shed + exhausted, list(range(shed))) == (
        answer,
        len(closed),
        oldest,
    )
    assert all(i > shed for i in sorted(closed)[shed:])


async def test_per_source_cap_refuses_the_257th_and_serves_another_source(
    start_node: StartNode, sockets: Callable[[int], Sockets]
) -> None:
    """The 257th unauthenticated connection from one address gets 429; another address works."""
    node = start_node(head_timeout_s="60")
    s = sockets(port_of(node))
    for _ in range(256):
        await s.open("127.0.0.2", b"GET / HTTP/1.1\r\n")
    reader, _ = await s.open("127.0.0.2", b"GET /health HTTP/1.1\r\nHost: node\r\n\r\n")
    refused = parse_response(await until_closed(reader))
    reader, _ = await s.open("127.0.0.3", b"GET /health HTTP/1.1\r\nHost: node\r\n\r\n")
    status, _ = await read_response(reader)
    counts = await refused_counts(s)
    assert ((429, "capacity_exceeded"), 200, 1.0) == (
        (refused[0], refused[1]["error"]),
        status,
        counts.get("per_source"),
    )


async def test_too_many_headers_and_malformed_lines_get_json(
    start_node: StartNode, sockets: Callable[[int], Sockets]
) -> None:
    """1,000 headers get 431 JSON on any request; malformed lines and no Host get 400 JSON."""
    node = start_node()
    s = sockets(port_of(node))
    many = b"".join(b"X-H%d: 1\r\n" % i for i in range(1000))
    reader, _ = await s.open("127.0.0.2", b"GET /health HTTP/1.1\r\nHost: n\r\n" + many + b"\r\n")
    first = parse_response(await until_closed(reader))
    reader, writer = await s.open("127.0.0.2", b"GET /health HTTP/1.1\r\nHost: node\r\n\r\n")
    health, _ = await read_response(reader)
    writer.write(b"GET /health HTTP/1.1\r\nHost: node\r\n" + many + b"\r\n")
    later = await read_response(reader)
    reader, _ = await s.open("127.0.0.2", b"GET /health HTTP/1.1 extra\r\nHost: node\r\n\r\n")
    malformed = parse_response(await until_closed(reader))
    reader, _ = await s.open("127.0.0.2", b"GET /health HTTP/1.1\r\n\r\n")
    hostless = parse_response(await until_closed(reader))
    assert [
        (431, "payload_too_large"),
        200,
        (431, "payload_too_large"),
        (400, "bad_request"),
        (400, "bad_request"),
    ] == [
        (first[0], first[1]["error"]),
        health,
        (later[0], later[1]["error"]),
        (malformed[0], malformed[1]["error"]),
        (hostless[0], hostless[1]["error"]),
    ]
