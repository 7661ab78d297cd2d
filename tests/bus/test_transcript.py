"""The caller's transcript rebuilt from frames equals the node's conversation, inline (WS)
and handed back (SSE re-calls): pure, no sockets."""

from __future__ import annotations

from typing import Any

import pytest

from hearthnet.bus.chatrequest import (
    ChatRequest,
    ToolLimits,
    tool_timeout_content,
)
from hearthnet.bus.toolloop import (
    BackendEvent,
    TextDelta,
    ToolCallDelta,
    ToolLoop,
    TurnEnd,
)
from hearthnet.bus.transcript import ChatEvent, Transcript
from hearthnet.errors import BadRequest
from hearthnet.frames import Frame

TOOLS = [
    {
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"q": {"type": "string"}},
            "required": ["q"],
        },
    },
    {"name": "clock"},
]
LIMITS = ToolLimits(max_parallel=2, tool_timeout_ms=500)
USER = {"role": "user", "content": "water?"}


def model_turn(round_: int) -> list[BackendEvent]:
    """Round 1: three calls (one with bad arguments); round 2: the answer."""
    if round_ == 1:
        return [
            TextDelta("Let me check. "),
            ToolCallDelta(0, "a", "lookup", '{"q": "water"}'),
            ToolCallDelta(1, "b", "lookup", '{"q": 1}'),
            ToolCallDelta(2, "c", "clock", "{}"),
            TurnEnd("tool_calls"),
        ]
    return [TextDelta("Boil it."), TurnEnd("stop")]


def results(call_id: str) -> Any:
    """What the caller's tools answer."""
    return {"a": {"hits": 3}, "c": {"t": 12}}[call_id]


def run_turn(loop: ToolLoop, transcript: Transcript) -> list[Frame]:
    """One model turn through the node loop, every frame fed to the caller's transcript."""
    plan = loop.next_turn()
    frames = [f for e in model_turn(plan.round) for f in loop.feed(e)]
    for frame in frames:
        transcript.feed(frame)
    return frames


def test_inline_transcript_matches_the_node() -> None:
    """Over WS: results in any order, one timed out; both sides hold the same conversation."""
    loop = ToolLoop(
        ChatRequest.parse({"messages": [USER], "tools": TOOLS}, LIMITS), LIMITS, inline=True
    )
    transcript = Transcript([USER])
    run_turn(loop, transcript)
    # the caller answers c first; a gets no answer in time, so the node answers it
    assert transcript.record_result("c", results("c"))
    loop.on_result("c", results("c"))
    for frame in loop.on_timeout("a"):
        transcript.feed(frame)
    late = transcript.record_result("a", results("a"))
    run_turn(loop, transcript)
    transcript.feed(loop.done_frame(5))
    assert (False, loop.messages, "Boil it.") == (late, transcript.messages, transcript.text)
    assert tool_timeout_content("lookup", 500) == transcript.messages[2]["content"]


def test_handed_back_transcript_matches_the_inline_one() -> None:
    """Over SSE: the re-call carries the caller's transcript; the end result is the same."""
    inline = ToolLoop(
        ChatRequest.parse({"messages": [USER], "tools": TOOLS}, LIMITS), LIMITS, inline=True
    )
    ws = Transcript([USER])
    run_turn(inline, ws)
    for call_id in ("a", "c"):
        ws.record_result(call_id, results(call_id))
        inline.on_result(call_id, results(call_id))
    run_turn(inline, ws)
    ws.feed(inline.done_frame(1))

    sse = Transcript([USER])
    first = ToolLoop(
        ChatRequest.parse({"messages": [USER], "tools": TOOLS}, LIMITS), LIMITS, inline=False
    )
    run_turn(first, sse)
    sse.feed(first.done_frame(1))
    for call_id in sse.open_calls:
        sse.record_result(call_id, results(call_id))
    sse.close_round()
    recall = {"messages": sse.messages, "tools": TOOLS}
    second = ToolLoop(ChatRequest.parse(recall, LIMITS), LIMITS, inline=False)
    run_turn(second, sse)
    sse.feed(second.done_frame(1))
    assert (inline.messages, ws.events, 1) == (sse.messages, sse.events, second.rounds)


def test_events_list_tokens_then_calls_then_results() -> None:
    """events: tokens as they came; per round, the calls then their results in call order."""
    loop = ToolLoop(
        ChatRequest.parse({"messages": [USER], "tools": TOOLS}, LIMITS), LIMITS, inline=True
    )
    transcript = Transcript([USER])
    run_turn(loop, transcript)
    for call_id in ("c", "a"):
        transcript.record_result(call_id, results(call_id))
        loop.on_result(call_id, results(call_id))
    run_turn(loop, transcript)
    transcript.feed(loop.done_frame(1))
    assert [
        ("token", "Let me check. "),
        ("tool_call", "a"),
        ("tool_call", "b"),
        ("tool_call", "c"),
        ("tool_result", "a", "{'hits': 3}"),
        ("tool_result", "b", "invalid_arguments"),
        ("tool_result", "c", "{'t': 12}"),
        ("token", "Boil it."),
    ] == [_short(e) for e in transcript.events]


def _short(event: ChatEvent) -> tuple[str, ...]:
    if event.kind == "token":
        return ("token", event.data["text"])
    if event.kind == "tool_call":
        return ("tool_call", event.data["id"])
    content = event.data["content"]
    return ("tool_result", event.data["id"], str(content.get("error", content)))


def test_closing_a_round_with_a_missing_result_is_refused() -> None:
    """A round cannot be closed while one of its calls has no result."""
    transcript = Transcript([USER])
    transcript.feed(
        Frame("tool_call", {"id": "a", "name": "clock", "arguments": {}, "round": 1, "index": 0})
    )
    with pytest.raises(BadRequest, match="have no result"):
        transcript.close_round()


def test_malformed_tool_frame_is_refused() -> None:
    """A tool_call frame without an index is a node bug the caller reports."""
    with pytest.raises(BadRequest, match="integer index"):
        Transcript([USER]).feed(Frame("tool_call", {"id": "a", "name": "clock"}))
