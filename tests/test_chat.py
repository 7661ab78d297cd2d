"""``client.chat``: the whole tool loop over WebSocket and over SSE, on a real node, with the
same transcript either way (spec §5)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hearthnet.bus.transcript import ChatEvent
from hearthnet.chat import ChatResult, ChatTool
from hearthnet.client import Client
from hearthnet.community import Level
from hearthnet.errors import BadRequest, DeadlineExceeded, NotFound, SchemaMismatch
from hearthnet.identity import KeyPair
from hearthnet.node import Node
from tests.capabilities.llm_chat.support import CLOCK, LOOKUP, LOOKUP_SCRIPT, USER, WhoAmI
from tests.conftest import MakeConfig
from tests.helpers import wait_until

TRANSPORTS = pytest.mark.parametrize("prefer_ws", [True, False], ids=["ws", "sse"])


@pytest.fixture
async def node(make_config: MakeConfig) -> AsyncIterator[Node]:
    """A node with the demo model, a 0.3 s tool timeout and a caller-identity capability."""
    config = make_config(llm={"demo": True, "tool_timeout_s": 0.3})
    async with Node(config, extra_capabilities=[WhoAmI()]) as n:
        yield n


@pytest.fixture
async def client(node: Node) -> AsyncIterator[Client]:
    """A client with its own member key (not the node's)."""
    keys = KeyPair.generate()
    node.add_member(keys.node_id, Level.MEMBER, role="device")
    async with Client(node.url, keys=keys) as c:
        yield c


def lookup(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The caller's lookup tool."""
    return {"tool": name, "found": f"notes about {arguments.get('q')}"}


async def both(client: Client, messages: list[dict[str, Any]], **kw: Any) -> list[ChatResult]:
    """The same chat over WebSocket, then over SSE."""
    return [await client.chat(messages, prefer_ws=ws, backend="demo", **kw) for ws in (True, False)]


async def test_sse_recall_path_gives_the_ws_transcript(client: Client) -> None:
    """Three rounds (parallel calls, a bad call, a bound tool): WS in one call, SSE in four,
    same messages, text and events."""
    script = [
        {
            "text": "Checking two things. ",
            "tool_calls": [
                {"name": "lookup", "arguments": {"q": "water"}},
                {"name": "lookup", "arguments": {"q": "fire"}},
            ],
        },
        {"tool_calls": [{"name": "lookup", "arguments": {"q": 7}}]},
        {"tool_calls": [{"name": "whoami", "arguments": {"note": "hi"}}]},
        {"text": "All done: {results}"},
    ]
    tools = [LOOKUP, {"name": "whoami", "capability": "test.whoami@1.0"}]
    ws, sse = await both(
        client, [USER], tools=tools, tool_handler=lookup, params={"script": script}
    )
    assert (("ws", 1), ("sse", 3), ws.messages, ws.events, ws.text, ws.tokens_out) == (
        (ws.transport, ws.calls),
        (sse.transport, sse.calls),
        sse.messages,
        sse.events,
        sse.text,
        sse.tokens_out,
    )
    assert (3, "end", 9) == (ws.tool_rounds, ws.stop_reason, len(ws.messages))


@TRANSPORTS
async def test_parallel_tool_calls_are_collected(client: Client, prefer_ws: bool) -> None:
    """Three calls in one turn run at the same time; results come back in the calls' order."""
    script = [
        {"tool_calls": [{"name": "lookup", "arguments": {"q": q}} for q in ("a", "b", "c")]},
        {"text": "{results}"},
    ]
    running: set[str] = set()
    most = 0

    async def slow_lookup(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        nonlocal most
        running.add(arguments["q"])
        most = max(most, len(running))
        await wait_until(lambda: most == 3, within_s=5, what="all three calls running")
        running.discard(arguments["q"])
        return lookup(name, arguments)

    result = await client.chat(
        [USER],
        tools=[LOOKUP],
        tool_handler=slow_lookup,
        params={"script": script},
        prefer_ws=prefer_ws,
    )
    assert (3, [lookup("lookup", {"q": q}) for q in "abc"]) == (
        most,
        [m["content"] for m in result.messages if m["role"] == "tool"],
    )


@TRANSPORTS
async def test_round_limit_forces_a_final_answer(client: Client, prefer_ws: bool) -> None:
    """A model that always wants a tool is stopped after 6 rounds and answers without one."""
    calls: list[int] = []

    def clock(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        calls.append(len(calls) + 1)
        return {"tick": len(calls)}

    script = [{"text": "Again. ", "tool_calls": [{"name": "clock"}]}]
    result = await client.chat(
        [USER], tools=[CLOCK], tool_handler=clock, params={"script": script}, prefer_ws=prefer_ws
    )
    assert (
        6,
        [1, 2, 3, 4, 5, 6],
        True,
        'Here is what I found: clock returned {"tick":6}.',
        1 if prefer_ws else 7,
    ) == (
        result.tool_rounds,
        calls,
        result.done.get("tool_limit_reached"),
        result.text,
        result.calls,
    )


async def stuck(name: str, arguments: dict[str, Any]) -> Any:
    """A tool handler that never answers."""
    await asyncio.Event().wait()


async def test_slow_tool_gets_a_timeout_result_and_the_model_continues(client: Client) -> None:
    """A tool slower than tool_timeout_s (0.3 s): the model is told it timed out and answers;
    WS and SSE agree."""
    script = [{"tool_calls": [{"name": "clock"}]}, {"text": "No clock: {results}"}]
    started = time.monotonic()
    ws, sse = await both(
        client, [USER], tools=[CLOCK], tool_handler=stuck, params={"script": script}
    )
    elapsed = time.monotonic() - started
    timeout = {"error": "timeout", "message": "no result from tool clock within 0.3 s"}
    answer = 'No clock: [{"error":"timeout","message":"no result from tool clock within 0.3 s"}]'
    assert (timeout, ws.messages, ws.events, answer) == (
        ws.messages[2]["content"],
        sse.messages,
        sse.events,
        ws.text,
    )
    assert 0.6 <= elapsed < 5


async def test_a_blocking_sync_tool_times_out_the_same_on_both_transports(
    client: Client,
) -> None:
    """A sync handler that blocks (time.sleep, blocking I/O) runs off the event loop: the
    0.3 s tool timeout applies over SSE as over WS, and the stream stays served."""
    release = threading.Event()

    def blocking(name: str, arguments: dict[str, Any]) -> Any:
        release.wait(5)
        return {"late": True}

    script = [{"tool_calls": [{"name": "clock"}]}, {"text": "No clock: {results}"}]
    try:
        ws, sse = await both(
            client, [USER], tools=[CLOCK], tool_handler=blocking, params={"script": script}
        )
    finally:
        release.set()
    timeout = {"error": "timeout", "message": "no result from tool clock within 0.3 s"}
    assert [timeout, timeout] == [ws.messages[2]["content"], sse.messages[2]["content"]]


@TRANSPORTS
async def test_invalid_arguments_go_back_to_the_model(client: Client, prefer_ws: bool) -> None:
    """A call with arguments the schema refuses is answered by the node; the model retries."""
    ran: list[dict[str, Any]] = []

    def recording(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        ran.append(arguments)
        return lookup(name, arguments)

    script = [
        {"tool_calls": [{"name": "lookup", "arguments": {"q": 5}}]},
        {"tool_calls": [{"name": "lookup", "arguments": '{"q": "water"'}]},
        {"tool_calls": [{"name": "lookup", "arguments": {"q": "water"}}]},
        {"text": "{results}"},
    ]
    result = await client.chat(
        [USER],
        tools=[LOOKUP],
        tool_handler=recording,
        params={"script": script},
        prefer_ws=prefer_ws,
    )
    tool_messages = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert (
        [{"q": "water"}],
        ["invalid_arguments", "invalid_arguments"],
        "arguments at q: 5 is not of type 'string'",
        '{"q": "water"',
        lookup("lookup", {"q": "water"}),
        1 if prefer_ws else 2,
    ) == (
        ran,
        [c["error"] for c in tool_messages[:2]],
        tool_messages[0]["message"],
        result.messages[3]["tool_calls"][0]["arguments"],
        tool_messages[2],
        result.calls,
    )


@TRANSPORTS
async def test_bound_tools_run_under_the_callers_identity(client: Client, prefer_ws: bool) -> None:
    """A tool bound to a capability is called by the client, as the client, not by the node."""
    tools: list[ChatTool | dict[str, Any]] = [
        ChatTool("whoami", "who am I", {"type": "object"}, "test.whoami@1.0"),
        {"name": "echo", "parameters": {"type": "object"}, "capability": "echo@1.0"},
    ]
    script = [
        {
            "tool_calls": [
                {"name": "whoami", "arguments": {"x": 1}},
                {"name": "echo", "arguments": {"y": 2}},
            ]
        },
        {"text": "ok"},
    ]
    result = await client.chat([USER], tools=tools, params={"script": script}, prefer_ws=prefer_ws)
    assert client.keys is not None
    assert [
        {"identity": client.keys.node_id, "got": {"x": 1}},
        {"echo": {"y": 2}},
    ] == [m["content"] for m in result.messages if m["role"] == "tool"]


@TRANSPORTS
async def test_failing_and_unhandled_tools_report_errors_to_the_model(
    client: Client, prefer_ws: bool
) -> None:
    """A handler that raises, a bound capability that is missing: error results, no crash."""

    def broken(name: str, arguments: dict[str, Any]) -> Any:
        raise ValueError("disk on fire")

    tools: list[ChatTool | dict[str, Any]] = [CLOCK, {"name": "rag", "capability": "rag.query@1.0"}]
    script = [{"tool_calls": [{"name": "clock"}, {"name": "rag"}]}, {"text": "ok"}]
    result = await client.chat(
        [USER], tools=tools, tool_handler=broken, params={"script": script}, prefer_ws=prefer_ws
    )
    assert [
        {"error": "tool_failed", "message": "ValueError: disk on fire"},
        "not_found",
    ] == [
        result.messages[2]["content"],
        result.messages[3]["content"]["error"],
    ]


async def test_live_events_show_tokens_calls_and_results_as_they_happen(client: Client) -> None:
    """on_event sees tokens, the call and its result in the order they happened."""
    seen: list[ChatEvent] = []
    script = [
        {"text": "Let me see. ", "tool_calls": [{"name": "clock"}]},
        {"text": "It is noon."},
    ]
    await client.chat(
        [USER],
        tools=[CLOCK],
        tool_handler=lambda n, a: {"t": "12:00"},
        params={"script": script},
        on_event=seen.append,
        backend="demo",
    )
    kinds = [e.kind for e in seen if e.kind != "tool_call_delta"]
    assert [
        "token",
        "token",
        "token",
        "tool_call",
        "tool_result",
        "token",
        "token",
        "token",
        "done",
    ] == kinds


async def test_demo_without_a_script_calls_a_named_tool(client: Client) -> None:
    """The built-in demo model calls the tool the user names and answers from its result."""
    result = await client.chat(
        [{"role": "user", "content": "What time is it?"}],
        tools=[{"name": "time", "parameters": {"type": "object"}}],
        tool_handler=lambda n, a: {"now": "12:00"},
    )
    assert (
        'Here is what I found: time returned {"now":"12:00"}.',
        [{"id": "tc_1", "name": "time", "arguments": {}}],
    ) == (result.text, result.messages[1]["tool_calls"])


@TRANSPORTS
async def test_max_tokens_stops_the_answer(client: Client, prefer_ws: bool) -> None:
    """max_tokens cuts the model's answer: stop_reason max_tokens."""
    script = [{"text": "one two three four five"}]
    result = await client.chat([USER], max_tokens=2, params={"script": script}, prefer_ws=prefer_ws)
    assert ("max_tokens", "one two ") == (result.stop_reason, result.text)


async def test_errors_raise_the_wire_error(make_config: MakeConfig, client: Client) -> None:
    """A refused request raises its WireError, whose message names the limit (not the
    whole value); a node without llm.chat raises not_found."""
    with pytest.raises(SchemaMismatch) as refused:
        await client.chat([USER], tools=[{"name": f"t{i}"} for i in range(17)])
    assert "input at tools: 17 items: fails maxItems 16" == refused.value.message
    with pytest.raises(BadRequest, match=r"messages is a list of \{role, content\}"):
        await client.chat("How do I make water safe?")  # type: ignore[arg-type]
    async with Node(make_config()) as plain, Client(plain.url, keys=plain.keys) as c:
        with pytest.raises(NotFound):
            await c.chat([USER])


async def test_cancelling_chat_cancels_the_call_on_the_node(node: Node, client: Client) -> None:
    """Cancelling the task running chat() while a tool runs: the node's stream ends too."""
    started = asyncio.Event()

    async def stuck(name: str, arguments: dict[str, Any]) -> Any:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.get_running_loop().create_task(
        client.chat(
            [USER],
            tools=[CLOCK],
            tool_handler=stuck,
            params={"script": [{"tool_calls": [{"name": "clock"}]}]},
        )
    )
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wait_until(lambda: node.bus.metrics.streams_active == 0, within_s=1, what="stream end")
    cancelled = node.metrics.counter("hearthnet_calls_total", "", ("capability", "result"))
    assert 1.0 == cancelled.get("llm.chat", "cancelled")


@TRANSPORTS
async def test_more_calls_than_the_parallel_limit_run_four_at_a_time(
    client: Client, prefer_ws: bool
) -> None:
    """Six calls in one turn: at most four run at once (the node's limit), all six answered."""
    script = [
        {"tool_calls": [{"name": "lookup", "arguments": {"q": str(i)}} for i in range(6)]},
        {"text": "ok"},
    ]
    running: set[str] = set()
    started: list[str] = []
    most = 0

    async def gated(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        nonlocal most
        running.add(arguments["q"])
        started.append(arguments["q"])
        most = max(most, len(running))
        # hold each call until four run together, or until every call has started
        await wait_until(lambda: len(running) >= 4 or len(started) == 6, what="four calls")
        running.discard(arguments["q"])
        return lookup(name, arguments)

    result = await client.chat(
        [USER], tools=[LOOKUP], tool_handler=gated, params={"script": script}, prefer_ws=prefer_ws
    )
    assert (4, [lookup("lookup", {"q": str(i)}) for i in range(6)]) == (
        most,
        [m["content"] for m in result.messages if m["role"] == "tool"],
    )


async def test_the_calls_deadline_ends_a_wait_for_a_tool(make_config: MakeConfig) -> None:
    """A call deadline shorter than the tool timeout ends the stream with error{timeout}."""
    config = make_config(llm={"demo": True, "timeout_s": 0.3, "tool_timeout_s": 30})
    async with Node(config) as node, Client(node.url, keys=node.keys) as c:
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            await c.chat(
                [USER],
                tools=[CLOCK],
                tool_handler=stuck,
                params={"script": [{"tool_calls": [{"name": "clock"}]}]},
            )
        elapsed = time.monotonic() - started
        await wait_until(lambda: node.bus.metrics.streams_active == 0, what="stream end")
    assert 0.3 <= elapsed < 3


@TRANSPORTS
async def test_a_result_too_big_to_send_goes_to_the_model_as_an_error(
    client: Client, prefer_ws: bool
) -> None:
    """A tool result over max_result_bytes (256 KiB) is not sent (it would break the
    socket or the SSE re-call): the model gets payload_too_large and answers."""
    script = [
        {"tool_calls": [{"name": "clock"}, {"name": "lookup", "arguments": {"q": "x"}}]},
        {"text": "ok"},
    ]
    result = await client.chat(
        [USER],
        tools=[CLOCK, LOOKUP],
        tool_handler=lambda name, arguments: "x" * (1_100_000 if name == "clock" else 10),
        params={"script": script},
        prefer_ws=prefer_ws,
    )
    assert (
        {
            "error": "payload_too_large",
            "message": "the result of clock is 1100002 bytes of JSON, over this client's"
            " max_result_bytes (262144): return less",
        },
        "x" * 10,
        "ok",
    ) == (result.messages[2]["content"], result.messages[3]["content"], result.text)


async def test_dropped_calls_are_reported_in_the_result_on_both_transports(
    client: Client,
) -> None:
    """20 calls in one turn: 16 run, and result.done says 4 were dropped over SSE too (the
    count comes in the first re-call's done, the result holds the last one)."""
    script = [{"tool_calls": [{"name": "clock"}] * 20}, {"text": "ok"}]
    results = await both(
        client, [USER], tools=[CLOCK], tool_handler=lookup, params={"script": script}
    )
    assert [(4, 16, "ok")] * 2 == [
        (r.done.get("tool_calls_dropped"), len(r.messages[1]["tool_calls"]), r.text)
        for r in results
    ]


@TRANSPORTS
async def test_publish_to_sends_the_answer_to_a_topic(
    node: Node, client: Client, prefer_ws: bool
) -> None:
    """client.chat(publish_to=) puts the answer on the topic (over SSE on every re-call):
    one message.complete, after a tool round, ending with the answer (over WS it holds the
    whole stream's text, the words before the tool call too)."""
    result = await client.chat(
        [USER],
        tools=[LOOKUP],
        tool_handler=lookup,
        params={"script": LOOKUP_SCRIPT},
        backend="demo",
        prefer_ws=prefer_ws,
        publish_to="chat.room.kitchen",
    )
    async with Client(node.url, keys=node.keys) as owner:
        page = await owner.history("chat.room.kitchen", limit=500)
    messages = [m["data"] for m in page["messages"]]
    complete = [m["data"] for m in messages if m["type"] == "message.complete"]
    streamed = "".join(e.data["text"] for e in result.events if e.kind == "token")
    assert [streamed if prefer_ws else result.text] == [c["text"] for c in complete]


@TRANSPORTS
async def test_deadline_ms_bounds_the_whole_chat(make_config: MakeConfig, prefer_ws: bool) -> None:
    """chat(deadline_ms=300) ends with timeout while a tool is still running, over SSE
    too, where the tool runs between calls and each re-call must get what is left."""
    config = make_config(llm={"demo": True, "tool_timeout_s": 30})
    async with Node(config) as node, Client(node.url, keys=node.keys) as c:
        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            async with asyncio.timeout(5):  # the bug: SSE waited 30 s for the tool
                await c.chat(
                    [USER],
                    tools=[CLOCK],
                    tool_handler=stuck,
                    params={"script": [{"tool_calls": [{"name": "clock"}]}]},
                    prefer_ws=prefer_ws,
                    deadline_ms=300,
                )
        elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 3
