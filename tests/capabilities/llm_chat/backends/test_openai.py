"""The OpenAI-compatible backend against a local model server that speaks the real
chat-completions streaming protocol (``data: {chunk}`` events, ``tool_calls`` deltas,
``finish_reason``, ``data: [DONE]``), playing back recorded-style responses per round."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from aiohttp import web

from capabilities.llm_chat.backends.openai import (
    ChunkParser,
    OpenAIBackend,
    ToolNames,
    build_request,
)
from hearthnet.bus.chatrequest import (
    ChatRequest,
    ToolLimits,
)
from hearthnet.bus.toolloop import (
    TextDelta,
    ToolCallDelta,
    TurnPlan,
)
from hearthnet.client import Client
from hearthnet.errors import BadRequest, NotFound, RateLimited, Unavailable
from hearthnet.node import Node
from tests.capabilities.llm_chat.support import USER
from tests.conftest import MakeConfig
from tests.helpers import wait_until

MODEL = "llama3.1:8b"
NOTES = {
    "name": "notes.search",
    "description": "Search the community's notes.",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}
CLOCK = {"name": "clock", "description": "The time.", "parameters": {"type": "object"}}


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    """One chat.completion.chunk, shaped like those Ollama, llama.cpp and vLLM send."""
    return {
        "id": "chatcmpl-8f2c",
        "object": "chat.completion.chunk",
        "created": 1763800000,
        "model": MODEL,
        "system_fingerprint": "fp_ollama",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        **extra,
    }


def tool_piece(index: int, arguments: str, call_id: str = "", name: str = "") -> dict[str, Any]:
    """A tool_calls delta: the first piece of a call carries id, type and name."""
    piece: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id:
        piece.update(id=call_id, type="function")
        piece["function"]["name"] = name
    return chunk({"tool_calls": [piece]})


# Round 1: some text, then two parallel calls whose arguments arrive in fragments.
ROUND_TOOLS = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "I'll look"}),
    chunk({"content": " that up."}),
    tool_piece(0, "", "call_Xk3", "notes_search"),
    tool_piece(0, '{"q'),
    tool_piece(0, '": "wat'),
    tool_piece(0, 'er"}'),
    tool_piece(1, "", "call_Yq9", "clock"),
    tool_piece(1, "{}"),
    chunk({}, "tool_calls"),
]
# Round 2: the answer, then a usage-only chunk (stream_options.include_usage style).
ROUND_ANSWER = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Boil it"}),
    chunk({"content": " for one minute."}),
    chunk({}, "stop"),
    {**chunk({}), "choices": [], "usage": {"prompt_tokens": 80, "completion_tokens": 7}},
]


class FakeModelServer:
    """A chat-completions server on loopback. ``rounds[i]`` is played for the i-th request
    (a list of chunks, or ``(status, body)`` for a refusal); it records what it was sent."""

    def __init__(
        self, rounds: list[Any], *, pace_s: float = 0.0, endless: bool = False, done: bool = True
    ) -> None:
        self.rounds = rounds
        self.pace_s = pace_s
        self.endless = endless
        self.done = done  # False: the stream just stops (a server that died mid-answer)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.disconnected_at: float | None = None
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> FakeModelServer:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        # Cancel handlers when the client goes away, so a dropped connection is seen.
        self._runner = web.AppRunner(app, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}/v1"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Record the request, then play this round back."""
        self.requests.append(await request.json())
        self.headers.append(dict(request.headers))
        played = self.rounds[min(len(self.requests), len(self.rounds)) - 1]
        if isinstance(played, tuple):
            status, body = played
            return web.json_response(body, status=status)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        try:
            for item in played:
                await self._send(response, item)
            while self.endless:  # a model that keeps talking until the caller hangs up
                await self._send(response, chunk({"content": " more"}))
            if self.done:
                await response.write(b"data: [DONE]\n\n")
        except (asyncio.CancelledError, ConnectionResetError):
            self.disconnected_at = time.monotonic()
            raise
        return response

    async def _send(self, response: web.StreamResponse, item: dict[str, Any]) -> None:
        if self.pace_s:
            await asyncio.sleep(self.pace_s)
        await response.write(b"data: " + json.dumps(item).encode() + b"\n\n")


@pytest.fixture(autouse=True)
def no_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """No key unless a test sets one: the environment of the machine must not leak in."""
    monkeypatch.delenv("HEARTHNET_LLM_API_KEY", raising=False)


@pytest.fixture
def api_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """The model server's API key, in the default environment variable."""
    monkeypatch.setenv("HEARTHNET_LLM_API_KEY", "sk-local-test")
    return "sk-local-test"


def llm_node(make_config: MakeConfig, server: FakeModelServer, **llm: Any) -> Node:
    """A node whose llm.chat talks to ``server``."""
    return Node(make_config(llm={"url": server.url, "model": MODEL, **llm}))


def lookup(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The caller's tools."""
    return {"hits": 2} if name == "notes.search" else {"now": "12:00"}


@pytest.mark.parametrize("prefer_ws", [True, False], ids=["ws", "sse"])
async def test_tool_loop_through_an_openai_compatible_server(
    make_config: MakeConfig, api_key: str, prefer_ws: bool
) -> None:
    """Text, two streamed tool calls, results back to the server as tool messages, the answer."""
    async with (
        FakeModelServer([ROUND_TOOLS, ROUND_ANSWER]) as server,
        llm_node(make_config, server) as node,
        Client(node.url, keys=node.keys) as client,
    ):
        result = await client.chat(
            [{"role": "system", "content": "Be brief."}, USER],
            tools=[NOTES, CLOCK],
            tool_handler=lookup,
            prefer_ws=prefer_ws,
        )
    wire_tools = [
        {
            "type": "function",
            "function": {
                "name": "notes_search",
                "description": NOTES["description"],
                "parameters": NOTES["parameters"],
            },
        },
        {
            "type": "function",
            "function": {
                "name": "clock",
                "description": "The time.",
                "parameters": {"type": "object"},
            },
        },
    ]
    first_messages = [{"role": "system", "content": "Be brief."}, USER]
    assert {
        "model": MODEL,
        "stream": True,
        "messages": first_messages,
        "tools": wire_tools,
        "tool_choice": "auto",
        "max_tokens": 4096,
    } == server.requests[0]
    assert [
        *first_messages,
        {
            "role": "assistant",
            "content": "I'll look that up.",
            "tool_calls": [
                {
                    "id": "call_Xk3",
                    "type": "function",
                    "function": {"name": "notes_search", "arguments": '{"q":"water"}'},
                },
                {
                    "id": "call_Yq9",
                    "type": "function",
                    "function": {"name": "clock", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_Xk3", "content": '{"hits":2}'},
        {"role": "tool", "tool_call_id": "call_Yq9", "content": '{"now":"12:00"}'},
    ] == server.requests[1]["messages"]
    assert (
        "Boil it for one minute.",
        1,
        2 + 7,
        ["Bearer sk-local-test"] * 2,
        [
            {"id": "call_Xk3", "name": "notes.search", "arguments": {"q": "water"}},
            {"id": "call_Yq9", "name": "clock", "arguments": {}},
        ],
    ) == (
        result.text,
        result.tool_rounds,
        result.tokens_out,
        [hd["Authorization"] for hd in server.headers],
        result.messages[2]["tool_calls"],
    )


async def test_whole_tool_call_in_one_chunk_with_finish_stop(make_config: MakeConfig) -> None:
    """Servers that send a whole call at once (arguments as an object, finish_reason stop,
    no index) still make a tool round."""
    whole = [
        chunk(
            {
                "tool_calls": [
                    {"id": "call_1", "function": {"name": "clock", "arguments": {"zone": "UTC"}}}
                ]
            }
        ),
        chunk({}, "stop"),
    ]
    async with (
        FakeModelServer([whole, ROUND_ANSWER]) as server,
        llm_node(make_config, server) as node,
        Client(node.url, keys=node.keys) as client,
    ):
        result = await client.chat([USER], tools=[CLOCK], tool_handler=lookup)
    assert (1, {"zone": "UTC"}, "Authorization" in server.headers[0]) == (
        result.tool_rounds,
        result.messages[1]["tool_calls"][0]["arguments"],
        False,
    )


@pytest.mark.parametrize("prefer_ws", [True, False], ids=["ws", "sse"])
async def test_parallel_calls_all_numbered_index_0_stay_apart(
    make_config: MakeConfig, prefer_ws: bool
) -> None:
    """Ollama streams every call of a turn as `index: 0` (ollama#15457): a piece with a
    new id is a new call, not more of the first one's name and arguments."""
    same_index = [
        chunk({"role": "assistant", "content": ""}),
        tool_piece(0, '{"q": "water"}', "call_a", "notes_search"),
        tool_piece(0, '{"q": "ice"}', "call_b", "notes_search"),
        tool_piece(0, "", "call_c", "clock"),
        tool_piece(0, "{}"),
        chunk({}, "tool_calls"),
    ]
    async with (
        FakeModelServer([same_index, ROUND_ANSWER]) as server,
        llm_node(make_config, server) as node,
        Client(node.url, keys=node.keys) as client,
    ):
        result = await client.chat(
            [USER], tools=[NOTES, CLOCK], tool_handler=lookup, prefer_ws=prefer_ws
        )
    assert (
        [
            {"id": "call_a", "name": "notes.search", "arguments": {"q": "water"}},
            {"id": "call_b", "name": "notes.search", "arguments": {"q": "ice"}},
            {"id": "call_c", "name": "clock", "arguments": {}},
        ],
        ["call_a", "call_b", "call_c"],
        "Boil it for one minute.",
    ) == (
        result.messages[1]["tool_calls"],
        [m["tool_call_id"] for m in server.requests[1]["messages"][2:]],
        result.text,
    )


async def test_stream_that_stops_before_the_end_is_unavailable(make_config: MakeConfig) -> None:
    """A model server that dies mid-answer (no finish_reason, no [DONE]) is `unavailable`,
    not a short answer that looks complete."""
    async with (
        FakeModelServer([[chunk({"content": "The answer is"})]], done=False) as server,
        llm_node(make_config, server) as node,
        Client(node.url, keys=node.keys) as client,
    ):
        with pytest.raises(Unavailable, match="ended before the answer was complete"):
            await client.chat([USER])


async def test_server_that_does_not_stream_is_unavailable(make_config: MakeConfig) -> None:
    """A server that ignores `"stream": true` and answers one JSON completion is told
    apart from an empty answer."""
    whole = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}}]}
    async with (
        FakeModelServer([(200, whole)]) as server,
        llm_node(make_config, server) as node,
        Client(node.url, keys=node.keys) as client,
    ):
        with pytest.raises(Unavailable, match="not an event stream"):
            await client.chat([USER])


async def test_cancel_mid_answer_closes_the_model_servers_response(
    make_config: MakeConfig,
) -> None:
    """cancel while the model server streams: error{cancelled} within 200 ms, and the
    upstream connection is dropped so the server stops generating."""
    async with (
        FakeModelServer([[chunk({"content": "Thinking"})]], pace_s=0.01, endless=True) as server,
        llm_node(make_config, server) as node,
        Client(node.url, keys=node.keys) as client,
        client.stream("llm.chat@2.0", {"messages": [USER]}) as stream,
    ):
        frames = []
        async for frame in stream:
            frames.append(frame)
            if len(frames) == 3:
                sent = time.monotonic()
                await stream.cancel()
            if frame.terminal:
                ended = time.monotonic()
        await wait_until(lambda: server.disconnected_at is not None, within_s=2, what="hang-up")
    assert (("error", "cancelled"), 0) == (
        (frames[-1].event, frames[-1].data["code"]),
        node.bus.metrics.streams_active,
    )
    assert ended - sent < 0.2
    assert server.disconnected_at is not None
    assert server.disconnected_at - sent < 0.2


@pytest.mark.parametrize(
    ("played", "error", "message"),
    [
        ((500, {"error": "out of memory"}), Unavailable, "answered 500"),
        ((404, {"error": {"message": "model 'x' not found"}}), NotFound, "model 'x' not found"),
        ((429, {"error": "slow down"}), RateLimited, "answered 429"),
        ((400, {"error": "tools unsupported"}), BadRequest, "tools unsupported"),
        (
            [chunk({"content": "Hi"}), {"error": {"message": "model crashed"}}],
            Unavailable,
            "crashed",
        ),
    ],
)
async def test_model_server_failures_become_wire_errors(
    make_config: MakeConfig, played: Any, error: type[Exception], message: str
) -> None:
    """Refusals and mid-stream failures of the model server end the call with a wire error."""
    async with (
        FakeModelServer([played]) as server,
        llm_node(make_config, server) as node,
        Client(node.url, keys=node.keys) as client,
    ):
        with pytest.raises(error, match=message):
            await client.chat([USER])


async def test_unreachable_model_server_is_unavailable(make_config: MakeConfig) -> None:
    """Nothing listening at the URL: unavailable, with a retry hint."""
    async with FakeModelServer([]) as server:
        url = server.url  # the port is free again once the server is gone
    async with Node(make_config(llm={"url": url})) as node, Client(node.url, keys=node.keys) as c:
        with pytest.raises(Unavailable, match="cannot reach the model server") as info:
            await c.chat([USER])
    assert 1000 == info.value.retry_after_ms


def test_request_body_for_a_conversation_with_tool_results() -> None:
    """Our messages become OpenAI's: empty assistant text with calls is null, arguments and
    results are JSON text, a named tool choice is a function choice, names are mapped."""
    limits = ToolLimits()
    value = {
        "messages": [
            USER,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": "a", "name": "notes.search", "arguments": {"q": "x"}}],
            },
            {"role": "tool", "tool_call_id": "a", "content": "plain text result"},
        ],
        "tools": [NOTES],
        "tool_choice": {"name": "notes.search"},
    }
    request = ChatRequest.parse(value, limits)
    plan = TurnPlan(request.messages, request.tools, {"name": "notes.search"}, 64, 2, True)
    body, names = build_request(plan, "", max_tokens=64)
    assert (
        [
            USER,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "a",
                        "type": "function",
                        "function": {"name": "notes_search", "arguments": '{"q":"x"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": "plain text result"},
        ],
        {"type": "function", "function": {"name": "notes_search"}},
        False,
        64,
        "notes.search",
    ) == (
        body["messages"],
        body["tool_choice"],
        "model" in body,
        body["max_tokens"],
        names.ours("notes_search"),
    )


def test_tool_name_mapping_avoids_collisions() -> None:
    """Two names that sanitise alike get distinct wire names, and map back."""
    names = ToolNames(["a.b", "a_b", "a-b"])
    assert (["a_b_2", "a_b", "a-b"], ["a.b", "a_b", "a-b"]) == (
        [names.wire(n) for n in ("a.b", "a_b", "a-b")],
        [names.ours(names.wire(n)) for n in ("a.b", "a_b", "a-b")],
    )


def test_chunk_parser_events_and_junk() -> None:
    """Chunks become events; [DONE] finishes; a malformed chunk is unavailable."""
    parser = ChunkParser(ToolNames(["clock"]))
    events = parser.feed(json.dumps(chunk({"content": "Hi"})))
    events += parser.feed(json.dumps(tool_piece(0, "{}", "c1", "clock")))
    parser.feed("[DONE]")
    with pytest.raises(Unavailable, match="malformed chunk"):
        ChunkParser(ToolNames([])).feed("{not json")
    assert ([TextDelta("Hi"), ToolCallDelta(0, "c1", "clock", "{}")], True) == (
        events,
        parser.finished,
    )


def test_chunk_parser_splits_reused_indexes_and_keeps_correct_ones() -> None:
    """A new id at a used index gets the next free index; pieces without an id (or with
    an empty one) follow the latest call at that index; correct indexes are kept."""
    parser = ChunkParser(ToolNames(["a", "b"]))
    pieces = [
        tool_piece(0, "", "x", "a"),
        tool_piece(1, "", "y", "b"),
        tool_piece(0, "{}"),
        tool_piece(0, "", "z", "a"),
        tool_piece(0, "{}"),
        tool_piece(1, "{}"),
        chunk({"tool_calls": [{"index": 1, "id": "", "function": {"arguments": " "}}]}),
    ]
    events = [e for p in pieces for e in parser.feed(json.dumps(p))]
    assert [0, 1, 0, 2, 2, 1, 1] == [e.index for e in events if isinstance(e, ToolCallDelta)]
    with pytest.raises(Unavailable, match="ended before the answer was complete"):
        parser.end()


async def test_shutdown_closes_the_connection_pool(make_config: MakeConfig) -> None:
    """After a call, stopping the node closes the backend's HTTP session (no leaked sockets)."""
    async with FakeModelServer([ROUND_ANSWER]) as server:
        node = llm_node(make_config, server)
        async with node, Client(node.url, keys=node.keys) as client:
            await client.chat([USER])
            assert node.llm is not None
            backend = node.llm.backends["openai"]
            assert isinstance(backend, OpenAIBackend)
            session = backend._session  # the pool the call used
        assert (True, None, 1) == (
            session is not None and session.closed,
            backend._session,
            len(server.requests),
        )
