"""The caller's half of the ``llm.chat@2.0`` tool loop (spec §5): the conversation rebuilt
from the stream's frames, the same way over WebSocket and SSE. Pure.

Feed every frame of every call of one conversation turn to one :class:`Transcript`:
``token`` frames make the assistant's text; ``tool_call`` frames are calls the caller
must run (:meth:`Transcript.feed` returns them); ``tool_result`` frames are results the
node gave the model itself. The caller records its own results with
:meth:`Transcript.record_result`. When a round is complete (the next round's first
frame arrives, or an SSE stream ended with ``done{stop_reason:"tool_calls"}`` and the
caller ran the calls), the assistant message and the tool messages are appended to
:attr:`Transcript.messages` in the calls' order, exactly as the node appended them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hearthnet.errors import BadRequest
from hearthnet.frames import Frame


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call the caller must run."""

    id: str
    name: str
    arguments: dict[str, Any]
    round: int
    index: int


@dataclass(frozen=True, slots=True)
class ChatEvent:
    """Something the user sees: ``token``, ``tool_call`` or ``tool_result``.

    ``data`` is ``{"text"}``; ``{"id", "name", "arguments"}``; or ``{"id", "name",
    "content"}``. Whether the caller's tool or the node produced a result (a timeout, say)
    is not part of the event: over SSE the client applies the node's rules itself, and
    both transports must show the user the same thing.
    """

    kind: str
    data: dict[str, Any]


class Transcript:
    """One conversation turn as the caller sees it."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages: list[dict[str, Any]] = [dict(m) for m in messages]
        self.events: list[ChatEvent] = []
        self.done: dict[str, Any] | None = None
        self._text: list[str] = []
        self._round: int | None = None
        self._calls: dict[int, dict[str, Any]] = {}
        self._results: dict[str, Any] = {}
        self._by_node: set[str] = set()

    @property
    def text(self) -> str:
        """The text of the last assistant message (the answer once the turn is over)."""
        for msg in reversed(self.messages):
            if msg.get("role") == "assistant":
                return str(msg.get("content") or "")
        return ""

    def feed(self, frame: Frame) -> ToolCall | None:
        """Apply one frame; returns the call to run for a ``tool_call`` frame.

        Raises:
            BadRequest: a malformed tool frame, or a new round while a call of the last
                one has no result (the node never does that).
        """
        data = frame.data
        if frame.event in ("token", "tool_call_delta"):
            if self._calls:
                self.close_round()
            if frame.event == "token":
                text = str(data.get("text", ""))
                self._text.append(text)
                self.events.append(ChatEvent("token", {"text": text}))
            return None
        if frame.event == "tool_call":
            call = self._note_call(data)
            arguments = data.get("arguments")
            return ToolCall(
                call["id"],
                call["name"],
                arguments if isinstance(arguments, dict) else {},
                int(data.get("round", 0)),
                int(data.get("index", 0)),
            )
        if frame.event == "tool_result":
            call = self._note_call(data, id_key="tool_call_id")
            self._results[call["id"]] = data.get("content")
            self._by_node.add(call["id"])
            return None
        if frame.event == "done":
            self.done = dict(data)
            if data.get("stop_reason") != "tool_calls":
                if self._calls:
                    self.close_round()
                self.messages.append({"role": "assistant", "content": "".join(self._text)})
                self._text = []
        return None

    def _note_call(self, data: dict[str, Any], id_key: str = "id") -> dict[str, Any]:
        call_id, name, index = data.get(id_key), data.get("name"), data.get("index")
        if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(index, int):
            raise BadRequest("a tool frame needs a string id and name and an integer index")
        round_ = data.get("round")
        if self._calls and round_ != self._round:
            self.close_round()
        self._round = round_ if isinstance(round_, int) else None
        return self._calls.setdefault(
            index, {"id": call_id, "name": name, "arguments": data.get("arguments")}
        )

    def record_result(self, tool_call_id: str, content: Any) -> bool:
        """The caller's own result for a call; False when the node already decided it
        (it gave the model a timeout error, say), which then stands."""
        if tool_call_id in self._by_node:
            return False
        self._results[tool_call_id] = content
        return True

    @property
    def open_calls(self) -> list[str]:
        """Ids of this round's calls that have no result yet."""
        return [c["id"] for c in self._calls.values() if c["id"] not in self._results]

    def close_round(self) -> None:
        """Append the round's assistant message and tool messages, in the calls' order.

        Raises:
            BadRequest: a call of the round has no result.
        """
        missing = self.open_calls
        if missing:
            raise BadRequest(f"tool calls {missing} have no result")
        calls = [self._calls[i] for i in sorted(self._calls)]
        self.messages.append(
            {"role": "assistant", "content": "".join(self._text), "tool_calls": calls}
        )
        for call in calls:
            self.events.append(ChatEvent("tool_call", dict(call)))
        for call in calls:
            content = self._results[call["id"]]
            self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": content})
            self.events.append(
                ChatEvent(
                    "tool_result", {"id": call["id"], "name": call["name"], "content": content}
                )
            )
        self._text, self._calls, self._results, self._by_node = [], {}, {}, set()
        self._round = None
