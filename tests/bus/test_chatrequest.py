"""The llm.chat input checked beyond its JSON Schema (spec §5): pure."""

from __future__ import annotations

from typing import Any

import pytest

from hearthnet.bus.chatrequest import ChatRequest, ToolLimits, ToolSpec
from hearthnet.errors import SchemaMismatch

LOOKUP: dict[str, Any] = {
    "name": "lookup",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}
CLOCK = {"name": "clock", "parameters": {"type": "object", "properties": {}}}
USER = {"role": "user", "content": "how do I make water safe?"}


def test_tools_with_equal_schemas_share_one_compiled_validator() -> None:
    """A schema is checked and compiled once (an SSE caller re-sends its tools every call)."""
    first = ToolSpec.parse(LOOKUP)
    again = ToolSpec.parse(
        {"name": "other", "parameters": dict(reversed(LOOKUP["parameters"].items()))}
    )
    assert (True, None, "arguments at q: 1 is not of type 'string'") == (
        first.validator is again.validator,
        first.check_arguments({"q": "x"}),
        again.check_arguments({"q": 1}),
    )


def test_arguments_error_names_the_size_not_the_value() -> None:
    """A long value that breaks a rule is described by its size and the rule: the model is
    not sent its own 5,000 characters back."""
    short = ToolSpec.parse(
        {"name": "note", "parameters": {"type": "object", "properties": {"q": {"maxLength": 8}}}}
    )
    assert "arguments at q: a string of 5000 characters: fails maxLength 8" == (
        short.check_arguments({"q": "x" * 5000})
    )


def test_history_rounds_and_ids_since_the_last_user_message() -> None:
    """Rounds and used ids count from the last user message on."""
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "name": "clock"}]}
    answer = {"role": "tool", "tool_call_id": "a", "content": 1}
    later = {"role": "assistant", "content": None, "tool_calls": [{"id": "b", "name": "clock"}]}
    request = ChatRequest.parse(
        {"messages": [USER, call, answer, USER, later, {**answer, "tool_call_id": "b"}]},
        ToolLimits(),
    )
    assert (1, frozenset({"b"})) == (request.rounds_done, request.used_ids)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"messages": [USER], "tools": [LOOKUP, LOOKUP]}, "unique"),
        ({"messages": [USER], "tools": [CLOCK] * 17}, "at most 16 tools"),
        ({"messages": [USER], "tools": [{"name": "bad name"}]}, "must match"),
        ({"messages": [USER], "tools": [{"name": "t", "parameters": {"type": 5}}]}, "JSON Schema"),
        ({"messages": [USER], "tools": [CLOCK], "tool_choice": {"name": "x"}}, "names no tool"),
        ({"messages": [USER], "tool_choice": "always"}, "tool_choice must be"),
        (
            {"messages": [USER, {"role": "tool", "tool_call_id": "x", "content": 1}]},
            "answers no open tool call",
        ),
        (
            {"messages": [USER, {"role": "assistant", "tool_calls": [{"id": "a", "name": "t"}]}]},
            "have no result",
        ),
        (
            {
                "messages": [
                    USER,
                    {"role": "assistant", "tool_calls": [{"id": "a", "name": "t"}]},
                    USER,
                ]
            },
            "have no result",
        ),
        ({"messages": []}, "must not be empty"),
        ({"messages": [{"role": "user", "content": 5}]}, "a user message has string content"),
        ({"messages": [USER, {"role": "assistant", "content": []}]}, "string or null"),
        (
            {
                "messages": [
                    USER,
                    {"role": "assistant", "tool_calls": [{"id": "a", "name": "t"}]},
                    {"role": "tool", "tool_call_id": "a"},
                ]
            },
            "a tool message has content",
        ),
    ],
)
def test_requests_that_cannot_run_are_refused(value: dict[str, Any], message: str) -> None:
    """Beyond the JSON Schema: tools, tool choice and the history's calls are checked."""
    with pytest.raises(SchemaMismatch, match=message):
        ChatRequest.parse(value, ToolLimits())
