"""The bus over WebSocket on real sockets (spec §3.5–3.6, seed X06 §9), with raw frames."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import cbor2
import pytest

from hearthnet.client import Client
from hearthnet.clock import now_ms
from hearthnet.identity import KeyPair
from hearthnet.ids import new_ulid
from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import CleanupLog, SlowStream, refused_upgrade, wait_until
from tests.transport.test_bus_stream import UNKNOWN_FIELDS_MID_STREAM


def call_frame(
    keys: KeyPair,
    community: str,
    cap: str,
    value: Any,
    *,
    version: str = "1.0",
    ts: int | None = None,
) -> dict[str, Any]:
    """The signed first frame of a bus WebSocket."""
    envelope = {
        "body": {"input": value},
        "capability": cap,
        "version": version,
        "request_id": new_ulid(),
        "from": keys.node_id,
        "community": community,
        "ts": now_ms() if ts is None else ts,
    }
    return {"type": "call", "envelope": envelope, "signature": keys.sign_object(envelope)}


async def connect(
    http: aiohttp.ClientSession,
    node: Node,
    protocol: str = "hearthnet-bus.v2",
    *,
    headers: dict[str, str] | None = None,
    autoping: bool = True,
) -> aiohttp.ClientWebSocketResponse:
    """Open a raw bus WebSocket."""
    return await http.ws_connect(
        node.url + "/bus/v1/call", protocols=(protocol,), headers=headers, autoping=autoping
    )


async def read_all(
    ws: aiohttp.ClientWebSocketResponse, within_s: float = 10.0
) -> list[dict[str, Any]]:
    """Read text frames until the server closes."""
    frames = []
    async with asyncio.timeout(within_s):
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.TEXT:
                frames.append(json.loads(msg.data))
            elif msg.type == aiohttp.WSMsgType.BINARY:
                frames.append(cbor2.loads(msg.data))
    return frames


async def test_ws_stream_tokens_then_done(node: Node, http: aiohttp.ClientSession) -> None:
    """Signed call frame first; tokens numbered 1..n, then done; then close 1000."""
    ws = await connect(http, node)
    assert "hearthnet-bus.v2" == ws.protocol
    await ws.send_json(
        call_frame(node.keys, node.membership.community_id, "echo.stream", {"count": 3})
    )
    frames = await read_all(ws)
    assert (
        [{"event": "token", "data": {"i": i, "text": "x" * 16}, "seq": i} for i in (1, 2, 3)]
        + [{"event": "done", "data": {"count": 3}, "seq": 4}],
        1000,
    ) == (frames, ws.close_code)


async def test_cbor_subprotocol_carries_the_same_frames(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """hearthnet-bus.v2+cbor: binary CBOR frames with the same shapes."""
    ws = await connect(http, node, "hearthnet-bus.v2+cbor")
    await ws.send_bytes(
        cbor2.dumps(
            call_frame(
                node.keys, node.membership.community_id, "echo.stream", {"count": 2, "size": 1}
            )
        )
    )
    assert [
        {"event": "token", "data": {"i": 1, "text": "x"}, "seq": 1},
        {"event": "token", "data": {"i": 2, "text": "x"}, "seq": 2},
        {"event": "done", "data": {"count": 2}, "seq": 3},
    ] == await read_all(ws)


async def test_frame_shape_equal_on_sse_and_ws(client: Client) -> None:
    """The same call gives the same (event, data) sequence over WS and SSE."""
    async with client.stream("echo.stream@1.0", {"count": 20, "size": 4}) as ws_stream:
        over_ws = [(f.event, f.data) for f in await ws_stream.collect()]
    async with client.stream("echo.stream@1.0", {"count": 20, "size": 4}, prefer_ws=False) as sse:
        over_sse = [(f.event, f.data) for f in await sse.collect()]
    assert ("ws", "sse", over_ws) == (ws_stream.transport, sse.transport, over_sse)


async def test_invalid_signature_closes_connection(node: Node, http: aiohttp.ClientSession) -> None:
    """A bad signature on the first frame: error{invalid_signature}, then close 1008."""
    frame = call_frame(node.keys, node.membership.community_id, "echo.stream", {"count": 1})
    frame["envelope"]["body"]["input"]["count"] = 2  # signed over count=1
    ws = await connect(http, node)
    await ws.send_json(frame)
    frames = await read_all(ws)
    assert (["invalid_signature"], 1008) == ([f["data"]["code"] for f in frames], ws.close_code)


@pytest.mark.parametrize(
    ("case", "code", "close"),
    [
        ("stale", "expired", 1008),
        ("stranger", "unauthorized", 1008),
        ("unknown capability", "not_found", 1000),
        ("schema", "schema_mismatch", 1000),
        ("not streaming", "upgrade_required", 1008),
    ],
)
async def test_refused_calls(
    node: Node, http: aiohttp.ClientSession, case: str, code: str, close: int
) -> None:
    """Refusals on the first frame: one error frame with the code, then the close code."""
    c = node.membership.community_id
    frame = {
        "stale": lambda: call_frame(
            node.keys, c, "echo.stream", {"count": 1}, ts=now_ms() - 120_000
        ),
        "stranger": lambda: call_frame(KeyPair.generate(), c, "echo.stream", {"count": 1}),
        "unknown capability": lambda: call_frame(node.keys, c, "nope", {}),
        "schema": lambda: call_frame(node.keys, c, "echo.stream", {"count": -5}),
        "not streaming": lambda: call_frame(node.keys, c, "echo", {}),
    }[case]()
    ws = await connect(http, node)
    await ws.send_json(frame)
    frames = await read_all(ws)
    assert ([code], close) == ([f["data"]["code"] for f in frames], ws.close_code)


async def test_replayed_first_frame(node: Node, http: aiohttp.ClientSession) -> None:
    """The same signed call frame on a second socket is replayed (1008)."""
    frame = call_frame(node.keys, node.membership.community_id, "echo.stream", {"count": 1})
    first = await connect(http, node)
    await first.send_json(frame)
    await read_all(first)
    second = await connect(http, node)
    await second.send_json(frame)
    assert (["replayed"], 1008) == (
        [f["data"]["code"] for f in await read_all(second)],
        second.close_code,
    )


@pytest.mark.parametrize(
    ("send", "code", "close"),
    [
        ("binary", "bad_request", 1003),
        ("malformed", "bad_request", 1008),
        ("ack first", "bad_request", 1008),
        ("no envelope", "bad_request", 1008),
    ],
)
async def test_bad_first_frames(
    node: Node, http: aiohttp.ClientSession, send: str, code: str, close: int
) -> None:
    """Binary on JSON, junk, or anything but a call first: error frame and close."""
    ws = await connect(http, node)
    if send == "binary":
        await ws.send_bytes(b"\x01\x02")
    elif send == "malformed":
        await ws.send_str("{nope")
    elif send == "ack first":
        await ws.send_json({"type": "ack", "upto": 1})
    else:
        await ws.send_json({"type": "call"})
    frames = await read_all(ws)
    assert ([code], close) == ([f["data"]["code"] for f in frames], ws.close_code)


async def test_oversized_frame_closes_1009(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """A WebSocket message over max_ws_message_bytes closes the socket with 1009 and is counted."""
    async with Node(make_config(transport={"max_ws_message_bytes": 1024})) as node:
        ws = await connect(http, node)
        await ws.send_str(json.dumps({"type": "call", "pad": "x" * 4096}))
        await read_all(ws)
        refused = node.metrics.counter(
            "hearthnet_requests_refused_total", "", ("code", "transport")
        )
        assert (1009, 1.0) == (ws.close_code, refused.get("payload_too_large", "ws"))


async def test_first_frame_timeout(make_config: MakeConfig, http: aiohttp.ClientSession) -> None:
    """No call frame within ws_first_frame_s: close 1008."""
    async with Node(make_config(transport={"ws_first_frame_s": 0.2})) as node:
        ws = await connect(http, node)
        await read_all(ws)
    assert 1008 == ws.close_code


async def test_idle_close_after_timeout(
    make_config: MakeConfig, cleanup_log: CleanupLog, http: aiohttp.ClientSession
) -> None:
    """No data frames either way for ws_idle_s: close 1000, and the handler is cancelled."""
    config = make_config(transport={"ws_idle_s": 0.3})
    async with Node(config, extra_capabilities=[SlowStream(cleanup_log)]) as node:
        ws = await connect(http, node)
        await ws.send_json(
            call_frame(node.keys, node.membership.community_id, "test.slow", {"interval_ms": 5000})
        )
        frames = await read_all(ws)
        await wait_until(lambda: bool(cleanup_log.times("cleanup")), what="cleanup")
    assert ([1], 1000) == ([f["data"]["i"] for f in frames], ws.close_code)


async def test_missed_pongs_close_4408(
    make_config: MakeConfig, cleanup_log: CleanupLog, http: aiohttp.ClientSession
) -> None:
    """A client that never answers pings is closed with 4408 after two missed pongs."""
    config = make_config(transport={"ws_ping_s": 0.1})
    async with Node(config, extra_capabilities=[SlowStream(cleanup_log)]) as node:
        ws = await connect(http, node, autoping=False)
        await ws.send_json(
            call_frame(node.keys, node.membership.community_id, "test.slow", {"interval_ms": 20})
        )
        pings = 0
        async with asyncio.timeout(5):
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.PING:
                    pings += 1
                elif msg.type == aiohttp.WSMsgType.TEXT:
                    frame = json.loads(msg.data)
                    if frame["seq"] % 8 == 0:
                        await ws.send_json({"type": "ack", "upto": frame["seq"]})
    assert (4408, 2) == (ws.close_code, pings)


async def test_answered_pings_keep_a_stream_open(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """With pongs answered (the default), pings never close a healthy stream."""
    async with Node(make_config(transport={"ws_ping_s": 0.05})) as node:
        ws = await connect(http, node)
        await ws.send_json(
            call_frame(
                node.keys,
                node.membership.community_id,
                "echo.stream",
                {"count": 8, "interval_ms": 50},
            )
        )
        frames = await read_all(ws)
    assert ("done", 1000) == (frames[-1]["event"], ws.close_code)


async def test_client_that_never_acks_receives_exactly_16(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """Window 16: with no ack the server sends 16 frames, then error{timeout} (ack timeout)."""
    async with Node(make_config(transport={"stream_ack_timeout_s": 0.5})) as node:
        ws = await connect(http, node)
        await ws.send_json(
            call_frame(node.keys, node.membership.community_id, "echo.stream", {"count": 100})
        )
        frames = await read_all(ws)
    assert ([("token", i) for i in range(1, 17)] + [("error", 17)], "timeout") == (
        [(f["event"], f["seq"]) for f in frames],
        frames[-1]["data"]["code"],
    )


async def test_ack_for_8_releases_exactly_8(
    make_config: MakeConfig, http: aiohttp.ClientSession
) -> None:
    """After 16 frames, ack{upto:8} lets exactly 8 more out (17..24), then the window is shut."""
    async with Node(make_config(transport={"stream_ack_timeout_s": 0.5})) as node:
        ws = await connect(http, node)
        await ws.send_json(
            call_frame(node.keys, node.membership.community_id, "echo.stream", {"count": 100})
        )
        seqs = []
        async with asyncio.timeout(10):
            async for msg in ws:
                frame = json.loads(msg.data)
                seqs.append((frame["event"], frame["seq"]))
                if frame["seq"] == 16:
                    await ws.send_json({"type": "ack", "upto": 8})
                    await ws.send_json({"type": "ack", "upto": 999})  # unknown seq: a no-op
        ignored = node.metrics.counter("hearthnet_ws_ignored_acks_total", "").get()
    assert ([("token", i) for i in range(1, 25)] + [("error", 25)], 1.0) == (seqs, ignored)


async def test_ws_cancel_within_200ms(client: Client, cleanup_log: CleanupLog) -> None:
    """cancel mid-stream: error{cancelled} arrives and the handler's cleanup ran, within 200 ms."""
    async with client.stream("test.slow@1.0", {"interval_ms": 20}) as stream:
        frames = []
        async for frame in stream:
            frames.append(frame)
            if frame.data.get("i") == 3:
                sent = time.monotonic()
                await stream.cancel()
            if frame.terminal:
                ended = time.monotonic()
    cleanup = cleanup_log.times("cleanup")
    assert ("ws", ("error", "cancelled"), 1) == (
        stream.transport,
        (frames[-1].event, frames[-1].data["code"]),
        len(cleanup),
    )
    assert ended - sent < 0.2
    assert cleanup[0] - sent < 0.2


async def test_client_vanishing_mid_stream_cancels_handler(
    node: Node, http: aiohttp.ClientSession, cleanup_log: CleanupLog
) -> None:
    """A client dropping its TCP connection: handler cancelled, counted; the node serves on."""
    ws = await connect(http, node)
    await ws.send_json(
        call_frame(node.keys, node.membership.community_id, "test.slow", {"interval_ms": 10})
    )
    await ws.receive()
    ws._response.connection.transport.abort()  # type: ignore[union-attr]  # vanish, no close frame
    await wait_until(lambda: bool(cleanup_log.times("cleanup")), what="handler cleanup")
    await wait_until(
        lambda: (
            node.metrics.counter("hearthnet_streams_abandoned_total", "", ("transport",)).get("ws")
            == 1.0
        )
    )
    ws2 = await connect(http, node)
    await ws2.send_json(
        call_frame(node.keys, node.membership.community_id, "echo.stream", {"count": 1})
    )
    assert "done" == (await read_all(ws2))[-1]["event"]


async def test_second_call_frame_mid_stream_is_a_violation(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """One WebSocket carries one call: another call frame ends it with bad_request, 1008."""
    c = node.membership.community_id
    ws = await connect(http, node)
    await ws.send_json(call_frame(node.keys, c, "test.slow", {"interval_ms": 10}))
    await ws.receive()
    await ws.send_json(call_frame(node.keys, c, "test.slow", {"interval_ms": 10}))
    frames = await read_all(ws)
    assert (("error", "bad_request"), 1008) == (
        (frames[-1]["event"], frames[-1]["data"]["code"]),
        ws.close_code,
    )


async def test_unknown_subprotocol_gets_426_listing_ours(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """An upgrade offering no subprotocol of ours: 426 upgrade_required with ours in the header."""
    status, body, headers = await refused_upgrade(http, node.url + "/bus/v1/call", "chat.v1")
    assert (426, "upgrade_required", "hearthnet-bus.v2, hearthnet-bus.v2+cbor") == (
        status,
        body["error"],
        headers["Sec-WebSocket-Protocol"],
    )


async def test_non_streaming_capability_named_in_headers_gets_426(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """With X-HearthNet-Capability naming a unary capability, the upgrade gets 426 at once."""
    status, body, _ = await refused_upgrade(
        http,
        node.url + "/bus/v1/call",
        "hearthnet-bus.v2",
        {"X-HearthNet-Capability": "echo", "X-HearthNet-Capability-Version": "1.0"},
    )
    assert (426, "upgrade_required") == (status, body["error"])


async def test_capability_header_without_version_does_not_block_the_upgrade(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """The early check needs both headers; a capability named without its version is
    checked by the signed call frame instead, so the upgrade goes through."""
    async with http.ws_connect(
        node.url + "/bus/v1/call",
        protocols=("hearthnet-bus.v2",),
        headers={"X-HearthNet-Capability": "echo.stream"},
    ) as ws:
        assert "hearthnet-bus.v2" == ws.protocol


async def test_ws_fallback_to_sse_when_426(client: Client) -> None:
    """The client falls back to SSE transparently when the upgrade is answered 426."""
    async with client.stream("echo@1.0", {"via": "sse"}) as stream:
        frames = [(f.event, f.data) for f in await stream.collect()]
    assert ("sse", [("output", {"echo": {"via": "sse"}}), ("done", frames[-1][1])]) == (
        stream.transport,
        frames,
    )


async def test_ws_fallback_to_sse_when_503(make_config: MakeConfig) -> None:
    """With WebSocket disabled the node answers 503 and the client streams over SSE."""
    async with (
        Node(make_config(transport={"websocket_enabled": False})) as node,
        Client(node.url, keys=node.keys) as c,
        c.stream("echo.stream@1.0", {"count": 2}) as stream,
    ):
        events = [f.event for f in await stream.collect()]
    assert ("sse", ["token", "token", "done"]) == (stream.transport, events)


async def test_tool_result_for_unknown_id_is_refused_cleanly(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """A tool_result nobody waits for is answered tool_result.refused; the stream goes on."""
    ws = await connect(http, node)
    await ws.send_json(
        call_frame(
            node.keys, node.membership.community_id, "echo.stream", {"count": 3, "interval_ms": 30}
        )
    )
    await ws.send_json({"type": "tool_result", "tool_call_id": "tc_404", "body": {}})
    frames = await read_all(ws)
    refusal = [f for f in frames if f["event"] == "tool_result.refused"]
    assert ([{"tool_call_id": "tc_404", "code": "bad_request"}], "done") == (
        [{k: r["data"][k] for k in ("tool_call_id", "code")} for r in refusal],
        frames[-1]["event"],
    )


async def test_shutdown_ends_streams_with_a_frame(
    make_config: MakeConfig, cleanup_log: CleanupLog, http: aiohttp.ClientSession
) -> None:
    """Node shutdown ends a running stream with error{unavailable} and closes the socket."""
    node = Node(
        make_config(node={"shutdown_grace_s": 0.1}), extra_capabilities=[SlowStream(cleanup_log)]
    )
    async with node:
        ws = await connect(http, node)
        await ws.send_json(
            call_frame(node.keys, node.membership.community_id, "test.slow", {"interval_ms": 10})
        )
        await ws.receive()
        started = time.monotonic()
    frames = await read_all(ws)
    assert (("error", "unavailable"), True) == (
        (frames[-1]["event"], frames[-1]["data"]["code"]),
        time.monotonic() - started < 5,
    )


@pytest.mark.parametrize(("frame", "message"), UNKNOWN_FIELDS_MID_STREAM)
async def test_unknown_field_mid_stream_is_bad_request_naming_it(
    node: Node, http: aiohttp.ClientSession, frame: dict[str, Any], message: str
) -> None:
    """An ack, tool_result or cancel with a field it does not define ends the call with
    error{bad_request} naming the field, then close 1008."""
    ws = await connect(http, node)
    await ws.send_json(
        call_frame(
            node.keys, node.membership.community_id, "test.slow", {"count": 10, "interval_ms": 30}
        )
    )
    await ws.receive()
    await ws.send_json(frame)
    frames = await read_all(ws)
    assert (("error", "bad_request", message), 1008) == (
        (frames[-1]["event"], frames[-1]["data"]["code"], frames[-1]["data"]["message"]),
        ws.close_code,
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"body": {}}, "unknown field 'body' in call frame (the body goes inside envelope)"),
        ({"deadline": 5}, "unknown field 'deadline' in call frame (did you mean deadline_ms?)"),
    ],
)
async def test_unknown_field_in_the_call_frame_is_bad_request_naming_it(
    node: Node, http: aiohttp.ClientSession, extra: dict[str, Any], message: str
) -> None:
    """A call frame with a field beside envelope and signature: error naming it, close 1008,
    and the capability never runs."""
    ws = await connect(http, node)
    frame = call_frame(node.keys, node.membership.community_id, "echo.stream", {"count": 2})
    await ws.send_json({**frame, **extra})
    frames = await read_all(ws)
    assert ([("error", "bad_request", message)], 1008) == (
        [(f["event"], f["data"]["code"], f["data"]["message"]) for f in frames],
        ws.close_code,
    )


async def test_unknown_field_in_the_call_body_is_bad_request_naming_it(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """The call body is {params?, input}: another field is refused by name."""
    ws = await connect(http, node)
    envelope = {
        "body": {"input": {"count": 2}, "parameters": {}},
        "capability": "echo.stream",
        "version": "1.0",
        "request_id": new_ulid(),
        "from": node.keys.node_id,
        "community": node.membership.community_id,
        "ts": now_ms(),
    }
    await ws.send_json(
        {"type": "call", "envelope": envelope, "signature": node.keys.sign_object(envelope)}
    )
    frames = await read_all(ws)
    assert (
        [
            (
                "error",
                "bad_request",
                "unknown field 'parameters' in call body (did you mean params?)",
            )
        ],
        1008,
    ) == ([(f["event"], f["data"]["code"], f["data"]["message"]) for f in frames], ws.close_code)


@pytest.mark.parametrize("where", ["frame", "header", "client"])
async def test_ws_call_ends_at_its_deadline(
    node: Node, client: Client, http: aiohttp.ClientSession, where: str
) -> None:
    """A deadline in the call frame, on the upgrade, or from the client ends a long stream
    with error{timeout}, as X-HearthNet-Deadline-Ms does over HTTP."""
    value = {"count": 1000, "interval_ms": 10}
    if where == "client":
        async with client.stream("echo.stream", value, deadline_ms=300) as stream:
            events = [(f.event, f.data) async for f in stream]
        assert ("ws", "error") == (stream.transport, events[-1][0])
        assert "timeout" == events[-1][1]["code"]
        return
    frame = call_frame(node.keys, node.membership.community_id, "echo.stream", value)
    headers = {}
    if where == "frame":
        frame["deadline_ms"] = 300
    else:
        headers["X-HearthNet-Deadline-Ms"] = "300"
    ws = await connect(http, node, headers=headers)
    await ws.send_json(frame)
    frames = await read_all(ws)
    assert ("error", "timeout") == (frames[-1]["event"], frames[-1]["data"]["code"])


async def test_ws_bad_deadline_is_refused(node: Node, http: aiohttp.ClientSession) -> None:
    """A deadline_ms that is not a positive integer is bad_request, in the frame or header."""
    frame = call_frame(node.keys, node.membership.community_id, "echo.stream", {"count": 1})
    ws = await connect(http, node)
    await ws.send_json({**frame, "deadline_ms": 0})
    in_frame = [f["data"]["code"] for f in await read_all(ws)]
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await connect(http, node, headers={"X-HearthNet-Deadline-Ms": "soon"})
    assert (["bad_request"], 400) == (in_frame, refused.value.status)
