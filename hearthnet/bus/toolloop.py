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
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import orjson

from hearthnet.bus.chatrequest import (
    ChatRequest,
    ToolLimits,
    ToolSpec,
    tool_error,
    tool_timeout_content,
)
from hearthnet.errors import BadRequest
from hearthnet.frames import Frame

_CALL_ID_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}\Z")
MAX_NAME_CHARS = 64
MAX_DROPPED_TRACKED = 1024
# Told to the model, as a last system message, when the round limit is reached (spec §5).
LIMIT_NOTE = (
    "The tool-call limit for this answer has been reached. Do not call any more tools: "
    "answer the user now with the information you already have."
)


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
                call.content = call.error
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
        call.content = content
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
