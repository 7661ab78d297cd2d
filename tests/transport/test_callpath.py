"""The lean call path over loopback sockets (spec §2.5, §3.3): plain signed calls kept
alive and pipelined, everything else handed to the full server on the same connection,
refusals as the full server gives them, deadlines, the pre-auth cap, cancel and stop."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from hearthnet.clock import now_ms
from hearthnet.ids import new_ulid
from hearthnet.node import Node
from hearthnet.transport.callpath import CallPath
from tests.conftest import MakeConfig
from tests.helpers import wait_until

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


@pytest.fixture
async def node(make_config: MakeConfig, test_capabilities: list[Any]) -> AsyncIterator[Node]:
    """A node with short deadlines: head and body grace 0.4 s, idle keep-alive 0.6 s."""
    config = make_config(
        transport={
            "head_timeout_s": 0.4,
            "body_grace_s": 0.4,
            "keepalive_idle_s": 0.6,
            "max_body_bytes": 4096,
            "preauth_per_source": 8,
        }
    )
    async with Node(config, extra_capabilities=test_capabilities) as n:
        yield n


def call_path(node: Node) -> CallPath:
    """The node's lean call path."""
    assert node.server.call_path is not None
    return node.server.call_path


def request(node: Node, cap: str, body: Any, *, extra: str = "", chunked: bool = False) -> bytes:
    """A signed ``POST /bus/v1/call`` of ``body`` (sized, or chunked: the full server's)."""
    envelope = {
        "body": body,
        "capability": cap,
        "version": "1.0",
        "request_id": new_ulid(),
        "from": node.keys.node_id,
        "community": node.membership.community_id,
        "ts": now_ms(),
    }
    payload = orjson.dumps(body)
    framing = "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {len(payload)}\r\n"
    head = (
        "POST /bus/v1/call HTTP/1.1\r\nHost: n\r\nContent-Type: application/json\r\n"
        f"X-HearthNet-Capability: {cap}\r\nX-HearthNet-Capability-Version: 1.0\r\n"
        f"X-HearthNet-Request-Id: {envelope['request_id']}\r\n"
        f"X-HearthNet-From: {node.keys.node_id}\r\n"
        f"X-HearthNet-Community: {envelope['community']}\r\n"
        f"X-HearthNet-Timestamp: {envelope['ts']}\r\n"
        f"X-HearthNet-Signature: {node.keys.sign_object(envelope)}\r\n{extra}{framing}\r\n"
    ).encode()
    if chunked:
        return head + f"{len(payload):x}\r\n".encode() + payload + b"\r\n0\r\n\r\n"
    return head + payload


async def connect(node: Node) -> Stream:
    """A raw connection to the node."""
    return await asyncio.open_connection(node.server.host, node.server.port)


async def answer(reader: asyncio.StreamReader) -> tuple[int, bytes, Any]:
    """One answer: status, head, parsed JSON body."""
    async with asyncio.timeout(10):
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length)
    return int(head.split(b" ", 2)[1]), head, orjson.loads(body) if body else None


async def closed(reader: asyncio.StreamReader) -> bytes:
    """What the node still sends before it closes the connection."""
    async with asyncio.timeout(10):
        return await reader.read()


async def test_calls_are_kept_alive_pipelined_then_handed_over(node: Node) -> None:
    """Pipelined calls are answered in order; a GET hands the connection to aiohttp."""
    reader, writer = await connect(node)
    try:
        writer.write(request(node, "echo", {"input": 1}) + request(node, "echo", {"input": 2}))
        first, second = await answer(reader), await answer(reader)
        assert [(first[0], first[2]["output"]), (second[0], second[2]["output"])] == [
            (200, {"echo": 1}),
            (200, {"echo": 2}),
        ]
        assert (b"Server:" in first[1], len(call_path(node).connections)) == (False, 1)
        writer.write(
            b"GET /health HTTP/1.1\r\nHost: n\r\n\r\n" + request(node, "echo", {"input": 3})
        )
        health, third = await answer(reader), await answer(reader)
        assert (health[0], third[0], third[2]["output"]) == (200, 200, {"echo": 3})
        assert (b"Server:" in third[1], len(call_path(node).connections)) == (True, 0)
    finally:
        writer.close()


async def test_refusals_match_the_full_server(node: Node) -> None:
    """Each refusal's status and code are those of the same call sent chunked (aiohttp)."""
    cases: dict[str, tuple[str, Any]] = {
        "bad_signature": ("echo", {"input": 1}),
        "bad_request": ("echo", [1]),
        "streams": ("test.slow", {"input": {}}),
        "crash": ("test.crash", {"input": {}}),
        "not_found": ("no.such", {"input": {}}),
    }
    got: dict[str, list[tuple[int, str]]] = {}
    for name, (cap, body) in cases.items():
        for chunked in (False, True):
            data = request(node, cap, body, chunked=chunked)
            if name == "bad_signature":
                data = data.replace(b"ed25519:", b"ed25519:AA", 1)
            reader, writer = await connect(node)
            try:
                writer.write(data)
                status, _, answered = await answer(reader)
            finally:
                writer.close()
            got.setdefault(name, []).append((status, answered["error"]))
    assert {k: v[0] for k, v in got.items()} == {k: v[1] for k, v in got.items()}
    assert got["crash"][0] == (500, "internal_error")
    refused = node.metrics.counter("hearthnet_requests_refused_total", "", ("code", "transport"))
    assert refused.get("internal_error", "http") == 2.0


async def test_malformed_oversized_and_late_requests_after_a_call(node: Node) -> None:
    """After a call: garbage 400, big heads 431, big body 413, late 408, idle closed."""
    follow_ups = [
        b"GET / HTTP/1.1\r\nBad Header: x\r\n\r\n",
        b"POST /bus/v1/call HTTP/1.1\r\nHost: n\r\n"
        + b"".join(b"X-%d: y\r\n" % i for i in range(200))
        + b"Content-Length: 2\r\n\r\n{}",
        b"POST /bus/v1/call HTTP/1.1\r\nHost: n\r\nContent-Length: 5000\r\n\r\n" + b" " * 5000,
        b"POST /bus/v1/call HTTP/1.1\r\nHost: n\r\nX: " + b"y" * 30_000,
        b"POST /bus/v1/call HTTP/1.1\r\nHo",
        b"POST /bus/v1/call HTTP/1.1\r\nHost: n\r\nContent-Length: 9\r\n\r\n{",
        b"",  # nothing: idle past keepalive_idle_s
    ]

    async def after_a_call(follow_up: bytes) -> tuple[int, str] | bytes:
        reader, writer = await connect(node)
        try:
            writer.write(request(node, "echo", {"input": 0}))
            await answer(reader)
            if not follow_up:
                return await closed(reader)
            writer.write(follow_up)
            status, _, body = await answer(reader)
            return status, body["error"]
        finally:
            writer.close()

    results = await asyncio.gather(*(after_a_call(f) for f in follow_ups))
    assert results == [
        (400, "bad_request"),
        (431, "payload_too_large"),
        (413, "payload_too_large"),
        (431, "payload_too_large"),
        (408, "timeout"),
        (408, "timeout"),
        b"",
    ]


async def test_preauth_cap_and_cancel_hold_on_the_lean_path(
    make_config: MakeConfig, test_capabilities: list[Any]
) -> None:
    """Half heads count against the per-source cap; a close cancels; a stop closes idle."""
    # The head deadline is the default (10 s), not the fixture's 0.4 s: on a loaded
    # machine the half heads could otherwise be dropped before the ninth connection.
    config = make_config(transport={"preauth_per_source": 8})
    async with Node(config, extra_capabilities=test_capabilities) as node:
        await _cap_and_cancel(node)


async def _cap_and_cancel(node: Node) -> None:
    """The steps of the test above on ``node``."""
    pending = [await connect(node) for _ in range(8)]
    for _, writer in pending:
        writer.write(b"POST /bus/v1/call HTTP/1.1\r\nHost: n\r\n")
    reader, writer = await connect(node)
    status, _, body = await answer(reader)
    assert (status, body["error"]) == (429, "capacity_exceeded")
    writer.close()
    for _, w in pending:
        w.close()
    reader, writer = await connect(node)
    writer.write(request(node, "test.sleepy", {"input": {"ms": 30_000}}))
    await asyncio.sleep(0.1)
    writer.close()
    reader, writer = await connect(node)
    writer.write(request(node, "test.sleepy", {"input": {"ms": 0}}))
    status, _, body = await answer(reader)
    assert (status, body.get("output")) == (200, {"slept": 0})
    # the cancelled call is no longer counted among the calls being answered
    await wait_until(lambda: call_path(node).busy == 0, 10.0, "no call counted as busy")
    await node.server.close()
    assert await closed(reader) == b""
    writer.close()


async def test_overlapping_calls_are_checked_by_the_checker_process(
    make_config: MakeConfig,
) -> None:
    """Calls on several connections at once go to the checker process: each answered as
    on the loop (a forged one refused), and the checker is gone once the node stops."""
    async with Node(make_config()) as node:
        streams = [await connect(node) for _ in range(8)]
        outcomes: list[tuple[int, Any]] = []
        for _ in range(20):  # until one loop turn has held more than one call
            calls = [request(node, "echo", {"input": {"i": i}}) for i in range(8)]
            head, _, rest = calls[3].partition(b"X-HearthNet-Signature: ")
            other = calls[4].partition(b"X-HearthNet-Signature: ")[2]
            calls[3] = head + b"X-HearthNet-Signature: " + other.partition(b"\r\n")[0] + b"\r\n"
            calls[3] += rest.partition(b"\r\n")[2]  # call 4's signature on call 3: forged
            for (_, writer), data in zip(streams, calls, strict=True):
                writer.write(data)
            answers = [await answer(reader) for reader, _ in streams]
            outcomes = [
                (status, body.get("output") or body.get("error")) for status, _, body in answers
            ]
            if node.signatures.starts:
                break
        pid = node.signatures.checker_pid
        for _, writer in streams:
            writer.close()
    expected: list[tuple[int, object]] = [(200, {"echo": {"i": i}}) for i in range(8)]
    expected[3] = (401, "invalid_signature")
    assert (outcomes, node.signatures.starts, node.signatures.checker_pid) == (expected, 1, None)
    assert pid is not None
    with pytest.raises(ProcessLookupError):  # the stopped node's checker exited and was reaped
        os.kill(pid, 0)
