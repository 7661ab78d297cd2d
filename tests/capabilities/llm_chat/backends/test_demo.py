"""The demo model's decisions and its event stream: pure, deterministic, no sockets."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from capabilities.llm_chat.backends.demo import (
    DemoBackend,
    DemoScript,
    demo_turn,
    guess_arguments,
    split_tokens,
    turn_events,
)
from hearthnet.bus.chatrequest import (
    ChatRequest,
    ToolLimits,
)
from hearthnet.bus.toolloop import (
    TextDelta,
    ToolCallDelta,
    ToolLoop,
    TurnEnd,
    TurnPlan,
)
from hearthnet.errors import BadRequest, ConfigError

WEATHER: dict[str, Any] = {
    "name": "weather.now",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "units": {"type": "string", "enum": ["metric", "imperial"]},
            "alerts": {"type": "boolean"},
        },
    },
}


def plan_for(messages: list[dict[str, Any]], **request: Any) -> TurnPlan:
    """The first plan the node would make for this conversation."""
    limits = ToolLimits()
    value = {"messages": messages, "tools": [WEATHER, {"name": "time"}], **request}
    return ToolLoop(ChatRequest.parse(value, limits), limits, inline=True).next_turn()


def user(text: str) -> dict[str, Any]:
    """A user message."""
    return {"role": "user", "content": text}


def test_tokens_are_words_with_their_spaces() -> None:
    """Splitting keeps every character, so the tokens join back to the text."""
    text = "  Hello,  mesh world! "
    assert (["  ", "Hello,  ", "mesh ", "world! "], text) == (
        split_tokens(text),
        "".join(split_tokens(text)),
    )


def test_naming_a_tool_calls_it_with_guessed_arguments() -> None:
    """'weather in Oslo for 3 days' names weather.now: strings get the rest of the message."""
    turn = demo_turn(plan_for([user("What is the weather in Oslo for 3 days?")]), None)
    assert (
        "Let me ask the weather.now tool. ",
        "weather.now",
        {"city": "in Oslo for 3 days", "days": 3, "units": "metric", "alerts": True},
    ) == (turn.text, turn.tool_calls[0].name, turn.tool_calls[0].arguments)


def test_after_tool_results_it_answers_from_them() -> None:
    """With tool results last in the conversation, the answer quotes them."""
    messages = [
        user("time?"),
        {"role": "assistant", "content": "", "tool_calls": [{"id": "tc_1", "name": "time"}]},
        {"role": "tool", "tool_call_id": "tc_1", "content": {"now": "noon"}},
    ]
    assert 'Here is what I found: time returned {"now":"noon"}.' == (
        demo_turn(plan_for(messages), None).text
    )


def test_no_tool_named_repeats_and_lists_tools() -> None:
    """Nothing matches: the demo repeats the message and offers its tools."""
    assert (
        "You said: hello there. I am the demo model. "
        "Name one of my tools (weather.now, time) and I will call it."
    ) == demo_turn(plan_for([user("hello there")]), None).text


def test_tool_choice_none_and_named() -> None:
    """tool_choice none: no call even when a tool is named; a named choice is always called."""
    none = demo_turn(plan_for([user("the time please")], tool_choice="none"), None)
    named = demo_turn(plan_for([user("hi")], tool_choice={"name": "time"}), None)
    assert ((), "time") == (none.tool_calls, named.tool_calls[0].name)


def test_script_turns_follow_the_model_turns_since_the_user() -> None:
    """Turn k of the script is the k-th model turn since the last user message; the last repeats."""
    script = DemoScript.parse([{"text": "one"}, {"text": "two"}])
    after_one = [
        user("q"),
        {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "name": "time"}]},
        {"role": "tool", "tool_call_id": "a", "content": 1},
    ]
    after_two = [
        *after_one,
        {"role": "assistant", "content": "", "tool_calls": [{"id": "b", "name": "time"}]},
        {"role": "tool", "tool_call_id": "b", "content": 2},
    ]
    assert ["one", "two", "two", "one"] == [
        demo_turn(plan_for(m), script).text
        for m in ([user("q")], after_one, after_two, [*after_two, user("again")])
    ]


def test_script_results_placeholder_and_no_tools_fallback() -> None:
    """{results} becomes the latest results; a call turn with tools refused answers instead."""
    script = DemoScript.parse([{"text": "Got {results}", "tool_calls": [{"name": "time"}]}])
    messages = [
        user("q"),
        {"role": "assistant", "content": "", "tool_calls": [{"id": "a", "name": "time"}]},
        {"role": "tool", "tool_call_id": "a", "content": {"t": 1}},
    ]
    assert ('Got [{"t":1}]', 'Here is what I found: time returned {"t":1}.') == (
        demo_turn(plan_for(messages), script).text,
        demo_turn(plan_for(messages, tool_choice="none"), script).text,
    )


def test_turn_events_stream_text_then_call_pieces() -> None:
    """A call streams id and name first, then 8-character argument pieces, then the end."""
    script = DemoScript.parse(
        [{"text": "Hi there", "tool_calls": [{"name": "time", "arguments": {"zone": "UTC+1"}}]}]
    )
    plan = plan_for([user("q")])
    assert [
        TextDelta("Hi "),
        TextDelta("there"),
        ToolCallDelta(0, "tc_1", "time", ""),
        ToolCallDelta(0, None, None, '{"zone":'),
        ToolCallDelta(0, None, None, '"UTC+1"}'),
        TurnEnd("tool_calls"),
    ] == turn_events(plan, demo_turn(plan, script))


def test_max_tokens_truncates_and_drops_calls() -> None:
    """Over max_tokens the turn ends with finish length and no tool calls."""
    script = DemoScript.parse([{"text": "a b c d", "tool_calls": [{"name": "time"}]}])
    plan = plan_for([user("q")], max_tokens=2)
    assert [TextDelta("a "), TextDelta("b "), TurnEnd("length")] == turn_events(
        plan, demo_turn(plan, script)
    )


def test_guess_arguments_with_no_number_and_no_trailing_words() -> None:
    """Without a number, numbers are 0; with nothing after the word, strings get the whole text."""
    assert {"city": "weather", "days": 0, "units": "metric", "alerts": True} == guess_arguments(
        WEATHER["parameters"], "weather", "weather"
    )


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ([], "should be non-empty"),
        ([{"text": 1}], "0/text: 1 is not of type 'string'"),
        ([{"tool_calls": [{"arguments": {}}]}], "'name' is a required property"),
        ([{"speed": 3}], "Additional properties"),
    ],
)
def test_bad_scripts_are_refused(script: Any, message: str) -> None:
    """A script that does not fit the schema is a bad_request naming the place."""
    with pytest.raises(BadRequest, match=message):
        DemoScript.parse(script)


def test_script_file_and_backend_params(tmp_path: Path) -> None:
    """[llm] demo_script loads a file; a broken file is a ConfigError; params.script wins."""
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps([{"text": "from file"}]))
    bad.write_text("[{")
    backend = DemoBackend(DemoScript.load(good))
    plan = plan_for([user("q")])
    with pytest.raises(ConfigError, match=r"bad\.json"):
        DemoScript.load(bad)
    assert ("from file", "from params") == (
        demo_turn(plan, backend._script({})).text,
        demo_turn(plan, backend._script({"script": [{"text": "from params"}]})).text,
    )
