"""The deterministic demo model (``--llm-demo``): tool loops with no model installed.

Without a script it behaves like a tiny, predictable assistant:

- when the conversation ends with tool results, it answers with them
  (``Here is what I found: time returned {...}.``);
- when the user's last message names a tool (a word of the tool's name, split on
  ``.``, ``_`` and ``-``, e.g. "what **time** is it?" for a tool ``time``), it says so and
  calls that tool, filling string parameters with the rest of the message after that
  word and numbers with the first number in it;
- otherwise it repeats what it was told and lists the tools it could call.

With a **script** (call ``params.script``, or the file ``[llm] demo_script``) it plays
turns: turn *k* is the model's *k*-th turn since the last user message (the last turn
repeats). A script is a JSON array of turns::

    [{"text": "I'll look that up.",
      "tool_calls": [{"name": "lookup", "arguments": {"q": "water"}}],
      "token_delay_ms": 0},
     {"text": "Boil it for one minute. Results: {results}"}]

``text`` is streamed word by word; ``{results}`` becomes the JSON list of the tool
results the model was just given. ``arguments`` is an object, or a string sent as is
(to show what happens with arguments that are not JSON). ``finish: "length"`` ends the
turn as if out of tokens. ``token_delay_ms`` paces the turn (cancel demos). When the
node says no more tools (round limit, ``tool_choice: "none"``), a turn with tool calls
is replaced by an answer from the results so far.

Everything here is pure except :meth:`DemoBackend.turn`, which paces the stream.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import orjson
from jsonschema import Draft202012Validator

from hearthnet.bus.toolloop import BackendEvent, TextDelta, ToolCallDelta, TurnEnd, TurnPlan
from hearthnet.errors import BadRequest, ConfigError

ARGUMENT_CHUNK = 8
_WORD_RE = re.compile(r"[a-z0-9]+")
_TOKEN_RE = re.compile(r"\S+\s*|\s+")
_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")

SCRIPT_SCHEMA: dict[str, Any] = {
    "type": "array",
    "minItems": 1,
    "maxItems": 64,
    "items": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "text": {"type": "string", "maxLength": 65536},
            "tool_calls": {
                "type": "array",
                "maxItems": 64,
                "items": {
                    "type": "object",
                    "required": ["name"],
                    "additionalProperties": False,
                    "properties": {
                        "name": {"type": "string", "maxLength": 128},
                        "arguments": {"type": ["object", "string"]},
                        "id": {"type": "string", "maxLength": 128},
                    },
                },
            },
            "token_delay_ms": {"type": "integer", "minimum": 0, "maximum": 60_000},
            "finish": {"enum": ["stop", "length"]},
        },
    },
}
_SCRIPT_VALIDATOR = Draft202012Validator(SCRIPT_SCHEMA)


@dataclass(frozen=True, slots=True)
class DemoToolCall:
    """A tool call the demo model makes."""

    name: str
    arguments: dict[str, Any] | str
    id: str | None = None


@dataclass(frozen=True, slots=True)
class DemoTurn:
    """One turn of the demo model."""

    text: str = ""
    tool_calls: tuple[DemoToolCall, ...] = ()
    token_delay_ms: int = 0
    finish: str = "stop"


@dataclass(frozen=True, slots=True)
class DemoScript:
    """A checked script: the turns to play."""

    turns: tuple[DemoTurn, ...] = field(default_factory=tuple)

    @classmethod
    def parse(cls, obj: Any) -> DemoScript:
        """Check a script (see the module docstring).

        Raises:
            BadRequest: it does not fit the script schema.
        """
        error = jsonschema.exceptions.best_match(_SCRIPT_VALIDATOR.iter_errors(obj))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "(root)"
            raise BadRequest(f"demo script at {where}: {error.message}"[:500])
        turns = tuple(
            DemoTurn(
                text=t.get("text", ""),
                tool_calls=tuple(
                    DemoToolCall(c["name"], c.get("arguments", {}), c.get("id"))
                    for c in t.get("tool_calls", [])
                ),
                token_delay_ms=t.get("token_delay_ms", 0),
                finish=t.get("finish", "stop"),
            )
            for t in obj
        )
        return cls(turns)

    @classmethod
    def load(cls, path: Path) -> DemoScript:
        """Read a script file.

        Raises:
            ConfigError: unreadable, not JSON, or not a script.
        """
        try:
            return cls.parse(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"[llm] demo_script {path}: {exc}") from exc
        except BadRequest as exc:
            raise ConfigError(f"[llm] demo_script {path}: {exc.message}") from exc


# --- the model's decisions (pure) ------------------------------------------------------


def _since_last_user(messages: tuple[dict[str, Any], ...]) -> list[dict[str, Any]]:
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "user":
            return list(messages[i + 1 :])
    return list(messages)


def _last_user_text(messages: tuple[dict[str, Any], ...]) -> str:
    for msg in reversed(messages):
        if msg.get("role") == "user":
            content = msg.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def _latest_results(messages: tuple[dict[str, Any], ...]) -> list[tuple[str, Any]]:
    """(tool name, content) of the tool messages after the last assistant tool calls."""
    names: dict[str, str] = {}
    results: list[tuple[str, Any]] = []
    for msg in messages:
        if msg.get("role") == "assistant" and msg.get("tool_calls"):
            names = {c["id"]: c["name"] for c in msg["tool_calls"]}
            results = []
        elif msg.get("role") == "tool":
            results.append((names.get(msg.get("tool_call_id", ""), "tool"), msg.get("content")))
        elif msg.get("role") == "user":
            names, results = {}, []
    conversation = [m for m in messages if m.get("role") != "system"]
    if not conversation or conversation[-1].get("role") != "tool":
        return []
    return results


def _compact(value: Any) -> str:
    return orjson.dumps(value).decode() if not isinstance(value, str) else value


def answer_from_results(results: list[tuple[str, Any]]) -> str:
    """The demo model's answer once it has tool results."""
    if not results:
        return "I have no tool results to go on, so that is all I can say."
    parts = []
    for name, content in results:
        if isinstance(content, dict) and "error" in content:
            parts.append(f"{name} failed ({content.get('message', content['error'])})")
        else:
            parts.append(f"{name} returned {_compact(content)}")
    return "Here is what I found: " + "; ".join(parts) + "."


def _pick_tool(plan: TurnPlan, text: str) -> tuple[str, str] | None:
    """(tool name, the word that named it) for the user's text, or None."""
    if isinstance(plan.tool_choice, dict):
        return str(plan.tool_choice["name"]), ""
    words = _WORD_RE.findall(text.lower())
    for tool in plan.tools:
        parts = [p for p in re.split(r"[._-]", tool.name.lower()) if len(p) >= 3]
        for word in words:
            if word in parts:
                return tool.name, word
    if plan.tool_choice == "required" and plan.tools:
        return plan.tools[0].name, ""
    return None


def guess_arguments(parameters: dict[str, Any], text: str, word: str) -> dict[str, Any]:
    """Arguments for a tool from the user's words: strings get the rest of the message
    after the word that named the tool, numbers the first number in it."""
    rest = text
    if word:
        match = re.search(re.escape(word), text, re.IGNORECASE)
        if match and text[match.end() :].strip(" \t\n?!.,:;"):
            rest = text[match.end() :]
    rest = rest.strip(" \t\n?!.,:;") or text
    number = _NUMBER_RE.search(text)
    arguments: dict[str, Any] = {}
    properties = parameters.get("properties", {})
    if not isinstance(properties, dict):
        return arguments
    for name, schema in properties.items():
        if not isinstance(schema, dict):
            continue
        kind = schema.get("type")
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            arguments[name] = schema["enum"][0]
        elif kind == "string":
            arguments[name] = rest
        elif kind == "integer":
            arguments[name] = int(float(number.group())) if number else 0
        elif kind == "number":
            arguments[name] = float(number.group()) if number else 0.0
        elif kind == "boolean":
            arguments[name] = True
    return arguments


def demo_turn(plan: TurnPlan, script: DemoScript | None) -> DemoTurn:
    """What the demo model says next, given the conversation and the tools."""
    results = _latest_results(plan.messages)
    if script is not None and script.turns:
        model_turns = [m for m in _since_last_user(plan.messages) if m.get("role") == "assistant"]
        turn = script.turns[min(len(model_turns), len(script.turns) - 1)]
        if turn.tool_calls and not plan.tools_allowed:
            return DemoTurn(text=answer_from_results(results))
        if "{results}" in turn.text:
            contents = [content for _, content in results]
            turn = DemoTurn(
                turn.text.replace("{results}", _compact(contents)),
                turn.tool_calls,
                turn.token_delay_ms,
                turn.finish,
            )
        return turn
    if results:
        return DemoTurn(text=answer_from_results(results))
    text = _last_user_text(plan.messages)
    picked = _pick_tool(plan, text) if plan.tools_allowed else None
    if picked is not None:
        name, word = picked
        tool = next(t for t in plan.tools if t.name == name)
        return DemoTurn(
            text=f"Let me ask the {name} tool. ",
            tool_calls=(DemoToolCall(name, guess_arguments(tool.parameters, text, word)),),
        )
    tools = ", ".join(t.name for t in plan.tools)
    offer = f" Name one of my tools ({tools}) and I will call it." if tools else ""
    return DemoTurn(text=f"You said: {text.strip()}. I am the demo model.{offer}")


def split_tokens(text: str) -> list[str]:
    """The demo model's tokens: words with their trailing space."""
    return _TOKEN_RE.findall(text)


def turn_events(plan: TurnPlan, turn: DemoTurn) -> list[BackendEvent]:
    """The backend events of one demo turn (what :meth:`DemoBackend.turn` streams)."""
    events: list[BackendEvent] = []
    tokens = split_tokens(turn.text)
    finish = turn.finish
    if plan.max_tokens is not None and len(tokens) > plan.max_tokens:
        tokens, finish = tokens[: plan.max_tokens], "length"
    events.extend(TextDelta(t) for t in tokens)
    if finish == "length":
        events.append(TurnEnd("length"))
        return events
    earlier = sum(len(m.get("tool_calls") or []) for m in plan.messages)
    for i, call in enumerate(turn.tool_calls):
        raw = call.arguments if isinstance(call.arguments, str) else _compact(call.arguments)
        events.append(ToolCallDelta(i, call.id or f"tc_{earlier + i + 1}", call.name, ""))
        events.extend(
            ToolCallDelta(i, arguments=raw[k : k + ARGUMENT_CHUNK])
            for k in range(0, len(raw), ARGUMENT_CHUNK)
        )
    events.append(TurnEnd("tool_calls" if turn.tool_calls else "stop"))
    return events


# --- the backend ---------------------------------------------------------------------


@functools.lru_cache(maxsize=64)
def _parsed_script(script_json: bytes) -> DemoScript:
    # A script comes with every call and is needed on every turn; checking it costs
    # more than the turn itself, and a parsed script is immutable.
    return DemoScript.parse(orjson.loads(script_json))


class DemoBackend:
    """The demo model as a backend. ``script``: the node's default script, if any."""

    name = "demo"

    def __init__(self, script: DemoScript | None = None) -> None:
        self.script = script

    def _script(self, params: dict[str, Any]) -> DemoScript | None:
        if "script" in params:
            return _parsed_script(orjson.dumps(params["script"], option=orjson.OPT_SORT_KEYS))
        return self.script

    def check_params(self, params: dict[str, Any]) -> None:
        """A ``script`` in the call's params must be a valid script."""
        self._script(params)

    async def turn(
        self, plan: TurnPlan, params: dict[str, Any]
    ) -> AsyncGenerator[BackendEvent, None]:
        """Stream the turn, pausing ``token_delay_ms`` between events when scripted to."""
        turn = demo_turn(plan, self._script(params))
        delay = turn.token_delay_ms / 1000
        for event in turn_events(plan, turn):
            if delay and not isinstance(event, TurnEnd):
                await asyncio.sleep(delay)
            yield event

    async def aclose(self) -> None:
        """Nothing to release."""
