"""The ``llm.chat@2.0`` input (spec §5), checked beyond its JSON Schema, and the limits of
the tool loop. Pure.

:class:`ChatRequest` is what the node's :class:`~hearthnet.bus.toolloop.ToolLoop` runs on:
tools with compiled argument validators, the tool choice, and the history's tool calls
(each answered exactly once; rounds since the last user message counted, so an SSE
caller re-calling with results appended is held to the same limits).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import jsonschema

from hearthnet.bus.descriptor import compiled_validator, schema_error_text
from hearthnet.errors import SchemaMismatch

TOOL_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"
_TOOL_NAME_RE = re.compile(TOOL_NAME_PATTERN)
TOOL_CHOICES = ("auto", "none", "required")
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True, slots=True)
class ToolLimits:
    """The bounds of one conversation turn (spec §5; ``[llm]`` in the configuration)."""

    max_rounds: int = 6
    tool_timeout_ms: int = 30_000
    max_parallel: int = 4
    max_tools: int = 16
    max_calls_per_turn: int = 16
    max_argument_bytes: int = 64 * 1024

    def __post_init__(self) -> None:
        if min(self.max_rounds, self.max_parallel, self.max_tools, self.max_calls_per_turn) < 1:
            raise ValueError("tool limits must be at least 1")
        if self.tool_timeout_ms < 1 or self.max_argument_bytes < 2:
            raise ValueError("tool_timeout_ms and max_argument_bytes must be positive")


def tool_error(code: str, message: str) -> dict[str, Any]:
    """The content of a tool message that reports a failure instead of a result."""
    return {"error": code, "message": message[:1000]}


def tool_timeout_content(name: str, timeout_ms: int) -> dict[str, Any]:
    """What the model is told when a tool's result did not come in time.

    The node uses it over WebSocket, the client library over SSE (where it runs the
    timer itself), so both transports give the model the same words.
    """
    return tool_error("timeout", f"no result from tool {name} within {timeout_ms / 1000:g} s")


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the model may call; the node validates arguments against ``parameters``."""

    name: str
    description: str
    parameters: dict[str, Any]
    validator: Any = field(compare=False, repr=False)

    @classmethod
    def parse(cls, obj: Any) -> ToolSpec:
        """Check a tool definition ``{"name", "description"?, "parameters"?}``.

        Raises:
            SchemaMismatch: a bad name or a ``parameters`` that is not a JSON Schema.
        """
        if not isinstance(obj, dict):
            raise SchemaMismatch("a tool is an object")
        name = obj.get("name")
        if not isinstance(name, str) or not _TOOL_NAME_RE.fullmatch(name):
            raise SchemaMismatch(f"tool name {str(name)[:64]!r} must match {TOOL_NAME_PATTERN}")
        description = obj.get("description", "")
        parameters = obj.get("parameters", EMPTY_PARAMETERS)
        if not isinstance(description, str) or not isinstance(parameters, dict):
            raise SchemaMismatch(f"tool {name}: description is a string, parameters an object")
        try:
            validator = compiled_validator(parameters)
        except jsonschema.SchemaError as exc:
            raise SchemaMismatch(
                f"tool {name}: parameters is not a JSON Schema: {exc.message}"
            ) from exc
        return cls(name, description, parameters, validator)

    def to_json(self) -> dict[str, Any]:
        """The tool as the model sees it."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def check_arguments(self, arguments: Any) -> str | None:
        """None when ``arguments`` fit ``parameters``; else what is wrong, for the model."""
        error = jsonschema.exceptions.best_match(self.validator.iter_errors(arguments))
        if error is None:
            return None
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        return f"arguments at {where}: {schema_error_text(error)}"


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """An ``llm.chat@2.0`` input, checked beyond its JSON Schema.

    Attributes:
        rounds_done: tool rounds already in the history since the last user message
            (an SSE caller re-calling with results appended); they count towards the limit.
        used_ids: tool-call ids already used since the last user message.
    """

    messages: tuple[dict[str, Any], ...]
    tools: tuple[ToolSpec, ...]
    tool_choice: str | dict[str, Any]
    max_tokens: int | None
    rounds_done: int
    used_ids: frozenset[str]

    @classmethod
    def parse(cls, value: Any, limits: ToolLimits) -> ChatRequest:
        """Check tools, tool choice and the history's tool calls and results.

        Raises:
            SchemaMismatch: duplicate tool names, too many tools, a ``tool_choice`` naming
                an unknown tool, a tool message answering no call, or an assistant tool
                call left without a result.
        """
        if not isinstance(value, dict) or not isinstance(value.get("messages"), list):
            raise SchemaMismatch("input needs a messages array")
        raw_tools = value.get("tools") or []
        if not isinstance(raw_tools, list) or len(raw_tools) > limits.max_tools:
            raise SchemaMismatch(f"at most {limits.max_tools} tools per call")
        tools = tuple(ToolSpec.parse(t) for t in raw_tools)
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise SchemaMismatch("tool names must be unique")
        choice = value.get("tool_choice", "auto")
        if isinstance(choice, dict):
            if choice.get("name") not in names:
                raise SchemaMismatch(f"tool_choice names no tool of this call: {choice!r:.80}")
        elif choice not in TOOL_CHOICES:
            raise SchemaMismatch(f"tool_choice must be one of {TOOL_CHOICES} or {{name}}")
        max_tokens = value.get("max_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise SchemaMismatch("max_tokens must be a positive integer")
        messages = tuple(value["messages"])
        rounds, used = _check_history(messages)
        return cls(messages, tools, choice, max_tokens, rounds, frozenset(used))

    def tool(self, name: str) -> ToolSpec | None:
        """The tool called ``name``, if this call offers it."""
        return next((t for t in self.tools if t.name == name), None)


def _check_history(messages: tuple[dict[str, Any], ...]) -> tuple[int, set[str]]:
    """Rounds and call ids since the last user message; every call answered exactly once."""
    if not messages:
        raise SchemaMismatch("messages must not be empty")
    rounds = 0
    used: set[str] = set()
    open_calls: set[str] = set()
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise SchemaMismatch(f"messages/{i} is not an object")
        role = msg.get("role")
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if "content" not in msg:
                raise SchemaMismatch(f"messages/{i}: a tool message has content")
            if call_id not in open_calls:
                raise SchemaMismatch(
                    f"messages/{i}: tool_call_id {str(call_id)[:64]!r} answers no open tool call"
                )
            open_calls.discard(call_id)
            continue
        if open_calls:
            raise SchemaMismatch(f"messages/{i}: tool calls {sorted(open_calls)} have no result")
        content = msg.get("content")
        if role in ("system", "user") and not isinstance(content, str):
            raise SchemaMismatch(f"messages/{i}: a {role} message has string content")
        if role == "assistant" and not (content is None or isinstance(content, str)):
            raise SchemaMismatch(f"messages/{i}: assistant content is a string or null")
        if role == "user":
            rounds, used = 0, set()
        elif role == "assistant" and msg.get("tool_calls"):
            ids = [c.get("id") if isinstance(c, dict) else None for c in msg["tool_calls"]]
            if not all(isinstance(c, str) for c in ids) or len(set(ids)) != len(ids):
                raise SchemaMismatch(f"messages/{i}: tool call ids must be unique strings")
            open_calls = {str(c) for c in ids}
            used |= open_calls
            rounds += 1
        elif role not in ("system", "assistant"):
            raise SchemaMismatch(f"messages/{i}: unknown role {str(role)[:32]!r}")
    if open_calls:
        raise SchemaMismatch(f"the last tool calls {sorted(open_calls)} have no result")
    return rounds, used
