"""``llm.chat@2.0`` (spec §5): a model's answer streamed, with tool calls answered by the
caller in the middle of it.

Thin asyncio glue around :class:`~hearthnet.bus.toolloop.ToolLoop`: it runs model turns
on a backend, passes the loop's frames to the bus, and waits for tool results through
:class:`~hearthnet.bus.capability.CallContext`. Over WebSocket (``ctx.inline_tools``) the
results come back on the same socket and the model continues in the same stream; over
SSE the stream ends with ``done{stop_reason:"tool_calls"}`` and the caller re-calls with
the results appended.

Every wait here is cancellable: a ``cancel`` from the caller cancels the task running
this generator, the ``finally`` blocks close the backend's turn (and with it the HTTP
response from the model server) and the tool waits, and the transport sends
``error{cancelled}`` (spec §3.6: within 200 ms).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from capabilities.llm_chat.backends import ChatBackend
from capabilities.llm_chat.publish import AnswerOnTopic, TopicPublisher
from hearthnet.bus.capability import MAX_PENDING_TOOL_RESULTS, CallContext
from hearthnet.bus.chatrequest import (
    TOOL_NAME_PATTERN,
    ChatRequest,
    ToolLimits,
)
from hearthnet.bus.descriptor import CapabilityDescriptor
from hearthnet.bus.toolloop import (
    ToolLoop,
    TurnEnd,
)
from hearthnet.config import LlmSection
from hearthnet.errors import BadRequest, ConfigError, DeadlineExceeded
from hearthnet.frames import Frame

MAX_CALL_ID_CHARS = 128


def request_schema(cfg: LlmSection) -> dict[str, Any]:
    """The JSON Schema of an ``llm.chat@2.0`` input (spec §5), with the configured bounds."""
    tool_call = {
        "type": "object",
        "required": ["id", "name"],
        "properties": {
            "id": {"type": "string", "maxLength": MAX_CALL_ID_CHARS},
            "name": {"type": "string", "maxLength": 64},
            "arguments": {"type": ["object", "string"]},
        },
    }
    message = {
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"enum": ["system", "user", "assistant", "tool"]},
            "tool_calls": {"type": "array", "maxItems": cfg.max_calls_per_turn, "items": tool_call},
            "tool_call_id": {"type": "string", "maxLength": MAX_CALL_ID_CHARS},
        },
        # Per-role rules (string content for system and user, a tool_call_id answering
        # an open call) are checked by ChatRequest.parse: as if/then schemas they cost
        # more than half of a call's validation time.
    }
    tool = {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": {"type": "string", "pattern": TOOL_NAME_PATTERN},
            "description": {"type": "string", "maxLength": 8192},
            "parameters": {"type": "object"},
            "capability": {"type": "string", "maxLength": 160},
        },
    }
    return {
        "type": "object",
        "required": ["messages"],
        "properties": {
            "messages": {
                "type": "array",
                "minItems": 1,
                "maxItems": cfg.max_messages,
                "items": message,
            },
            "tools": {"type": "array", "maxItems": cfg.max_tools, "items": tool},
            "tool_choice": {
                "anyOf": [
                    {"enum": ["auto", "none", "required"]},
                    {
                        "type": "object",
                        "required": ["name"],
                        "properties": {"name": {"type": "string"}},
                    },
                ]
            },
            "max_tokens": {"type": "integer", "minimum": 1, "maximum": cfg.max_tokens},
            "stream": {"type": "boolean"},
            # the answer also goes to this topic (capabilities/llm_chat/publish.py)
            "publish_to": {"type": "string", "maxLength": 255},
        },
    }


STREAM_SCHEMA: dict[str, Any] = {
    "description": (
        "token {text}; tool_call_delta {id, name, arguments_delta}; "
        "tool_call {id, name, arguments, round, index}; "
        "tool_result {tool_call_id, name, arguments, content, round, index}; "
        "done {tokens_out, stop_reason: end|max_tokens|tool_calls, tool_rounds, ms, ...}"
    ),
    "type": "object",
}


def tool_limits(cfg: LlmSection) -> ToolLimits:
    """The tool loop's limits from the ``[llm]`` section.

    Raises:
        ConfigError: a limit below 1, a non-positive time, or more parallel tool calls
            than a call may have waiting (16).
    """
    if cfg.max_parallel_tools > MAX_PENDING_TOOL_RESULTS:
        raise ConfigError(f"[llm] max_parallel_tools must be at most {MAX_PENDING_TOOL_RESULTS}")
    if min(cfg.timeout_s, cfg.request_timeout_s, cfg.tool_timeout_s) <= 0:
        raise ConfigError("[llm] timeout_s, request_timeout_s and tool_timeout_s must be > 0")
    if min(cfg.max_tokens, cfg.max_messages, cfg.max_concurrent) < 1:
        raise ConfigError("[llm] max_tokens, max_messages and max_concurrent must be >= 1")
    try:
        return ToolLimits(
            max_rounds=cfg.max_rounds,
            tool_timeout_ms=max(1, round(cfg.tool_timeout_s * 1000)),
            max_parallel=cfg.max_parallel_tools,
            max_tools=cfg.max_tools,
            max_calls_per_turn=cfg.max_calls_per_turn,
        )
    except ValueError as exc:
        raise ConfigError(f"[llm] {exc}") from exc


class LlmChat:
    """The ``llm.chat@2.0`` capability over one or more backends."""

    def __init__(self, cfg: LlmSection, backends: dict[str, ChatBackend]) -> None:
        if not backends:
            raise ValueError("llm.chat needs at least one backend")
        self.cfg = cfg
        self.backends = dict(backends)
        self.default_backend = "openai" if "openai" in backends else next(iter(backends))
        self.limits = tool_limits(cfg)
        # set by the node: where publish_to answers go (None: publish_to is refused)
        self.pubsub: TopicPublisher | None = None
        self.descriptor = CapabilityDescriptor(
            name="llm.chat",
            version="2.0",
            request_schema=request_schema(cfg),
            stream_schema=STREAM_SCHEMA,
            stability="beta",
            max_concurrent=cfg.max_concurrent,
            timeout_s=cfg.timeout_s,
            description=(
                "Chat with a language model; tools are run by the caller, inline over "
                f"WebSocket or by re-calling over SSE. Backends: {', '.join(sorted(backends))}."
            ),
        )

    def backend_for(self, params: dict[str, Any]) -> ChatBackend:
        """The backend ``params.backend`` names (default: the model server, else demo).

        Raises:
            BadRequest: an unknown backend, or params the backend refuses.
        """
        name = params.get("backend", self.default_backend)
        backend = self.backends.get(name) if isinstance(name, str) else None
        if backend is None:
            offered = ", ".join(sorted(self.backends))
            raise BadRequest(f"backend {str(name)[:32]!r} is not offered here (offered: {offered})")
        backend.check_params(params)
        return backend

    async def stream(self, ctx: CallContext, value: Any) -> AsyncIterator[Frame]:
        """Run model turns and tool rounds until the model answers (or, over SSE, until
        it asks for tools); with ``publish_to``, the answer goes to that topic too."""
        mirror: AnswerOnTopic | None = None
        if "publish_to" in value:
            topic = value["publish_to"]
            value = {k: v for k, v in value.items() if k != "publish_to"}
            if self.pubsub is None:
                raise BadRequest("publish_to is not available on this node")
            mirror = AnswerOnTopic(self.pubsub, ctx.caller, topic, ctx.request_id)
            mirror.check()
        async with contextlib.aclosing(self._answer(ctx, value)) as frames:
            async for frame in frames:
                if mirror is not None:
                    await mirror.on_frame(frame)
                yield frame

    async def _answer(self, ctx: CallContext, value: Any) -> AsyncGenerator[Frame, None]:
        started = time.monotonic()
        backend = self.backend_for(ctx.params)
        if "max_tokens" not in value:
            value = {**value, "max_tokens": self.cfg.max_tokens}
        loop = ToolLoop(ChatRequest.parse(value, self.limits), self.limits, inline=ctx.inline_tools)
        timeout_s = self.limits.tool_timeout_ms / 1000
        waits: dict[str, asyncio.Task[Any]] = {}

        def expect(frames: list[Frame]) -> None:
            # Registered before the frame is sent: the answer may come back at once.
            for frame in frames:
                if frame.event == "tool_call" and loop.inline:
                    ctx.expect_tool_result(frame.data["id"])

        def watch(frames: list[Frame]) -> None:
            # The timeout of each call starts once its frame is on its way (spec §5).
            for frame in frames:
                if frame.event == "tool_call" and loop.inline:
                    call_id = frame.data["id"]
                    waits[call_id] = asyncio.get_running_loop().create_task(
                        ctx.tool_result(call_id, timeout_s), name=f"tool-result-{call_id}"
                    )

        try:
            while loop.ready:
                plan = loop.next_turn()
                frames: list[Frame] = []
                async with contextlib.aclosing(backend.turn(plan, ctx.params)) as events:
                    async for event in events:
                        frames = loop.feed(event)
                        expect(frames)
                        for frame in frames:
                            yield frame
                        watch(frames)
                if loop.generating:  # the backend ended without TurnEnd
                    frames = loop.feed(TurnEnd())
                    expect(frames)
                    for frame in frames:
                        yield frame
                    watch(frames)
                while loop.awaiting_tools:
                    await asyncio.wait(waits.values(), return_when=asyncio.FIRST_COMPLETED)
                    for call_id, task in list(waits.items()):
                        if not task.done():
                            continue
                        del waits[call_id]
                        try:
                            frames = loop.on_result(call_id, task.result())
                        except DeadlineExceeded:
                            frames = loop.on_timeout(call_id)
                        expect(frames)
                        for frame in frames:
                            yield frame
                        watch(frames)
            yield loop.done_frame(int((time.monotonic() - started) * 1000))
        finally:
            # The tasks only wait on futures of this call; cancelling them is the cleanup.
            for task in waits.values():
                task.cancel()

    async def aclose(self) -> None:
        """Close every backend (node shutdown)."""
        for backend in self.backends.values():
            await backend.aclose()
