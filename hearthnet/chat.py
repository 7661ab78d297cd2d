"""``client.chat(...)``: a whole ``llm.chat@2.0`` tool loop (spec §5), over WebSocket or SSE,
with the same result.

Over WebSocket, one call carries every round: each ``tool_call`` frame is run at once
and its result goes back on the same socket. Where WebSocket is refused, the client
falls back to SSE: a stream ends with ``done{stop_reason:"tool_calls"}``, the calls are
run here (at most ``max_parallel_tools`` at once, each within ``tool_timeout_ms``, as the
node announced), and ``llm.chat`` is called again with the assistant message and the
tool messages appended. Both paths build the conversation with the same
:class:`~hearthnet.bus.transcript.Transcript`, so both give the same messages, text and
events.

A tool is run by, in order: its ``capability`` binding (``client.call(capability,
arguments)`` under this client's own identity: the node never calls for you), the
``tool_handler(name, arguments)`` you pass (a sync one in a worker thread), or else it answers
``{"error": "no_handler"}``. A failing tool answers ``{"error": code, "message"}``; the
model sees that and carries on. So does a result whose JSON is over ``max_result_bytes``
(``payload_too_large``): sent as it is, it would break the WebSocket (over its 1 MiB message
limit) or the SSE re-call (over the 1 MiB body limit), ending the whole chat.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from websockets.exceptions import ConnectionClosed

from hearthnet.bus.chatrequest import (
    EMPTY_PARAMETERS,
    tool_error,
    tool_timeout_content,
)
from hearthnet.bus.transcript import ChatEvent, ToolCall, Transcript
from hearthnet.errors import (
    BadRequest,
    DeadlineExceeded,
    InternalError,
    WireError,
    error_from_wire,
)
from hearthnet.frames import Frame

if TYPE_CHECKING:
    from hearthnet.client import Client, Stream

CHAT_CAPABILITY = "llm.chat@2.0"
# The node stops at its round limit (6 by default); this only bounds a misbehaving node.
MAX_CALLS_PER_TURN = 64
# A quarter of the node's default message and body limit (1 MiB), so that a round of a few
# big results still fits an SSE re-call, and the conversation the next user turn sends.
MAX_RESULT_BYTES = 256 * 1024

ChatToolHandler = Callable[[str, dict[str, Any]], Awaitable[Any] | Any]
OnEvent = Callable[[ChatEvent], None]


@dataclass(frozen=True, slots=True)
class ChatTool:
    """A tool offered to the model. ``capability`` binds it to a bus capability
    (``"rag.query@1.0"``) that this client calls with the model's arguments."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: dict(EMPTY_PARAMETERS))
    capability: str | None = None

    @classmethod
    def parse(cls, obj: ChatTool | dict[str, Any]) -> ChatTool:
        """From ``{"name", "description"?, "parameters"?, "capability"?}``."""
        if isinstance(obj, ChatTool):
            return obj
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise BadRequest("a tool is {name, description?, parameters?, capability?}")
        return cls(
            obj["name"],
            str(obj.get("description", "")),
            dict(obj.get("parameters") or EMPTY_PARAMETERS),
            obj.get("capability"),
        )

    def to_wire(self) -> dict[str, Any]:
        """What the node and the model see (the binding stays with the client)."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


@dataclass(frozen=True, slots=True)
class ChatResult:
    """The outcome of one conversation turn.

    Attributes:
        messages: the whole conversation: yours, then the assistant's tool-call messages,
            the tool messages and the final answer. Pass it (plus the next user message)
            to the next ``chat``.
        text: the final answer.
        events: what the user saw, in a fixed order (tokens as they came; per round, the
            tool calls then their results in the calls' order).
        transport: ``ws`` or ``sse``; calls: ``llm.chat`` calls made (SSE: one per round).
    """

    messages: list[dict[str, Any]]
    text: str
    stop_reason: str
    tool_rounds: int
    tokens_out: int
    events: list[ChatEvent]
    transport: str
    calls: int
    done: dict[str, Any]


class ToolRunner:
    """Runs the model's tool calls for a client; never raises for a tool's failure."""

    def __init__(
        self,
        client: Client,
        tools: Sequence[ChatTool],
        handler: ChatToolHandler | None,
        max_result_bytes: int = MAX_RESULT_BYTES,
    ) -> None:
        self.client = client
        self.tools = {t.name: t for t in tools}
        self.handler = handler
        self.max_result_bytes = max_result_bytes

    async def run(self, call: ToolCall) -> Any:
        """The tool's result, or ``{"error", "message"}``."""
        tool = self.tools.get(call.name)
        try:
            if tool is not None and tool.capability:
                result: Any = await self.client.call(tool.capability, call.arguments)
            elif self.handler is not None:
                if inspect.iscoroutinefunction(self.handler):
                    result = await self.handler(call.name, call.arguments)
                else:
                    # A sync handler may block (time.sleep, blocking I/O): off the event
                    # loop, the stream keeps being read and the tool timeout applies.
                    result = await asyncio.to_thread(self.handler, call.name, call.arguments)
                if inspect.isawaitable(result):
                    result = await result
            else:
                return tool_error("no_handler", f"this client has no handler for {call.name}")
            size = len(orjson.dumps(result))  # the result must travel as JSON
        except WireError as exc:
            return tool_error(exc.code, exc.message)
        except Exception as exc:  # a tool's failure goes to the model, not up the stack
            return tool_error("tool_failed", f"{type(exc).__name__}: {exc}")
        if size > self.max_result_bytes:
            return tool_error(
                "payload_too_large",
                f"the result of {call.name} is {size} bytes of JSON, over this client's"
                f" max_result_bytes ({self.max_result_bytes}): return less",
            )
        return result

    async def run_all(self, calls: list[ToolCall], *, timeout_ms: int, parallel: int) -> list[Any]:
        """Run handed-back calls (SSE) the way the node would have: at most ``parallel``
        at once, each within ``timeout_ms`` (else the same timeout error the node gives)."""
        gate = asyncio.Semaphore(max(1, parallel))
        results: list[Any] = [None] * len(calls)

        async def one(i: int, call: ToolCall) -> None:
            async with gate:
                try:
                    async with asyncio.timeout(timeout_ms / 1000):
                        results[i] = await self.run(call)
                except TimeoutError:
                    results[i] = tool_timeout_content(call.name, timeout_ms)

        async with asyncio.TaskGroup() as group:
            for i, call in enumerate(calls):
                group.create_task(one(i, call))
        return results


async def run_chat(
    client: Client,
    messages: Sequence[dict[str, Any]],
    *,
    tools: Sequence[ChatTool | dict[str, Any]] = (),
    tool_handler: ChatToolHandler | None = None,
    tool_choice: str | dict[str, Any] = "auto",
    max_tokens: int | None = None,
    model: str | None = None,
    backend: str | None = None,
    params: dict[str, Any] | None = None,
    prefer_ws: bool = True,
    on_event: OnEvent | None = None,
    deadline_ms: int | None = None,
    target: str | None = None,
    max_result_bytes: int = MAX_RESULT_BYTES,
    publish_to: str | None = None,
) -> ChatResult:
    """Run one conversation turn to its answer (see the module docstring); ``target``
    pins ``llm.chat`` to one node, reached through the mesh (spec §2.3).

    Raises:
        WireError: the node (or the model server behind it) ended a call with an error;
            ``Cancelled`` if this task was cancelled (the node was told).
    """
    if isinstance(messages, str | bytes) or not all(isinstance(m, dict) for m in messages):
        raise BadRequest(
            'messages is a list of {role, content}, e.g. [{"role": "user", "content": "hi"}]'
        )
    chat_tools = [ChatTool.parse(t) for t in tools]
    runner = ToolRunner(client, chat_tools, tool_handler, max_result_bytes)
    call_params = dict(params or {})
    if model is not None:
        call_params["model"] = model
    if backend is not None:
        call_params["backend"] = backend
    transcript = Transcript(list(messages))
    notify = on_event or (lambda event: None)
    transport = ""
    tokens_out = 0  # over SSE each re-call counts its own turns; the answer's total is the sum
    dropped = 0  # likewise the calls dropped (over max_calls_per_turn) in each re-call
    # deadline_ms bounds the whole chat: over SSE the tools run between calls, so each
    # re-call gets what is left and the tools' time counts, as it does over WS.
    left = _Deadline(deadline_ms)
    for calls in range(1, MAX_CALLS_PER_TURN + 1):
        value: dict[str, Any] = {"messages": transcript.messages, "stream": True}
        if chat_tools:
            value["tools"] = [t.to_wire() for t in chat_tools]
            value["tool_choice"] = tool_choice
        if max_tokens is not None:
            value["max_tokens"] = max_tokens
        if publish_to is not None:
            value["publish_to"] = publish_to  # on every SSE re-call: each streams a part
        async with client.stream(
            CHAT_CAPABILITY,
            value,
            params=call_params or None,
            prefer_ws=prefer_ws,
            deadline_ms=left.ms(),
            target=target,
        ) as stream:
            transport = stream.transport or ""
            terminal, handed_back = await _one_call(stream, transcript, runner, notify)
        if terminal.event == "error":
            raise error_from_wire(terminal.data)
        done = transcript.done or {}
        tokens_out += int(done.get("tokens_out", 0))
        dropped += int(done.get("tool_calls_dropped", 0))
        if done.get("stop_reason") != "tool_calls":
            if dropped:
                done = {**done, "tool_calls_dropped": dropped}
            return ChatResult(
                messages=transcript.messages,
                text=transcript.text,
                stop_reason=str(done.get("stop_reason", "end")),
                tool_rounds=int(done.get("tool_rounds", 0)),
                tokens_out=tokens_out,
                events=list(transcript.events),
                transport=transport,
                calls=calls,
                done=done,
            )
        try:
            async with asyncio.timeout(left.seconds()):
                results = await runner.run_all(
                    handed_back,
                    timeout_ms=int(done.get("tool_timeout_ms", 30_000)),
                    parallel=int(done.get("max_parallel_tools", 4)),
                )
        except TimeoutError as exc:
            raise left.passed() from exc
        for call, content in zip(handed_back, results, strict=True):
            transcript.record_result(call.id, content)
            notify(ChatEvent("tool_result", _result_event(call, content)))
        transcript.close_round()
    raise InternalError(f"llm.chat asked for tools {MAX_CALLS_PER_TURN} times in one turn")


class _Deadline:
    """What is left of a chat's ``deadline_ms`` (None: no deadline)."""

    def __init__(self, deadline_ms: int | None) -> None:
        self.deadline_ms = deadline_ms
        now = asyncio.get_running_loop().time()
        self.ends_at = None if deadline_ms is None else now + deadline_ms / 1000

    def seconds(self) -> float | None:
        if self.ends_at is None:
            return None
        return self.ends_at - asyncio.get_running_loop().time()

    def ms(self) -> int | None:
        """Milliseconds left for the next call; raises DeadlineExceeded when none are."""
        seconds = self.seconds()
        if seconds is None:
            return None
        if seconds * 1000 < 1:
            raise self.passed()
        return int(seconds * 1000)

    def passed(self) -> DeadlineExceeded:
        return DeadlineExceeded(f"the chat's deadline_ms ({self.deadline_ms}) passed")


def _result_event(call: ToolCall, content: Any) -> dict[str, Any]:
    return {"id": call.id, "name": call.name, "content": content}


async def _one_call(
    stream: Stream, transcript: Transcript, runner: ToolRunner, notify: OnEvent
) -> tuple[Frame, list[ToolCall]]:
    """Read one llm.chat stream to its end; over WS answer tool calls as they come."""
    inline = stream.transport == "ws"
    answering: dict[str, asyncio.Task[None]] = {}
    handed_back: list[ToolCall] = []
    announced: set[str] = set()

    async def answer(call: ToolCall) -> None:
        content = await runner.run(call)
        if transcript.record_result(call.id, content):
            notify(ChatEvent("tool_result", _result_event(call, content)))
            with contextlib.suppress(ConnectionClosed):
                await stream.send_tool_result(call.id, content)

    try:
        async for frame in stream:
            call = transcript.feed(frame)
            data = frame.data
            if call is not None:
                announced.add(call.id)
                notify(
                    ChatEvent(
                        "tool_call",
                        {"id": call.id, "name": call.name, "arguments": data.get("arguments")},
                    )
                )
                if inline:
                    answering[call.id] = asyncio.get_running_loop().create_task(answer(call))
                else:
                    handed_back.append(call)
            elif frame.event == "tool_result":
                call_id = str(data.get("tool_call_id"))
                task = answering.pop(call_id, None)
                if task is not None:
                    task.cancel()  # the node answered it (timed out): stop working on it
                if call_id not in announced:
                    notify(
                        ChatEvent(
                            "tool_call",
                            {
                                "id": call_id,
                                "name": data.get("name"),
                                "arguments": data.get("arguments"),
                            },
                        )
                    )
                notify(
                    ChatEvent(
                        "tool_result",
                        {
                            "id": call_id,
                            "name": data.get("name"),
                            "content": data.get("content"),
                        },
                    )
                )
            elif frame.event in ("token", "tool_call_delta", "done", "error"):
                notify(ChatEvent(frame.event, dict(data)))
            if frame.terminal:
                return frame, handed_back
    except asyncio.CancelledError:
        # Tell the node (spec §3.6: it stops within 200 ms), then let the cancel through.
        with contextlib.suppress(ConnectionClosed, OSError):
            await stream.cancel()
        raise
    finally:
        for task in answering.values():
            task.cancel()
    raise InternalError("llm.chat stream ended without done or error")
