"""``hearthnet node start --llm-demo`` and ``hearthnet chat`` as processes (spec §5, §9)."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.helpers import NodeProcess, hearthnet_cmd, run_cli, start_node_process


@pytest.fixture
def demo_node(tmp_path: Path) -> Iterator[NodeProcess]:
    """A node process with the demo model."""
    proc = start_node_process(tmp_path / "data", "--llm-demo")
    try:
        yield proc
    finally:
        proc.stop()


def test_chat_one_message_shows_tokens_the_tool_call_and_the_answer(
    demo_node: NodeProcess,
) -> None:
    """`hearthnet chat -m` prints the streamed answer with the tool call and its result."""
    done = run_cli("chat", "--data-dir", str(demo_node.data_dir), "-m", "please echo hello mesh")
    assert (
        0,
        [
            "Let me ask the echo tool. ",
            '  -> echo({"text": "hello mesh"})',
            '  <- echo: {"echo": {"text": "hello mesh"}}',
            'Here is what I found: echo returned {"echo":{"text":"hello mesh"}}.',
        ],
    ) == (done.returncode, done.stdout.splitlines())


@pytest.mark.parametrize("transport", ["--json", "--sse"])
def test_chat_reads_lines_and_keeps_the_conversation(
    demo_node: NodeProcess, transport: str
) -> None:
    """Lines on stdin are a conversation (WS or SSE); --json prints one event per line."""
    done = run_cli(
        "chat",
        "--data-dir",
        str(demo_node.data_dir),
        "--json",
        *(["--sse"] if transport == "--sse" else []),
        stdin="what time is it?\nthanks\n",
    )
    events = [json.loads(line) for line in done.stdout.splitlines()]
    results = [e["data"] for e in events if e["event"] == "result"]
    assert (
        0,
        [("end", 1), ("end", 0)],
        ["sse" if transport == "--sse" else "ws"] * 2,
        "You said: thanks. I am the demo model. Name one of my tools (time, echo) and I "
        "will call it.",
        ["time"],
    ) == (
        done.returncode,
        [(r["stop_reason"], r["tool_rounds"]) for r in results],
        [r["transport"] for r in results],
        results[1]["text"],
        [e["data"]["name"] for e in events if e["event"] == "tool_call"],
    )


def test_chat_without_llm_on_the_node_says_how_to_get_it(tmp_path: Path) -> None:
    """A node started without --llm-demo or --llm-url: exit 1 and a hint; with --json the
    error object every command prints (it was the same sentence in plain text), and the
    error code before the sentence, as for every refusal."""
    node = start_node_process(tmp_path / "plain")
    try:
        done, as_json = (
            run_cli("chat", "--data-dir", str(node.data_dir), "-m", "hi", *json_flag)
            for json_flag in ((), ("--json",))
        )
    finally:
        node.stop()
    hint = "the node offers no llm.chat; start it with --llm-demo or --llm-url URL --llm-model NAME"
    assert (1, f"hearthnet: not_found: {hint}", 1, {"error": "not_found", "message": hint}) == (
        done.returncode,
        done.stderr.strip(),
        as_json.returncode,
        json.loads(as_json.stderr),
    )


def test_llm_url_flag_offers_llm_chat(tmp_path: Path) -> None:
    """--llm-url and --llm-model make the node offer llm.chat from that server."""
    node = start_node_process(
        tmp_path / "data", "--llm-url", "http://127.0.0.1:9/v1", "--llm-model", "llama3.1:8b"
    )
    try:
        status = run_cli("node", "status", "--json", "--data-dir", str(node.data_dir))
    finally:
        node.stop()
    assert "llm.chat@2.0" in json.loads(status.stdout)["capabilities"]


class FlakyModelServer(ThreadingHTTPServer):
    """A chat-completions server on loopback whose first answer is a 500, then "hello"."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _FlakyHandler)
        self.requests = 0
        self.url = f"http://127.0.0.1:{self.server_address[1]}/v1"


class _FlakyHandler(BaseHTTPRequestHandler):
    server: FlakyModelServer

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.server.requests += 1
        if self.server.requests == 1:
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b'{"error": "model is loading"}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        delta = {"choices": [{"index": 0, "delta": {"content": "hello"}, "finish_reason": "stop"}]}
        self.wfile.write(b"data: " + json.dumps(delta).encode() + b"\n\ndata: [DONE]\n\n")

    def log_message(self, *args: object) -> None:
        pass


def _read_until(fd: int, marker: str, seen: list[str], within_s: float = 20.0) -> None:
    """Read the terminal until ``marker`` shows (bounded)."""
    deadline = time.monotonic() + within_s
    while marker not in "".join(seen):
        left = deadline - time.monotonic()
        assert left > 0, f"no {marker!r} in {''.join(seen)!r}"
        if select.select([fd], [], [], left)[0]:
            try:
                seen.append(os.read(fd, 4096).decode(errors="replace"))
            except OSError as exc:  # EIO: the command exited and closed the terminal
                raise AssertionError(f"exited before {marker!r}: {''.join(seen)!r}") from exc


def test_interactive_chat_survives_an_error(tmp_path: Path) -> None:
    """At a terminal, a failed answer (the model server's 500) is printed and the prompt
    comes back; the next line is answered (piped stdin still stops at the first error)."""
    server = FlakyModelServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    node = start_node_process(tmp_path / "data", "--llm-url", server.url)
    controller, terminal = pty.openpty()
    chat = subprocess.Popen(
        hearthnet_cmd("chat", "--data-dir", str(node.data_dir), "--no-tools"),
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
    )
    os.close(terminal)
    seen: list[str] = []
    try:
        _read_until(controller, "you> ", seen)
        os.write(controller, b"hi\n")
        _read_until(controller, "model is loading", seen)
        os.write(controller, b"again\n")
        _read_until(controller, "hello", seen)
        os.write(controller, b"/quit\n")
        code = chat.wait(20)
    finally:
        if chat.poll() is None:
            chat.kill()
            chat.wait(5)
        os.close(controller)
        node.stop()
        server.shutdown()
        server.server_close()
    assert (0, 2) == (code, server.requests)
