"""The llm.chat tool loop as a pure state machine (spec §5): no sockets, no sleeps."""

from __future__ import annotations

from typing import Any

import pytest

from hearthnet.bus.chatrequest import ChatRequest, ToolLimits, tool_timeout_content
from hearthnet.bus.toolloop import (
    LIMIT_NOTE,
    BackendEvent,
    LoopState,
    TextDelta,
    ToolCallDelta,
    ToolLoop,
    TurnEnd,
)
from hearthnet.errors import BadRequest
from hearthnet.frames import Frame

LOOKUP = {
    "name": "lookup",
    "description": "look something up",
    "parameters": {
        "type": "object",
        "properties": {"q": {"type": "string"}},
        "required": ["q"],
        "additionalProperties": False,
    },
}
CLOCK = {"name": "clock", "parameters": {"type": "object", "properties": {}}}
USER = {"role": "user", "content": "how do I make water safe?"}


def make_loop(
    *, inline: bool = True, messages: list[dict[str, Any]] | None = None, **request: Any
) -> ToolLoop:
    """A loop over a request with the lookup and clock tools."""
    value = {"messages": messages or [USER], "tools": [LOOKUP, CLOCK], **request}
    limits = ToolLimits(max_rounds=3, tool_timeout_ms=250, max_parallel=2, max_calls_per_turn=4)
    return ToolLoop(ChatRequest.parse(value, limits), limits, inline=inline)


def call(index: int, name: str, arguments: str, call_id: str | None = None) -> list[BackendEvent]:
    """A tool call as a backend streams it: id and name first, then argument pieces."""
    pieces = [arguments[i : i + 5] for i in range(0, len(arguments), 5)]
    return [
        ToolCallDelta(index, call_id or f"call_{index}", name, ""),
        *(ToolCallDelta(index, arguments=p) for p in pieces),
    ]


def turn(loop: ToolLoop, *events: BackendEvent) -> list[Frame]:
    """Start a turn and feed it; returns every frame produced."""
    loop.next_turn()
    frames: list[Frame] = []
    for event in events:
        frames += loop.feed(event)
    return frames


def test_text_only_turn_finishes_with_done() -> None:
    """Text pieces become token frames; the turn ends the loop with stop_reason end."""
    loop = make_loop()
    frames = turn(loop, TextDelta("Boil "), TextDelta(""), TextDelta("it."), TurnEnd("stop"))
    assert (
        [("token", {"text": "Boil "}), ("token", {"text": "it."})],
        LoopState.FINISHED,
        {"tokens_out": 2, "stop_reason": "end", "tool_rounds": 0, "ms": 7},
        {"role": "assistant", "content": "Boil it."},
    ) == (
        [(f.event, f.data) for f in frames],
        loop.state,
        loop.done_frame(7).data,
        loop.messages[-1],
    )


def test_tool_call_deltas_then_tool_call_then_result_then_next_turn() -> None:
    """Deltas stream as tool_call_delta; the parsed call goes out; its result starts round 2."""
    loop = make_loop()
    frames = turn(loop, TextDelta("Looking. "), *call(0, "lookup", '{"q": "water"}'), TurnEnd())
    assert [
        ("token", {"text": "Looking. "}),
        ("tool_call_delta", {"id": "call_0", "name": "lookup", "arguments_delta": ""}),
        ("tool_call_delta", {"id": "call_0", "name": "lookup", "arguments_delta": '{"q":'}),
        ("tool_call_delta", {"id": "call_0", "name": "lookup", "arguments_delta": ' "wat'}),
        ("tool_call_delta", {"id": "call_0", "name": "lookup", "arguments_delta": 'er"}'}),
        (
            "tool_call",
            {"id": "call_0", "name": "lookup", "arguments": {"q": "water"}, "round": 1, "index": 0},
        ),
    ] == [(f.event, f.data) for f in frames]
    assert (LoopState.AWAITING_TOOLS, frozenset({"call_0"})) == (loop.state, loop.outstanding)
    assert [] == loop.on_result("call_0", {"answer": "boil"})
    plan = loop.next_turn()
    assert (2, "auto", True) == (plan.round, plan.tool_choice, plan.tools_allowed)
    assert [
        USER,
        {
            "role": "assistant",
            "content": "Looking. ",
            "tool_calls": [{"id": "call_0", "name": "lookup", "arguments": {"q": "water"}}],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": {"answer": "boil"}},
    ] == list(plan.messages)


def test_parallel_calls_are_limited_and_results_kept_in_call_order() -> None:
    """With max_parallel 2, three calls go out two at a time; tool messages follow call order."""
    loop = make_loop()
    events = [
        *call(0, "lookup", '{"q":"a"}'),
        *call(1, "lookup", '{"q":"b"}'),
        *call(2, "clock", ""),
    ]
    first = [f.data["id"] for f in turn(loop, *events, TurnEnd()) if f.event == "tool_call"]
    after_second = [f.data["id"] for f in loop.on_result("call_1", "B")]
    after_third = loop.on_result("call_2", "C")
    assert (["call_0", "call_1"], ["call_2"], [], frozenset({"call_0"})) == (
        first,
        after_second,
        after_third,
        loop.outstanding,
    )
    loop.on_result("call_0", "A")
    assert (LoopState.READY, ["A", "B", "C"]) == (
        loop.state,
        [m["content"] for m in loop.messages if m["role"] == "tool"],
    )


@pytest.mark.parametrize(
    ("name", "arguments", "code", "message"),
    [
        ("lookup", '{"q": 5}', "invalid_arguments", "arguments at q: 5 is not of type 'string'"),
        ("lookup", "{}", "invalid_arguments", "arguments at (root): 'q' is a required property"),
        ("lookup", '{"q": "x"', "invalid_arguments", "arguments are not JSON"),
        ("lookup", "[1]", "invalid_arguments", "arguments must be a JSON object"),
        ("search", '{"q": "x"}', "unknown_tool", "no tool named 'search'; tools: lookup, clock"),
    ],
)
def test_invalid_calls_go_back_to_the_model(
    name: str, arguments: str, code: str, message: str
) -> None:
    """A call the node cannot accept is answered by the node; the model gets the error next."""
    loop = make_loop()
    frames = turn(loop, *call(0, name, arguments), TurnEnd())
    result = frames[-1]
    assert ("tool_result", code, True, LoopState.READY) == (
        result.event,
        result.data["content"]["error"],
        result.data["content"]["message"].startswith(message),
        loop.state,
    )
    assert {"role": "tool", "tool_call_id": "call_0", "content": result.data["content"]} == (
        loop.next_turn().messages[-1]
    )


def test_oversized_arguments_are_refused_not_stored() -> None:
    """Arguments over max_argument_bytes are dropped and the model is told."""
    limits = ToolLimits(max_argument_bytes=16)
    loop = ToolLoop(
        ChatRequest.parse({"messages": [USER], "tools": [LOOKUP]}, limits), limits, inline=True
    )
    frames = turn(loop, *call(0, "lookup", '{"q": "' + "x" * 40 + '"}'), TurnEnd())
    assert (
        "tool_result",
        {"error": "invalid_arguments", "message": "arguments over 16 bytes"},
    ) == (
        frames[-1].event,
        frames[-1].data["content"],
    )


def test_mixed_round_runs_the_valid_call_only() -> None:
    """A valid and an invalid call: the node answers the invalid one and waits for the other."""
    loop = make_loop()
    frames = turn(loop, *call(0, "lookup", "oops"), *call(1, "clock", "{}"), TurnEnd())
    assert (["tool_result", "tool_call"], frozenset({"call_1"}), [1]) == (
        [f.event for f in frames if f.event.startswith("tool_") and f.event != "tool_call_delta"],
        loop.outstanding,
        [f.data["index"] for f in frames if f.event == "tool_call"],
    )


def test_sse_hands_calls_back_with_done_tool_calls() -> None:
    """Not inline: the calls go out and the stream ends with done{stop_reason: tool_calls}."""
    loop = make_loop(inline=False)
    frames = turn(loop, *call(0, "lookup", '{"q":"a"}'), *call(1, "lookup", "{}"), TurnEnd())
    assert (
        ["tool_call", "tool_result"],
        LoopState.HANDED_BACK,
        {
            "tokens_out": 0,
            "stop_reason": "tool_calls",
            "tool_rounds": 1,
            "ms": 3,
            "tool_timeout_ms": 250,
            "max_parallel_tools": 2,
        },
    ) == (
        [f.event for f in frames if f.event != "tool_call_delta"],
        loop.state,
        loop.done_frame(3).data,
    )


def test_sse_round_with_only_invalid_calls_continues_on_the_node() -> None:
    """Not inline, nothing for the caller to run: the node goes straight to the next turn."""
    loop = make_loop(inline=False)
    turn(loop, *call(0, "nope", "{}"), TurnEnd())
    assert LoopState.READY == loop.state


def test_round_limit_forces_an_answer_without_tools() -> None:
    """After max_rounds rounds the model is told to answer, and calls it makes are dropped."""
    loop = make_loop()
    for r in range(3):
        turn(loop, *call(0, "clock", "{}", f"c{r}"), TurnEnd())
        loop.on_result(f"c{r}", {"t": r})
    plan = loop.next_turn()
    frames = [loop.feed(e) for e in (TextDelta("Done."), *call(0, "clock", "{}", "c9"), TurnEnd())]
    assert (
        ("none", False, {"role": "system", "content": LIMIT_NOTE}),
        [[("token", {"text": "Done."})], [], [], []],
        {
            "tokens_out": 1,
            "stop_reason": "end",
            "tool_rounds": 3,
            "ms": 0,
            "tool_limit_reached": True,
            "tool_calls_dropped": 1,
        },
    ) == (
        (plan.tool_choice, plan.tools_allowed, plan.messages[-1]),
        [[(f.event, f.data) for f in fs] for fs in frames],
        loop.done_frame(0).data,
    )


def test_rounds_in_the_history_count_towards_the_limit() -> None:
    """An SSE re-call carrying three rounds already gets the final, tool-less turn."""
    history: list[dict[str, Any]] = [USER]
    for r in range(3):
        history += [
            {"role": "assistant", "content": "", "tool_calls": [{"id": f"c{r}", "name": "clock"}]},
            {"role": "tool", "tool_call_id": f"c{r}", "content": r},
        ]
    plan = make_loop(messages=history).next_turn()
    assert (4, "none") == (plan.round, plan.tool_choice)


def test_required_tool_choice_applies_to_the_first_turn_only() -> None:
    """tool_choice required (or a name) binds the first turn; later turns are auto."""
    loop = make_loop(tool_choice={"name": "clock"})
    first = loop.next_turn().tool_choice
    for e in (*call(0, "clock", "{}"), TurnEnd()):
        loop.feed(e)
    loop.on_result("call_0", 1)
    assert ({"name": "clock"}, "auto") == (first, loop.next_turn().tool_choice)


def test_backend_ids_reused_or_malformed_are_replaced() -> None:
    """An id used earlier in the turn, or not a short token, becomes tc_<round>_<n>."""
    history: list[dict[str, Any]] = [
        USER,
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "name": "clock"}]},
        {"role": "tool", "tool_call_id": "call_0", "content": 1},
    ]
    loop = make_loop(messages=history)
    frames = turn(
        loop, *call(0, "clock", "{}", "call_0"), *call(1, "clock", "{}", "bad id!"), TurnEnd()
    )
    assert ["tc_2_1", "tc_2_2"] == [f.data["id"] for f in frames if f.event == "tool_call"]


def test_timeout_gives_the_model_an_error_and_tells_the_caller() -> None:
    """A result not in time: the model gets a timeout error; the caller a tool_result frame."""
    loop = make_loop()
    turn(loop, *call(0, "clock", "{}"), TurnEnd())
    frames = loop.on_timeout("call_0")
    expected = tool_timeout_content("clock", 250)
    assert (
        [("tool_result", expected)],
        {"error": "timeout", "message": "no result from tool clock within 0.25 s"},
        LoopState.READY,
    ) == (
        [(f.event, f.data["content"]) for f in frames],
        expected,
        loop.state,
    )


def test_results_for_unknown_ids_or_at_the_wrong_time_are_refused() -> None:
    """on_result refuses an id that is not out, and any result when nothing is waiting."""
    loop = make_loop()
    turn(loop, *call(0, "clock", "{}"), TurnEnd())
    with pytest.raises(BadRequest, match="not waiting"):
        loop.on_result("tc_404", {})
    loop.on_result("call_0", {})
    with pytest.raises(BadRequest, match="no tool call is waiting"):
        loop.on_result("call_0", {})


def test_illegal_transitions_raise() -> None:
    """Events out of order are glue bugs: they raise instead of corrupting the loop."""
    loop = make_loop()
    with pytest.raises(RuntimeError, match="backend event while ready"):
        loop.feed(TextDelta("x"))
    turn(loop, *call(0, "clock", "{}"), TurnEnd())
    with pytest.raises(RuntimeError, match="illegal tool-loop transition awaiting_tools"):
        loop.next_turn()
    with pytest.raises(RuntimeError, match="no done frame"):
        loop.done_frame(0)


def test_calls_past_the_per_turn_limit_are_dropped_and_counted() -> None:
    """max_calls_per_turn=4: a fifth and sixth call are dropped whole and counted in done."""
    loop = make_loop()
    events = [e for i in range(6) for e in call(i, "clock", "{}")]
    frames = turn(loop, *events, TurnEnd())
    assert (4, 2) == (
        len({f.data["id"] for f in frames if f.event == "tool_call_delta"}),
        loop.tool_calls_dropped,
    )


def test_length_finish_and_backend_token_count() -> None:
    """finish_reason length is stop_reason max_tokens; the backend's own count wins."""
    loop = make_loop()
    turn(loop, TextDelta("a"), TurnEnd("length", tokens_out=41))
    assert ("max_tokens", 41) == (loop.stop_reason, loop.tokens_out)
