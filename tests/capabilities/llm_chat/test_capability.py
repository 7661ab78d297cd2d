"""llm.chat@2.0 on a real node over real sockets, spoken with raw frames (spec §5, §3.5–3.6)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from hearthnet.client import Client
from hearthnet.errors import ConfigError
from hearthnet.frames import Frame
from hearthnet.node import Node
from hearthnet.transport.codec import SseParser
from tests.capabilities.llm_chat.support import CLOCK, LOOKUP, USER, llm_call_frame
from tests.conftest import MakeConfig
from tests.transport.test_bus_http import signed_call

LOOKUP_THEN_ANSWER: list[dict[str, Any]] = [
    {
        "text": "I'll look that up. ",
        "tool_calls": [{"name": "lookup", "arguments": {"q": "water"}}],
    },
    {"text": "Boil it for one minute. Notes: {results}"},
]


@pytest.fixture
async def node(make_config: MakeConfig) -> AsyncIterator[Node]:
    """A node with the demo model and a short tool timeout."""
    async with Node(make_config(llm={"demo": True, "tool_timeout_s": 0.3})) as n:
        yield n


async def open_ws(
    http: aiohttp.ClientSession, node: Node, value: Any, script: list[dict[str, Any]]
) -> aiohttp.ClientWebSocketResponse:
    """A raw bus WebSocket carrying one llm.chat call with a demo script."""
    ws = await http.ws_connect(node.url + "/bus/v1/call", protocols=("hearthnet-bus.v2",))
    await ws.send_json(
        llm_call_frame(
            node.keys, node.membership.community_id, value, {"backend": "demo", "script": script}
        )
    )
    return ws


async def next_frame(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any] | None:
    """The next text frame, or None once the socket closed."""
    async with asyncio.timeout(10):
        msg = await ws.receive()
    if msg.type != aiohttp.WSMsgType.TEXT:
        return None
    frame: dict[str, Any] = json.loads(msg.data)
    return frame


async def read_until(
    ws: aiohttp.ClientWebSocketResponse, event: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Frames up to and including the first ``event`` frame."""
    frames = []
    while (frame := await next_frame(ws)) is not None:
        frames.append(frame)
        if frame["event"] == event:
            return frames, frame
    raise AssertionError(f"socket closed before a {event} frame: {frames}")


async def read_rest(ws: aiohttp.ClientWebSocketResponse) -> list[dict[str, Any]]:
    """Every frame until the server closes."""
    frames = []
    while (frame := await next_frame(ws)) is not None:
        frames.append(frame)
    return frames


def text_of(frames: list[dict[str, Any]]) -> str:
    """The concatenated token text."""
    return "".join(f["data"]["text"] for f in frames if f["event"] == "token")


async def test_ws_tool_result_inline(node: Node, http: aiohttp.ClientSession) -> None:
    """Tokens, the call, the result on the same socket, the model goes on: one numbered stream."""
    value = {"messages": [USER], "tools": [LOOKUP], "stream": True}
    ws = await open_ws(http, node, value, LOOKUP_THEN_ANSWER)
    before, tool_call = await read_until(ws, "tool_call")
    await ws.send_json(
        {"type": "tool_result", "tool_call_id": tool_call["data"]["id"], "body": {"hits": 2}}
    )
    after = await read_rest(ws)
    frames = before + after
    assert (
        "I'll look that up. ",
        '{"q":"water"}',
        {"id": "tc_1", "name": "lookup", "arguments": {"q": "water"}, "round": 1, "index": 0},
        'Boil it for one minute. Notes: [{"hits":2}]',
        ("done", "end", 1),
        list(range(1, len(frames) + 1)),
        1000,
    ) == (
        text_of(before),
        "".join(f["data"]["arguments_delta"] for f in before if f["event"] == "tool_call_delta"),
        tool_call["data"],
        text_of(after),
        (frames[-1]["event"], frames[-1]["data"]["stop_reason"], frames[-1]["data"]["tool_rounds"]),
        [f["seq"] for f in frames],
        ws.close_code,
    )


async def sse_call(
    http: aiohttp.ClientSession, node: Node, value: Any, params: dict[str, Any]
) -> list[Frame]:
    """POST one llm.chat call with Accept: text/event-stream, signed by hand."""
    body = {"input": value, "params": params}
    headers = signed_call(
        node.keys,
        node.membership.community_id,
        "llm.chat",
        body,
        version="2.0",
        accept="text/event-stream",
    )
    parser = SseParser()
    frames: list[Frame] = []
    async with http.post(node.url + "/bus/v1/call", data=json.dumps(body), headers=headers) as resp:
        assert ("text/event-stream", 200) == (resp.headers["Content-Type"], resp.status)
        async for chunk in resp.content.iter_any():
            frames += [Frame(e, json.loads(d)) for e, d, _ in parser.feed(chunk)]
    return frames


async def test_sse_ends_with_done_tool_calls_and_the_recall_finishes(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """SSE: the stream ends after tool_call with done{tool_calls}; the re-call with the result
    appended gets the answer."""
    params = {"backend": "demo", "script": LOOKUP_THEN_ANSWER}
    first = await sse_call(http, node, {"messages": [USER], "tools": [LOOKUP]}, params)
    call = next(f.data for f in first if f.event == "tool_call")
    messages = [
        USER,
        {
            "role": "assistant",
            "content": "".join(f.data["text"] for f in first if f.event == "token"),
            "tool_calls": [
                {"id": call["id"], "name": call["name"], "arguments": call["arguments"]}
            ],
        },
        {"role": "tool", "tool_call_id": call["id"], "content": {"hits": 2}},
    ]
    second = await sse_call(http, node, {"messages": messages, "tools": [LOOKUP]}, params)
    done = first[-1].data
    assert (
        ["token", "token", "token", "token"],
        ("done", "tool_calls", 1, 300, 4),
        ('Boil it for one minute. Notes: [{"hits":2}]', "end", 1),
    ) == (
        [f.event for f in first if f.event == "token"],
        (
            first[-1].event,
            done["stop_reason"],
            done["tool_rounds"],
            done["tool_timeout_ms"],
            done["max_parallel_tools"],
        ),
        (
            "".join(f.data["text"] for f in second if f.event == "token"),
            second[-1].data["stop_reason"],
            second[-1].data["tool_rounds"],
        ),
    )


async def test_tool_result_for_an_unknown_or_answered_id_is_refused_cleanly(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """Unknown id, then a second answer: tool_result.refused each time; the loop goes on."""
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "clock"}]},
        {"tool_calls": [{"name": "clock"}]},
        {"text": "Done."},
    ]
    ws = await open_ws(http, node, {"messages": [USER], "tools": [CLOCK]}, script)
    _, call = await read_until(ws, "tool_call")
    await ws.send_json({"type": "tool_result", "tool_call_id": "tc_404", "body": {}})
    _, unknown = await read_until(ws, "tool_result.refused")
    await ws.send_json({"type": "tool_result", "tool_call_id": call["data"]["id"], "body": 1})
    await ws.send_json({"type": "tool_result", "tool_call_id": call["data"]["id"], "body": 2})
    _, twice = await read_until(ws, "tool_result.refused")
    _, second_call = await read_until(ws, "tool_call")
    await ws.send_json(
        {"type": "tool_result", "tool_call_id": second_call["data"]["id"], "body": 3}
    )
    rest = await read_rest(ws)
    assert (
        {
            "tool_call_id": "tc_404",
            "code": "bad_request",
            "message": "tool_call_id 'tc_404' is unknown",
        },
        ("bad_request", "tool_call_id 'tc_1' is already answered or timed out"),
        ("Done.", "end", 2),
        (False, False),
    ) == (
        unknown["data"],
        (twice["data"]["code"], twice["data"]["message"]),
        (text_of(rest), rest[-1]["data"]["stop_reason"], rest[-1]["data"]["tool_rounds"]),
        ("seq" in unknown, "seq" in twice),
    )


async def test_tool_result_after_cancel_is_refused_cleanly(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """cancel then a tool_result: the stream ends with error{cancelled}, close 1000, the node
    serves on and nothing is left running."""
    ws = await open_ws(
        http, node, {"messages": [USER], "tools": [CLOCK]}, [{"tool_calls": [{"name": "clock"}]}]
    )
    _, call = await read_until(ws, "tool_call")
    await ws.send_json({"type": "cancel"})
    await ws.send_json({"type": "tool_result", "tool_call_id": call["data"]["id"], "body": 1})
    rest = await read_rest(ws)
    async with (
        Client(node.url, keys=node.keys) as client,
        client.stream("llm.chat@2.0", {"messages": [USER]}) as again,
    ):
        last = (await again.collect())[-1]
    assert (
        [("error", "cancelled")],
        1000,
        0,
        "end",
    ) == (
        [(f["event"], f["data"]["code"]) for f in rest],
        ws.close_code,
        node.bus.metrics.streams_active,
        last.data["stop_reason"],
    )


async def test_cancel_while_waiting_for_a_tool_within_200ms(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """cancel while the node waits for a tool result: error{cancelled} within 200 ms, and the
    handler has finished (its cleanup ran) by then."""
    ws = await open_ws(
        http, node, {"messages": [USER], "tools": [CLOCK]}, [{"tool_calls": [{"name": "clock"}]}]
    )
    await read_until(ws, "tool_call")
    sent = time.monotonic()
    await ws.send_json({"type": "cancel"})
    frame = await next_frame(ws)
    elapsed = time.monotonic() - sent
    assert (("error", "cancelled"), 0) == (
        (frame["event"], frame["data"]["code"]) if frame else None,
        node.bus.metrics.streams_active,
    )
    assert elapsed < 0.2


async def test_cancel_while_tokens_stream_within_200ms(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """cancel mid-answer (the model pacing its tokens): error{cancelled} within 200 ms."""
    script = [{"text": "word " * 200, "token_delay_ms": 20}]
    ws = await open_ws(http, node, {"messages": [USER]}, script)
    await read_until(ws, "token")
    sent = time.monotonic()
    await ws.send_json({"type": "cancel"})
    frames = await read_rest(ws)
    elapsed = time.monotonic() - sent
    assert (("error", "cancelled"), 0) == (
        (frames[-1]["event"], frames[-1]["data"]["code"]),
        node.bus.metrics.streams_active,
    )
    assert elapsed < 0.2


async def test_tool_timeout_tells_the_caller_and_the_model_goes_on(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """No result within tool_timeout_s: a tool_result frame with the timeout error, then the
    model's next turn sees it; a late answer is refused."""
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "clock"}]},
        # paced, so the stream is still open when the late answer arrives
        {"text": "Without the clock: {results}", "token_delay_ms": 40},
    ]
    # Timed from before the call: the node's 0.3 s start when it sends tool_call, which
    # can reach a loaded test process later than that.
    started = time.monotonic()
    ws = await open_ws(http, node, {"messages": [USER], "tools": [CLOCK]}, script)
    _, call = await read_until(ws, "tool_call")
    _, result = await read_until(ws, "tool_result")
    waited = time.monotonic() - started
    await ws.send_json({"type": "tool_result", "tool_call_id": call["data"]["id"], "body": 1})
    rest = await read_rest(ws)
    timeout = {"error": "timeout", "message": "no result from tool clock within 0.3 s"}
    assert (
        timeout,
        "Without the clock: " + json.dumps([timeout], separators=(",", ":")),
        "tool_result.refused",
    ) == (
        result["data"]["content"],
        text_of(rest),
        next((f["event"] for f in rest if f["event"] == "tool_result.refused"), "none"),
    )
    assert 0.3 <= waited < 10.0


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({"backend": "openai"}, "backend 'openai' is not offered here (offered: demo)"),
        (
            {"backend": "demo", "script": [{"text": 5}]},
            "demo script at 0/text: 5 is not of type 'string'",
        ),
    ],
)
async def test_bad_params_end_the_stream_with_bad_request(
    node: Node, http: aiohttp.ClientSession, params: dict[str, Any], code: str
) -> None:
    """An unknown backend or a broken demo script: error{bad_request} naming the problem."""
    ws = await http.ws_connect(node.url + "/bus/v1/call", protocols=("hearthnet-bus.v2",))
    await ws.send_json(
        llm_call_frame(node.keys, node.membership.community_id, {"messages": [USER]}, params)
    )
    frames = await read_rest(ws)
    assert [("error", "bad_request", code)] == [
        (f["event"], f["data"]["code"], f["data"]["message"]) for f in frames
    ]


async def test_schema_limits_refuse_before_streaming(
    node: Node, http: aiohttp.ClientSession
) -> None:
    """17 tools, or max_tokens over the node's cap: schema_mismatch before anything streams."""
    many = [{"name": f"t{i}"} for i in range(17)]
    codes = []
    for value in ({"messages": [USER], "tools": many}, {"messages": [USER], "max_tokens": 10**6}):
        ws = await http.ws_connect(node.url + "/bus/v1/call", protocols=("hearthnet-bus.v2",))
        await ws.send_json(llm_call_frame(node.keys, node.membership.community_id, value))
        codes += [f["data"]["code"] for f in await read_rest(ws)]
    assert ["schema_mismatch", "schema_mismatch"] == codes


async def test_llm_chat_is_offered_only_when_configured(make_config: MakeConfig) -> None:
    """No url and no demo: no llm.chat in the registry; the demo flag offers it."""
    async with Node(make_config()) as plain, Node(make_config(llm={"demo": True})) as demo:
        offered = (
            "llm.chat@2.0" in plain.statistics().capabilities,
            "llm.chat@2.0" in demo.statistics().capabilities,
        )
    assert (False, True) == offered


@pytest.mark.parametrize(
    ("llm", "message"),
    [
        ({"max_parallel_tools": 17}, "max_parallel_tools must be at most 16"),
        ({"max_rounds": 0}, "tool limits must be at least 1"),
        ({"tool_timeout_s": 0}, "must be > 0"),
        ({"max_tokens": 0}, "must be >= 1"),
    ],
)
async def test_unworkable_llm_settings_stop_the_node_at_start(
    make_config: MakeConfig, llm: dict[str, Any], message: str
) -> None:
    """[llm] limits that cannot work are a ConfigError when the node starts."""
    with pytest.raises(ConfigError, match=message):
        async with Node(make_config(llm={"demo": True, **llm})):
            pass
