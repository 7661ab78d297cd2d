"""An OpenAI-compatible chat-completions backend: Ollama, llama.cpp server, vLLM (spec §5).

``POST <url>/chat/completions`` with ``"stream": true``; the server answers with
server-sent events ``data: {chunk}`` and a final ``data: [DONE]``. Text arrives in
``choices[0].delta.content``; tool calls in ``choices[0].delta.tool_calls`` as pieces
keyed by ``index`` (the first piece carries ``id`` and ``function.name``, later ones
fragments of ``function.arguments``); ``finish_reason`` ends the turn. Ollama numbers
every call of a turn ``index: 0``, so a piece with an ``id`` not yet seen at its index
starts a new call.

:func:`build_request` and :class:`ChunkParser` are pure; :class:`OpenAIBackend` is the
aiohttp glue. Closing a turn early (a cancelled call) closes the HTTP response, so the
model server stops generating.
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp
import orjson

from hearthnet.bus.toolloop import BackendEvent, TextDelta, ToolCallDelta, TurnEnd, TurnPlan
from hearthnet.errors import (
    BadRequest,
    DeadlineExceeded,
    NotFound,
    RateLimited,
    Unavailable,
    WireError,
)
from hearthnet.transport.codec import SseParser

# OpenAI's own rule for function names; local servers accept more, but one rule fits all.
_WIRE_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")
MAX_ERROR_DETAIL = 300
MAX_CHUNK_EVENT_BYTES = 1024 * 1024
# Calls told apart by id within one turn; past this the server's index is taken as is
# (the tool loop drops calls past max_calls_per_turn anyway).
MAX_CALL_IDS = 256


def chat_completions_url(url: str) -> str:
    """The endpoint for a configured URL: a base (``.../v1``) or the endpoint itself."""
    url = url.rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


class ToolNames:
    """Our tool names <-> names OpenAI accepts (``rag.query`` -> ``rag_query``)."""

    def __init__(self, names: list[str]) -> None:
        self.to_wire: dict[str, str] = {}
        self.from_wire: dict[str, str] = {}
        # Names OpenAI accepts keep themselves; the others get a free sanitised name.
        for name in names:
            if _WIRE_NAME_RE.match(name) and name not in self.to_wire:
                self.to_wire[name] = self.from_wire[name] = name
        for name in names:
            if name in self.to_wire:
                continue
            wire = re.sub(r"[^A-Za-z0-9_-]", "_", name)[:60] or "tool"
            base, n = wire, 2
            while wire in self.from_wire:
                wire, n = f"{base}_{n}", n + 1
            self.to_wire[name] = wire
            self.from_wire[wire] = name

    def wire(self, name: str) -> str:
        """The name sent to the server."""
        return self.to_wire.get(name, name)

    def ours(self, wire: str) -> str:
        """The name a server's tool call means."""
        return self.from_wire.get(wire, wire)


def _text(content: Any) -> str:
    return content if isinstance(content, str) else orjson.dumps(content).decode()


def build_request(
    plan: TurnPlan, model: str, *, max_tokens: int | None
) -> tuple[dict[str, Any], ToolNames]:
    """The chat-completions request body for a turn, and the tool-name mapping used."""
    history_names = [
        c["name"] for m in plan.messages for c in (m.get("tool_calls") or []) if "name" in c
    ]
    names = ToolNames([t.name for t in plan.tools] + history_names)
    messages: list[dict[str, Any]] = []
    for msg in plan.messages:
        role = msg.get("role")
        if role == "assistant":
            out: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
            calls = msg.get("tool_calls")
            if calls:
                out["content"] = msg.get("content") or None
                out["tool_calls"] = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {
                            "name": names.wire(c["name"]),
                            "arguments": _text(c.get("arguments", {})),
                        },
                    }
                    for c in calls
                ]
            messages.append(out)
        elif role == "tool":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": msg["tool_call_id"],
                    "content": _text(msg.get("content")),
                }
            )
        else:
            messages.append({"role": role, "content": _text(msg.get("content", ""))})
    body: dict[str, Any] = {"messages": messages, "stream": True}
    if model:
        body["model"] = model
    if plan.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": names.wire(t.name),
                    "description": t.description,
                    "parameters": t.parameters,
                },
            }
            for t in plan.tools
        ]
        choice = plan.tool_choice
        body["tool_choice"] = (
            {"type": "function", "function": {"name": names.wire(str(choice["name"]))}}
            if isinstance(choice, dict)
            else choice
        )
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body, names


class ChunkParser:
    """``data:`` payloads of a chat-completions stream -> backend events. Pure."""

    def __init__(self, names: ToolNames) -> None:
        self.names = names
        self.finished = False
        self.finish_reason: str | None = None
        self.tokens_out: int | None = None
        self._ids: dict[int, str] = {}  # our index -> the server's id of that call
        self._index: dict[int, int] = {}  # the server's index -> our index for it now

    def _our_index(self, index: int, call_id: str | None) -> int:
        """Our index of a piece: the server's, unless the server reuses an index for a
        call with another id (Ollama's ``index: 0`` for every call, ollama#15457)."""
        ours = self._index.get(index, index)
        if call_id is None or len(self._ids) >= MAX_CALL_IDS:
            return ours
        seen = self._ids.get(ours)
        if seen is not None and seen != call_id:
            ours = max(*self._ids, *self._index.values(), index) + 1
            self._index[index] = ours
        self._ids.setdefault(ours, call_id)
        return ours

    def feed(self, data: str) -> list[BackendEvent]:
        """One ``data:`` payload.

        Raises:
            Unavailable: the server reported an error in the stream or sent junk.
        """
        if data.strip() == "[DONE]":
            self.finished = True
            return []
        try:
            chunk = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise Unavailable(f"the model server sent a malformed chunk: {exc}") from exc
        if not isinstance(chunk, dict):
            raise Unavailable("the model server sent a chunk that is not an object")
        if chunk.get("error"):
            error = chunk["error"]
            detail = error.get("message", error) if isinstance(error, dict) else error
            raise Unavailable(f"the model server failed: {str(detail)[:MAX_ERROR_DETAIL]}")
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.tokens_out = usage["completion_tokens"]
        events: list[BackendEvent] = []
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue  # we ask for one choice
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if isinstance(content, str) and content:
                events.append(TextDelta(content))
            for position, piece in enumerate(delta.get("tool_calls") or []):
                if not isinstance(piece, dict):
                    continue
                function = piece.get("function") or {}
                name = function.get("name")
                arguments = function.get("arguments")
                if not isinstance(arguments, str):
                    # some servers send a whole call with the arguments as an object
                    arguments = "" if arguments is None else orjson.dumps(arguments).decode()
                index = piece.get("index")
                call_id = piece.get("id")
                if not isinstance(call_id, str) or not call_id:
                    call_id = None  # some servers send "id": "" on later pieces
                events.append(
                    ToolCallDelta(
                        self._our_index(index if isinstance(index, int) else position, call_id),
                        call_id,
                        self.names.ours(name) if isinstance(name, str) and name else None,
                        arguments,
                    )
                )
            reason = choice.get("finish_reason")
            if isinstance(reason, str):
                self.finish_reason = reason
        return events

    def end(self) -> TurnEnd:
        """The turn's end (``length`` stays ``length``; anything else is decided by
        whether tool calls came, which the tool loop sees for itself).

        Raises:
            Unavailable: the stream stopped with neither a ``finish_reason`` nor
                ``[DONE]`` (the server died mid-answer): the answer is cut short.
        """
        if self.finish_reason is None and not self.finished:
            raise Unavailable(
                "the model server's stream ended before the answer was complete"
                " (no finish_reason, no [DONE])",
                retry_after_ms=1000,
            )
        reason = self.finish_reason or "stop"
        return TurnEnd(reason if reason in ("tool_calls", "length") else "stop", self.tokens_out)


def upstream_error(status: int, detail: str, retry_after: str | None) -> WireError:
    """The wire error for a refusal by the model server."""
    detail = detail.strip()[:MAX_ERROR_DETAIL]
    message = f"the model server answered {status}: {detail}"
    if status == 400:
        return BadRequest(message)
    if status == 404:
        return NotFound(message + " (is [llm] model right?)")
    if status == 429:
        retry_ms = int(float(retry_after) * 1000) if retry_after and retry_after.isdigit() else 1000
        return RateLimited(message, retry_after_ms=retry_ms)
    return Unavailable(message, retry_after_ms=1000)


class OpenAIBackend:
    """Streams turns from an OpenAI-compatible server over one pooled HTTP session."""

    name = "openai"

    def __init__(
        self,
        url: str,
        *,
        model: str,
        api_key: str | None,
        max_tokens: int | None = None,
        request_timeout_s: float = 60.0,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.endpoint = chat_completions_url(url)
        self.model = model
        self.max_tokens = max_tokens
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=request_timeout_s
        )
        self._session: aiohttp.ClientSession | None = None

    def check_params(self, params: dict[str, Any]) -> None:
        """``params.model``, if given, is a string."""
        model = params.get("model")
        if model is not None and (not isinstance(model, str) or len(model) > 256):
            raise BadRequest("params.model must be a string")

    def _session_now(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def turn(
        self, plan: TurnPlan, params: dict[str, Any]
    ) -> AsyncGenerator[BackendEvent, None]:
        """POST the turn and stream the server's chunks as backend events.

        Raises:
            Unavailable / BadRequest / NotFound / RateLimited: the server could not be
                reached, refused, or failed mid-stream.
            DeadlineExceeded: the server was silent for ``request_timeout_s``.
        """
        model = params.get("model") or self.model
        body, names = build_request(plan, model, max_tokens=plan.max_tokens or self.max_tokens)
        try:
            resp = await self._session_now().post(
                self.endpoint, data=orjson.dumps(body), headers=self._headers
            )
        except (aiohttp.ClientError, OSError) as exc:
            raise Unavailable(
                f"cannot reach the model server at {self.endpoint}: {exc}", retry_after_ms=1000
            ) from exc
        try:
            if resp.status != 200:
                detail = (await resp.content.read(MAX_ERROR_DETAIL * 4)).decode(errors="replace")
                raise upstream_error(resp.status, detail, resp.headers.get("Retry-After"))
            if resp.content_type == "application/json":
                # llm.md: the server must stream; one whole completion would read as empty
                raise Unavailable(
                    "the model server answered application/json, not an event stream:"
                    ' it must support "stream": true'
                )
            parser = ChunkParser(names)
            sse = SseParser(max_event_bytes=MAX_CHUNK_EVENT_BYTES)
            while not parser.finished:
                try:
                    chunk = await resp.content.readany()
                except TimeoutError as exc:
                    raise DeadlineExceeded(
                        f"the model server was silent for {self._timeout.sock_read:g} s"
                    ) from exc
                except aiohttp.ClientError as exc:
                    raise Unavailable(f"the model server's stream broke: {exc}") from exc
                if not chunk:
                    break
                for _, data, _ in sse.feed(chunk):
                    for event in parser.feed(data):
                        yield event
                    if parser.finished:
                        break
            yield parser.end()
        finally:
            # Unread body (cancelled, or the server kept talking): drop the connection
            # so the server stops generating; a finished one goes back to the pool.
            if resp.content.at_eof():
                resp.release()
            else:
                resp.close()

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None
