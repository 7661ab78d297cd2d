"""The ``llm.chat@2.0`` tool-call loop (spec §5) on the node, as a pure state machine.

The capability glue feeds it what the model backend streams (:class:`TextDelta`,
:class:`ToolCallDelta`, :class:`TurnEnd`) and the tool results the caller sends back;
it answers with the frames to send (spec §3.4) and decides what the model sees next
(:class:`TurnPlan`). It owns the limits of spec §5: tool rounds, calls in parallel,
tools per call, argument validation. Timers and sockets live in the glue: a tool
result that does not come in time is reported with :meth:`ToolLoop.on_timeout`.

States::

    READY --next_turn--> GENERATING --text only--------------------------> FINISHED
      ^                      |  \\--tool calls, not inline (SSE)---------> HANDED_BACK
      |                      |--tool calls, inline (WS)--> AWAITING_TOOLS
      |                      |                                  |
      +--every call answered by the node (invalid arguments)----+-- all results in

Frames (numbered later by the transport):

- ``token {text}``
- ``tool_call_delta {id, name, arguments_delta}`` while the model writes a call;
- ``tool_call {id, name, arguments, round, index}``: the caller runs this tool;
- ``tool_result {tool_call_id, name, arguments, content, round, index}``: the node gave
  the model this result itself (invalid arguments, unknown tool, no result in time);
  the caller does not run the call and records the result as is.

The conversation is a list of messages ``{"role": "system"|"user", "content": str}``,
``{"role": "assistant", "content": str, "tool_calls"?: [{"id", "name", "arguments"}]}``
and ``{"role": "tool", "tool_call_id", "content": <JSON>}``.
"""

from __future__ import annotations

import enum
import functools
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import orjson
from jsonschema import Draft202012Validator

from hearthnet.errors import BadRequest, SchemaMismatch
from hearthnet.frames import Frame

TOOL_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"
_TOOL_NAME_RE = re.compile(TOOL_NAME_PATTERN)
_CALL_ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
TOOL_CHOICES = ("auto", "none", "required")
MAX_NAME_CHARS = 64
MAX_DROPPED_TRACKED = 1024
VALIDATOR_CACHE_SIZE = 256
# Told to the model, as a last system message, when the round limit is reached (spec §5).
LIMIT_NOTE = (
    "The tool-call limit for this answer has been reached. Do not call any more tools: "
    "answer the user now with the information you already have."
)
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


class LoopState(enum.Enum):
    """Where one ``llm.chat`` call is in its tool loop."""

    READY = "ready"
    GENERATING = "generating"
    AWAITING_TOOLS = "awaiting_tools"
    HANDED_BACK = "handed_back"
    FINISHED = "finished"


_TRANSITIONS: dict[LoopState, frozenset[LoopState]] = {
    LoopState.READY: frozenset({LoopState.GENERATING}),
    LoopState.GENERATING: frozenset(
        {LoopState.FINISHED, LoopState.HANDED_BACK, LoopState.AWAITING_TOOLS, LoopState.READY}
    ),
    LoopState.AWAITING_TOOLS: frozenset({LoopState.READY}),
    LoopState.HANDED_BACK: frozenset(),
    LoopState.FINISHED: frozenset(),
}


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


# --- what the backend streams ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextDelta:
    """A piece of the assistant's text."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A piece of a tool call, keyed by its position in the turn (OpenAI's ``index``)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """The model's turn is over: ``stop``, ``tool_calls`` or ``length``."""

    finish_reason: str = "stop"
    tokens_out: int | None = None


BackendEvent = TextDelta | ToolCallDelta | TurnEnd


# --- the request ----------------------------------------------------------------------


@functools.lru_cache(maxsize=VALIDATOR_CACHE_SIZE)
def _compiled(schema_json: bytes) -> Any:
    """A checked, compiled validator for a tool's parameters. Checking a schema against
    the meta-schema costs about a millisecond, and an SSE caller sends the same tools on
    every re-call, so validators are cached by the schema's canonical JSON (bounded)."""
    schema = orjson.loads(schema_json)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


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
        if not isinstance(name, str) or not _TOOL_NAME_RE.match(name):
            raise SchemaMismatch(f"tool name {str(name)[:64]!r} must match {TOOL_NAME_PATTERN}")
        description = obj.get("description", "")
        parameters = obj.get("parameters", EMPTY_PARAMETERS)
        if not isinstance(description, str) or not isinstance(parameters, dict):
            raise SchemaMismatch(f"tool {name}: description is a string, parameters an object")
        try:
            validator = _compiled(orjson.dumps(parameters, option=orjson.OPT_SORT_KEYS))
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
        return f"arguments at {where}: {error.message}"


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


@dataclass(frozen=True, slots=True)
class TurnPlan:
    """What to ask the model for its next turn."""

    messages: tuple[dict[str, Any], ...]
    tools: tuple[ToolSpec, ...]
    tool_choice: str | dict[str, Any]
    max_tokens: int | None
    round: int
    tools_allowed: bool


# --- the loop -------------------------------------------------------------------------


@dataclass(slots=True)
class _Call:
    position: int  # in the assistant message's tool_calls (the backend's index may skip)
    id: str
    name: str = ""
    raw: list[str] = field(default_factory=list)
    raw_bytes: int = 0
    oversize: bool = False
    arguments: Any = None
    error: dict[str, Any] | None = None
    content: Any = None
    answered: bool = False

    @property
    def raw_text(self) -> str:
        return "".join(self.raw)

    def as_message_part(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}


class ToolLoop:
    """One ``llm.chat`` call's tool loop. Not thread-safe; one per call."""

    def __init__(self, request: ChatRequest, limits: ToolLimits, *, inline: bool) -> None:
        self.request = request
        self.limits = limits
        self.inline = inline
        self.state = LoopState.READY
        self.messages: list[dict[str, Any]] = list(request.messages)
        self.rounds = request.rounds_done
        self.tokens_out = 0
        self.tool_calls_dropped = 0
        self.limit_reached = False
        self.stop_reason: str | None = None
        self._used_ids = set(request.used_ids)
        self._plan: TurnPlan | None = None
        self._text: list[str] = []
        self._turn_tokens = 0
        self._calls: dict[int, _Call] = {}
        self._order: list[_Call] = []
        self._dropped: set[int] = set()
        self._queue: deque[_Call] = deque()
        self._outstanding: dict[str, _Call] = {}

    @property
    def ready(self) -> bool:
        """A model turn may start (the first, or the next after tool results)."""
        return self.state is LoopState.READY

    @property
    def generating(self) -> bool:
        """A model turn is streaming."""
        return self.state is LoopState.GENERATING

    @property
    def awaiting_tools(self) -> bool:
        """Tool calls are out with the caller (inline only)."""
        return self.state is LoopState.AWAITING_TOOLS

    def _to(self, state: LoopState) -> None:
        if state not in _TRANSITIONS[self.state]:
            raise RuntimeError(f"illegal tool-loop transition {self.state.value} -> {state.value}")
        self.state = state

    # --- a model turn -----------------------------------------------------------

    def next_turn(self) -> TurnPlan:
        """Start the next model turn; returns what to send to the model.

        After ``max_rounds`` tool rounds the model gets no tool choice and a system note
        telling it to answer (spec §5). A ``required`` or named ``tool_choice`` applies to
        the first turn after the user's message only; later turns use ``auto``, so a
        forced tool cannot loop until the limit.
        """
        self._to(LoopState.GENERATING)
        req = self.request
        messages = tuple(self.messages)
        choice: str | dict[str, Any] = req.tool_choice if self.rounds == 0 else "auto"
        if req.tool_choice == "none":
            choice = "none"
        if req.tools and self.rounds >= self.limits.max_rounds:
            self.limit_reached = True
            choice = "none"
            messages = (*messages, {"role": "system", "content": LIMIT_NOTE})
        self._plan = TurnPlan(
            messages=messages,
            tools=req.tools,
            tool_choice=choice,
            max_tokens=req.max_tokens,
            round=self.rounds + 1,
            tools_allowed=bool(req.tools) and choice != "none",
        )
        self._text, self._turn_tokens = [], 0
        self._calls, self._order, self._dropped = {}, [], set()
        return self._plan

    def feed(self, event: BackendEvent) -> list[Frame]:
        """Apply one backend event; returns the frames to send, in order."""
        if self.state is not LoopState.GENERATING:
            raise RuntimeError(f"backend event while {self.state.value}")
        if isinstance(event, TextDelta):
            if not event.text:
                return []
            self._text.append(event.text)
            self._turn_tokens += 1
            return [Frame("token", {"text": event.text})]
        if isinstance(event, ToolCallDelta):
            return self._on_call_delta(event)
        return self._end_turn(event)

    def _on_call_delta(self, delta: ToolCallDelta) -> list[Frame]:
        assert self._plan is not None
        call = self._calls.get(delta.index)
        first = call is None
        if call is None:
            if not self._plan.tools_allowed or len(self._calls) >= self.limits.max_calls_per_turn:
                # Calls past the limit, or made when the model was told not to call tools,
                # are dropped whole (bounded memory) and counted in `done`.
                if delta.index not in self._dropped and len(self._dropped) < MAX_DROPPED_TRACKED:
                    self._dropped.add(delta.index)
                    self.tool_calls_dropped += 1
                return []
            position = len(self._order)
            call = _Call(position, self._call_id(delta.id, position + 1))
            self._calls[delta.index] = call
            self._order.append(call)
        if delta.name:
            call.name = (call.name + delta.name)[:MAX_NAME_CHARS]
        if delta.arguments and not call.oversize:
            call.raw_bytes += len(delta.arguments.encode())
            if call.raw_bytes > self.limits.max_argument_bytes:
                call.oversize = True
                call.raw = []
            else:
                call.raw.append(delta.arguments)
        if not (first or delta.arguments):
            return []
        return [
            Frame(
                "tool_call_delta",
                {"id": call.id, "name": call.name, "arguments_delta": delta.arguments},
            )
        ]

    def _call_id(self, offered: str | None, position: int) -> str:
        """The backend's id when it is sane and unused in this turn; else ``tc_<round>_<n>``."""
        if offered and _CALL_ID_RE.match(offered) and offered not in self._used_ids:
            chosen = offered
        else:
            assert self._plan is not None
            chosen = f"tc_{self._plan.round}_{position}"
            while chosen in self._used_ids:
                chosen += "_"
        self._used_ids.add(chosen)
        return chosen

    def _end_turn(self, end: TurnEnd) -> list[Frame]:
        assert self._plan is not None
        self.tokens_out += end.tokens_out if end.tokens_out is not None else self._turn_tokens
        text = "".join(self._text)
        calls = self._order
        if not calls:
            self.messages.append({"role": "assistant", "content": text})
            self.stop_reason = "max_tokens" if end.finish_reason == "length" else "end"
            self._to(LoopState.FINISHED)
            return []
        self.rounds += 1
        for call in calls:
            self._validate(call)
        self.messages.append(
            {
                "role": "assistant",
                "content": text,
                "tool_calls": [c.as_message_part() for c in calls],
            }
        )
        frames: list[Frame] = []
        runnable = [c for c in calls if c.error is None]
        for call in calls:
            if call.error is not None:
                call.content, call.answered = call.error, True
                frames.append(self._result_frame(call))
            elif not self.inline:
                frames.append(self._call_frame(call))
        if not runnable:
            self._append_results()
            self._to(LoopState.READY)  # nothing for the caller to run: the model goes on
        elif not self.inline:
            self.stop_reason = "tool_calls"
            self._to(LoopState.HANDED_BACK)
        else:
            self._queue = deque(runnable)
            self._to(LoopState.AWAITING_TOOLS)
            frames.extend(self._dispatch())
        return frames

    def _validate(self, call: _Call) -> None:
        tool = self.request.tool(call.name)
        raw = call.raw_text
        if call.oversize:
            call.arguments = ""
            call.error = tool_error(
                "invalid_arguments",
                f"arguments over {self.limits.max_argument_bytes} bytes",
            )
            return
        try:
            parsed = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError as exc:
            call.arguments = raw
            call.error = tool_error("invalid_arguments", f"arguments are not JSON: {exc}")
            return
        call.arguments = parsed if isinstance(parsed, dict) else raw
        if tool is None:
            known = ", ".join(t.name for t in self.request.tools) or "none"
            call.error = tool_error("unknown_tool", f"no tool named {call.name!r}; tools: {known}")
        elif not isinstance(parsed, dict):
            call.error = tool_error("invalid_arguments", "arguments must be a JSON object")
        else:
            problem = tool.check_arguments(parsed)
            if problem is not None:
                call.error = tool_error("invalid_arguments", problem)

    def _call_frame(self, call: _Call) -> Frame:
        assert self._plan is not None
        return Frame(
            "tool_call",
            {
                "id": call.id,
                "name": call.name,
                "arguments": call.arguments,
                "round": self._plan.round,
                "index": call.position,
            },
        )

    def _result_frame(self, call: _Call) -> Frame:
        assert self._plan is not None
        return Frame(
            "tool_result",
            {
                "tool_call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
                "content": call.content,
                "round": self._plan.round,
                "index": call.position,
            },
        )

    # --- waiting for tool results (inline) -------------------------------------------

    def _dispatch(self) -> list[Frame]:
        """Send queued calls while fewer than ``max_parallel`` are outstanding."""
        frames = []
        while self._queue and len(self._outstanding) < self.limits.max_parallel:
            call = self._queue.popleft()
            self._outstanding[call.id] = call
            frames.append(self._call_frame(call))
        return frames

    @property
    def outstanding(self) -> frozenset[str]:
        """Ids of tool calls sent to the caller and not yet answered."""
        return frozenset(self._outstanding)

    def on_result(self, tool_call_id: str, body: Any) -> list[Frame]:
        """The caller's result for an outstanding call; returns further frames to send.

        Raises:
            BadRequest: no outstanding call has that id.
        """
        return self._answer(tool_call_id, body, by_node=False)

    def on_timeout(self, tool_call_id: str) -> list[Frame]:
        """An outstanding call got no result in time: the model is told so (spec §5)."""
        call = self._outstanding.get(tool_call_id)
        name = call.name if call is not None else "?"
        return self._answer(
            tool_call_id, tool_timeout_content(name, self.limits.tool_timeout_ms), by_node=True
        )

    def _answer(self, tool_call_id: str, content: Any, *, by_node: bool) -> list[Frame]:
        if self.state is not LoopState.AWAITING_TOOLS:
            raise BadRequest(f"no tool call is waiting (loop is {self.state.value})")
        call = self._outstanding.pop(tool_call_id, None)
        if call is None:
            raise BadRequest(f"tool_call_id {tool_call_id[:64]!r} is not waiting for a result")
        call.content, call.answered = content, True
        frames = [self._result_frame(call)] if by_node else []
        frames.extend(self._dispatch())
        if not self._outstanding and not self._queue:
            self._append_results()
            self._to(LoopState.READY)
        return frames

    def _append_results(self) -> None:
        # Tool messages follow the calls' order in the assistant message, whatever order
        # the results came in, so WS and SSE build the same conversation.
        for call in self._order:
            self.messages.append({"role": "tool", "tool_call_id": call.id, "content": call.content})

    # --- the end ------------------------------------------------------------------

    def done_frame(self, elapsed_ms: int) -> Frame:
        """The terminal ``done`` frame once the loop finished or handed the calls back."""
        if self.state not in (LoopState.FINISHED, LoopState.HANDED_BACK):
            raise RuntimeError(f"no done frame while {self.state.value}")
        data: dict[str, Any] = {
            "tokens_out": self.tokens_out,
            "stop_reason": self.stop_reason,
            "tool_rounds": self.rounds,
            "ms": elapsed_ms,
        }
        if self.state is LoopState.HANDED_BACK:
            # What the caller needs to run the calls the way the node would have (spec §5).
            data["tool_timeout_ms"] = self.limits.tool_timeout_ms
            data["max_parallel_tools"] = self.limits.max_parallel
        if self.limit_reached:
            data["tool_limit_reached"] = True
        if self.tool_calls_dropped:
            data["tool_calls_dropped"] = self.tool_calls_dropped
        return Frame("done", data)
