"""``hearthnet chat`` (spec §9): talk to ``llm.chat@2.0`` on the running node, with tools.

Tokens are printed as they stream; tool calls and their results appear as they
happen::

    you> what time is it?
    Let me ask the time tool.
      -> time({})
      <- time: {"now":"2026-11-22T10:41:07+01:00"}
    Here is what I found: time returned {"now":"2026-11-22T10:41:07+01:00"}.

Tools offered by default: ``time`` (run here) and ``echo`` (bound to the mesh's
``echo@1.0``, called under your identity). ``--tools FILE`` adds tools from a JSON array
of ``{"name", "description", "parameters", "capability"}``; a tool without a
``capability`` that is not built in answers the model with an error. ``-m TEXT`` sends
one message and exits; otherwise it reads lines until end of input (Ctrl-D). Ctrl-C
stops the current answer (the node is told to cancel) and Ctrl-C at the prompt quits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Callable, Coroutine
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from hearthnet.bus.transcript import ChatEvent
from hearthnet.chat import ChatResult, ChatTool
from hearthnet.errors import ConfigError, NotFound, WireError

MAX_SHOWN = 300
PROMPT = "you> "

BUILTIN_TOOLS = (
    ChatTool(
        "time",
        "The current date and time on the user's computer.",
        {"type": "object", "properties": {}},
    ),
    ChatTool(
        "echo",
        "Send text through the mesh's echo capability and get it back.",
        {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        capability="echo@1.0",
    ),
)


def local_tool(name: str, arguments: dict[str, Any]) -> Any:
    """The tools this command runs itself."""
    if name == "time":
        return {"now": datetime.now().astimezone().isoformat(timespec="seconds")}
    return {"error": "no_handler", "message": f"hearthnet chat has no tool {name}"}


def load_tools(args: argparse.Namespace) -> list[ChatTool]:
    """The built-in tools (unless ``--no-tools``) plus those of ``--tools FILE``."""
    tools = [] if args.no_tools else list(BUILTIN_TOOLS)
    if args.tools:
        path = Path(args.tools).expanduser()
        try:
            extra = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(extra, list):
                raise TypeError("not a JSON array")
            tools += [ChatTool.parse(t) for t in extra]
        except (OSError, ValueError, TypeError) as exc:
            raise ConfigError(f"--tools {path}: {exc}") from exc
    return tools


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


class ChatPrinter:
    """Prints a chat's events for people (or as JSON lines with ``--json``)."""

    def __init__(self, out: IO[str], *, as_json: bool) -> None:
        self.out = out
        self.as_json = as_json
        self.line_open = False

    def note(self, text: str) -> None:
        """Print a line of our own (after the current output)."""
        self._line(text)

    def _line(self, text: str) -> None:
        if self.line_open:
            self.out.write("\n")
            self.line_open = False
        self.out.write(text + "\n")
        self.out.flush()

    def event(self, event: ChatEvent) -> None:
        """Show one event as it happens."""
        if self.as_json:
            if event.kind != "tool_call_delta":
                self._line(json.dumps({"event": event.kind, "data": event.data}))
            return
        if event.kind == "token":
            self.out.write(str(event.data.get("text", "")))
            self.out.flush()
            self.line_open = True
        elif event.kind == "tool_call":
            self._line(f"  -> {event.data.get('name')}({_short(event.data.get('arguments'))})")
        elif event.kind == "tool_result":
            self._line(f"  <- {event.data.get('name')}: {_short(event.data.get('content'))}")

    def finished(self, result: ChatResult) -> None:
        """End the answer."""
        if self.as_json:
            summary = {
                "text": result.text,
                "stop_reason": result.stop_reason,
                "tool_rounds": result.tool_rounds,
                "tokens_out": result.tokens_out,
                "transport": result.transport,
                "calls": result.calls,
            }
            self._line(json.dumps({"event": "result", "data": summary}))
            return
        if self.line_open:
            self.out.write("\n")
            self.line_open = False
        if result.stop_reason == "max_tokens":
            self.out.write("[the answer was cut at max tokens]\n")
        self.out.flush()


async def _stdin_lines() -> asyncio.StreamReader | None:
    """stdin as an asyncio stream (tty or pipe); None for a regular file."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    except ValueError:
        return None
    return reader


class ChatSession:
    """One ``hearthnet chat`` conversation: the history grows with every answer."""

    def __init__(self, args: argparse.Namespace, client: Any, out: IO[str]) -> None:
        self.args = args
        self.client = client
        self.tools = load_tools(args)
        self.printer = ChatPrinter(out, as_json=args.json)
        self.out = out
        self.messages: list[dict[str, Any]] = []
        if args.system:
            self.messages.append({"role": "system", "content": args.system})
        self.current: asyncio.Task[None] | None = None
        self.quit_requested = asyncio.Event()

    async def ask(self, text: str) -> None:
        """One user message, answered with tools; the conversation goes on from there."""
        result = await self.client.chat(
            [*self.messages, {"role": "user", "content": text}],
            tools=self.tools,
            tool_handler=local_tool,
            model=self.args.model,
            backend=self.args.backend,
            max_tokens=self.args.max_tokens,
            prefer_ws=not self.args.sse,
            on_event=self.printer.event,
        )
        self.printer.finished(result)
        self.messages = result.messages

    def on_sigint(self) -> None:
        """Ctrl-C stops the answer being written; at the prompt it quits."""
        if self.current is not None and not self.current.done():
            self.current.cancel()
        else:
            self.quit_requested.set()

    async def _read(self, reader: asyncio.StreamReader) -> str | None:
        loop = asyncio.get_running_loop()
        read = loop.create_task(reader.readline())
        stop = loop.create_task(self.quit_requested.wait())
        await asyncio.wait({read, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not read.done():
            read.cancel()
            return None
        raw = read.result()
        return raw.decode(errors="replace") if raw else None

    async def run_lines(self) -> None:
        """Answer lines from stdin until its end, /quit, or Ctrl-C at the prompt."""
        loop = asyncio.get_running_loop()
        interactive = sys.stdin.isatty()
        reader = await _stdin_lines()
        # A regular file cannot be watched by the event loop; it never blocks, so read it.
        file_lines = None if reader is not None else iter(sys.stdin.read().splitlines())
        loop.add_signal_handler(signal.SIGINT, self.on_sigint)
        try:
            while not self.quit_requested.is_set():
                if interactive:
                    self.out.write(PROMPT)
                    self.out.flush()
                if file_lines is not None:
                    line = next(file_lines, None)
                else:
                    assert reader is not None
                    line = await self._read(reader)
                if line is None or line.strip() in ("/quit", "/exit"):
                    break
                if not line.strip():
                    continue
                self.current = loop.create_task(self.ask(line.strip()))
                try:
                    await self.current
                except asyncio.CancelledError:
                    if self.quit_requested.is_set():
                        raise
                    self.printer.note("[cancelled]")
                except WireError as exc:
                    if not interactive:
                        raise  # a script learns of it by the exit code
                    # at a terminal the conversation goes on: the user may try again
                    self.printer.note(f"[{exc.code}: {exc.message}]")
        finally:
            loop.remove_signal_handler(signal.SIGINT)
        if interactive:
            self.out.write("\n")


def chat_command(
    args: argparse.Namespace,
    make_client: Callable[[], Any],
    run: Callable[[Callable[[], Coroutine[Any, Any, Any]]], Any],
) -> int:
    """``hearthnet chat``: the CLI passes its client factory and event-loop runner."""

    async def main() -> int:
        async with make_client() as client:
            session = ChatSession(args, client, sys.stdout)
            try:
                if args.message is not None:
                    await session.ask(args.message)
                else:
                    await session.run_lines()
            except NotFound as exc:
                if "llm.chat" not in exc.message:
                    raise
                # printed by the CLI as every error is (a JSON object with --json), exit 1
                raise NotFound(
                    "the node offers no llm.chat; start it with --llm-demo "
                    "or --llm-url URL --llm-model NAME"
                ) from exc
            return 0

    code: int = run(main)
    return code
