"""``hearthnet bridge`` as a real subprocess driven through its pipes, against a real node
process (docs/bridge.md): pub/sub and call frames as JSON lines, tool results inline, the
delivery window, a script that stops reading holding the node back, a bounded drain at
the end of input, exit codes."""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import json
import queue
import signal
import subprocess
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from hearthnet.client import Client
from hearthnet.identity import load_or_create_keys
from tests.helpers import NodeProcess, hearthnet_cmd, run_cli, start_node_process

WAIT_S = 30.0  # generous: the machine may be loaded


@pytest.fixture(scope="module")
def node_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A node process with the demo model, for the module."""
    data = tmp_path_factory.mktemp("bridge") / "data"
    proc = start_node_process(data, "--no-zeroconf", "--llm-demo")
    try:
        yield proc
    finally:
        proc.stop()


class BridgeProcess:
    """``hearthnet bridge`` with its stdin and stdout as pipes; stopped by PID."""

    def __init__(self, node: NodeProcess, *flags: str) -> None:
        self.proc = subprocess.Popen(
            hearthnet_cmd("bridge", "--data-dir", str(node.data_dir), *flags),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reading = threading.Event()  # clear: the script stops reading stdout
        self.reading.set()
        assert self.proc.stdout is not None
        threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True).start()

    def _pump(self, out: IO[str]) -> None:
        while self.reading.wait() and (line := out.readline()):
            self.lines.put(line)
        self.lines.put(None)

    def wait_read(self, timeout: float = 15.0) -> None:
        """Until the bridge has read everything written to its stdin (the pipe holds no
        unread byte: FIONREAD on the writing end), however loaded the machine is."""
        assert self.proc.stdin is not None
        unread = array.array("i", [0])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fcntl.ioctl(self.proc.stdin.fileno(), termios.FIONREAD, unread)
            if unread[0] == 0:
                return
            time.sleep(0.02)
        raise AssertionError(f"the bridge left {unread[0]} bytes of its input unread")

    def send(self, *frames: dict[str, Any]) -> None:
        """Write frames, one per line."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("".join(json.dumps(f) + "\n" for f in frames))
        self.proc.stdin.flush()

    def close_input(self) -> None:
        """End of input."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def until(self, done: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """Frames read up to and including the first for which ``done`` holds."""
        frames: list[dict[str, Any]] = []
        deadline = time.monotonic() + WAIT_S
        while True:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                raise AssertionError(f"the bridge ended first; got {frames}")
            frames.append(json.loads(line))
            if done(frames[-1]):
                return frames

    def rest(self) -> list[dict[str, Any]]:
        """Every frame until the bridge's stdout closes."""
        frames: list[dict[str, Any]] = []
        while (line := self.lines.get(timeout=WAIT_S)) is not None:
            frames.append(json.loads(line))
        return frames

    def wait(self) -> int:
        """The exit code (bounded)."""
        return self.proc.wait(WAIT_S)

    def stop(self) -> None:
        """Kill it if it still runs."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()


@pytest.fixture
def bridge_of(node_proc: NodeProcess) -> Iterator[Callable[..., BridgeProcess]]:
    """Start bridges to the node; each is stopped at the end."""
    started: list[BridgeProcess] = []

    def start(*flags: str) -> BridgeProcess:
        started.append(BridgeProcess(node_proc, *flags))
        return started[-1]

    yield start
    for bridge in started:
        bridge.stop()


def endless(call: str) -> dict[str, Any]:
    """A call ``call`` of a stream that does not end by itself (a frame every 50 ms)."""
    return {
        "type": "call",
        "id": call,
        "capability": "echo.stream@1.0",
        "input": {"count": 1_000_000, "interval_ms": 50},
    }


# A chat call "chat" whose model asks for the "time" tool (the demo model does).
TIME_CHAT: dict[str, Any] = {
    "type": "call",
    "id": "chat",
    "capability": "llm.chat@2.0",
    "input": {
        "messages": [{"role": "user", "content": "what time is it?"}],
        "tools": [{"name": "time", "parameters": {"type": "object"}}],
    },
}


def publish(topic: str, i: int, ref: str | None = None) -> dict[str, Any]:
    """A publish frame, as on the pub/sub WebSocket."""
    frame = {"type": "publish", "topic": topic, "msg_type": "m", "data": {"i": i}}
    return frame if ref is None else {**frame, "ref": ref}


def test_pubsub_and_calls_through_the_pipes(bridge_of: Callable[..., BridgeProcess]) -> None:
    """auth.ok, then subscribed, published.ok per publish (a missing ref stays null), the
    messages, a unary call as output+done and a stream as its frames, each with its call
    id, a bad line as an error frame; end of input: exit 0 once all is answered."""
    bridge = bridge_of()
    ready = bridge.until(lambda f: f["event"] == "auth.ok")
    bridge.send({"type": "subscribe", "topics": ["pipe.*"]})
    bridge.until(lambda f: f["event"] == "subscribed")
    bridge.send(
        publish("pipe.a", 1, "p1"),
        publish("pipe.a", 2),
        {"type": "call", "id": "u", "capability": "echo@1.0", "input": {"x": 1}},
        {"type": "call", "id": "s", "capability": "echo.stream@1.0", "input": {"count": 3}},
        {"type": "publish", "topic": "pipe..bad", "msg_type": "m", "data": 0, "ref": "p3"},
    )
    bridge.close_input()
    frames = bridge.rest()
    code = bridge.wait()
    by_call = {
        call: [(f["event"], f["data"]) for f in frames if f.get("call") == call]
        for call in ("u", "s")
    }
    messages = [f["data"]["data"]["i"] for f in frames if f["event"] == "message"]
    answers = [(f["event"], f["data"]["ref"]) for f in frames if "ref" in f["data"]]
    assert (
        0,
        "auth.ok",
        [1, 2],
        [("error", "p3"), ("published.ok", "p1"), ("published.ok", None)],
        [("output", {"echo": {"x": 1}}), "done"],
        ["token", "token", "token", "done"],
        1,
    ) == (
        code,
        ready[0]["event"],
        messages,
        sorted(answers, key=str),
        [by_call["u"][0], by_call["u"][1][0]],
        [event for event, _ in by_call["s"]],
        sum(f["data"].get("line") == 6 for f in frames if f["event"] == "error"),
    )


def test_a_tool_call_is_answered_through_the_pipe(bridge_of: Callable[..., BridgeProcess]) -> None:
    """llm.chat streams a tool_call frame; a tool_result line answers it on the same call,
    and the model's answer uses it."""
    bridge = bridge_of()
    bridge.until(lambda f: f["event"] == "auth.ok")
    bridge.send(TIME_CHAT)
    tool_call = bridge.until(lambda f: f["event"] == "tool_call")[-1]
    bridge.send(
        {
            "type": "tool_result",
            "call": "chat",
            "tool_call_id": tool_call["data"]["id"],
            "body": {"now": "noon"},
        }
    )
    frames = bridge.until(lambda f: f["event"] in ("done", "error"))
    bridge.close_input()
    text = "".join(f["data"].get("text", "") for f in frames if f["event"] == "token")
    assert ("chat", "time", "done", True, 0) == (
        tool_call["call"],
        tool_call["data"]["name"],
        frames[-1]["event"],
        "noon" in text,
        bridge.wait(),
    )


def test_deliveries_stop_at_the_window_until_the_script_acks(
    bridge_of: Callable[..., BridgeProcess],
) -> None:
    """--window 4 --manual-ack: of 10 messages 4 come out; each ack of the last one
    delivered lets 4 more through."""
    bridge = bridge_of("--window", "4", "--manual-ack")
    bridge.until(lambda f: f["event"] == "auth.ok")
    bridge.send({"type": "subscribe", "topics": ["win.*"]})
    bridge.until(lambda f: f["event"] == "subscribed")
    bridge.send(*(publish("win.a", i, f"w{i}") for i in range(10)))
    rounds: list[list[int]] = []
    last = bridge.until(lambda f: f["event"] == "published.ok" and f["data"]["ref"] == "w9")
    while True:
        bridge.send({"type": "ping"})  # the pong comes after anything the window let through
        last += bridge.until(lambda f: f["event"] == "pong")
        held = [f for f in last if f["event"] == "message"]
        rounds.append([f["data"]["data"]["i"] for f in held])
        if not held or held[-1]["data"]["data"]["i"] == 9:
            break
        bridge.send({"type": "ack", "upto": held[-1]["seq"]})
        last = []
    bridge.close_input()
    assert ([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]], 0) == (rounds, bridge.wait())


def delivered_total(node: NodeProcess) -> int:
    """Message frames the node has written to its subscribers (``/status``)."""

    async def status() -> dict[str, Any]:
        async with Client(node.url, keys=load_or_create_keys(node.data_dir)) as client:
            got: dict[str, Any] = await client.get_json("/status")
            return got

    return int(asyncio.run(status())["delivered_total"])


def test_a_script_that_stops_reading_holds_the_node_back(
    node_proc: NodeProcess, bridge_of: Callable[..., BridgeProcess]
) -> None:
    """A subscriber's script stops reading stdout while 600 messages of 1 KB are
    published: the bridge writes only as far as the pipe takes and acks only what it
    wrote, so the node sends about a pipe's worth and holds the rest. Read again, every
    message arrives once, in order, with no gap."""
    sub, publisher = bridge_of("--window", "4"), bridge_of()
    sub.until(lambda f: f["event"] == "auth.ok")
    sub.send({"type": "subscribe", "topics": ["slow.*"]})
    sub.until(lambda f: f["event"] == "subscribed")
    sub.reading.clear()
    before = delivered_total(node_proc)
    publisher.until(lambda f: f["event"] == "auth.ok")
    pad = "x" * 1000
    publisher.send(
        *(
            {**f, "data": {**f["data"], "pad": pad}}
            for f in (publish("slow.a", i, f"s{i}") for i in range(600))
        )
    )
    oks = publisher.until(lambda f: f["event"] == "published.ok" and f["data"]["ref"] == "s599")
    published = [f["data"]["seq"] for f in oks if f["event"] == "published.ok"]
    # what the node wrote to the bridge while nobody read stdout, once it stops growing
    sent = [delivered_total(node_proc) - before]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (len(sent) < 3 or sent[-1] != sent[-3]):
        time.sleep(0.5)
        sent.append(delivered_total(node_proc) - before)
    sub.reading.set()
    got = sub.until(lambda f: f["event"] == "message" and f["seq"] == published[-1])
    # 64 KiB of pipe and 64 KiB the bridge may buffer are ~125 messages of ~1 KiB
    assert (600, True, published, []) == (
        len(published),
        sent[-1] < 300,
        [f["seq"] for f in got if f["event"] == "message"],
        [f for f in got if f["event"] == "gap"],
    )


def test_end_of_input_waits_for_a_running_call_only_so_long(
    bridge_of: Callable[..., BridgeProcess],
) -> None:
    """--drain-timeout 0.5 with an endless stream running: the call ends with
    error{timeout} and the bridge exits 1."""
    bridge = bridge_of("--drain-timeout", "0.5")
    bridge.until(lambda f: f["event"] == "auth.ok")
    bridge.send(endless("slow"))
    bridge.until(lambda f: f.get("call") == "slow")
    bridge.close_input()
    last = [f for f in bridge.rest() if f.get("call") == "slow"][-1]
    assert (("error", "timeout"), 1) == ((last["event"], last["data"]["code"]), bridge.wait())


def test_no_node_is_exit_3(tmp_path: Path, node_proc: NodeProcess) -> None:
    """Nothing listening at --url: exit 3 and how to start a node on stderr."""
    done = subprocess.run(
        hearthnet_cmd(
            "bridge", "--data-dir", str(node_proc.data_dir), "--url", "http://127.0.0.1:1"
        ),
        input="",
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        check=False,
    )
    assert (3, True, "") == (done.returncode, "hearthnet node start" in done.stderr, done.stdout)


@pytest.mark.parametrize("value", ["nan", "-1"])
def test_a_drain_timeout_that_is_no_duration_is_a_usage_error(value: str, tmp_path: Path) -> None:
    """--drain-timeout nan (or below 0) is refused with the usage, exit 2."""
    done = run_cli("bridge", "--data-dir", str(tmp_path), "--drain-timeout", value, stdin="")
    assert (2, True, "") == (done.returncode, "--drain-timeout" in done.stderr, done.stdout)


def test_a_reader_that_goes_away_ends_the_bridge_quietly(node_proc: NodeProcess) -> None:
    """stdout closed while a stream runs (``| head -2``): the bridge ends with exit 0 and
    nothing on stderr."""
    proc = subprocess.Popen(
        hearthnet_cmd("bridge", "--data-dir", str(node_proc.data_dir)),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdin is not None
        first = json.loads(proc.stdout.readline())
        proc.stdin.write(
            '{"type":"call","id":"s","capability":"echo.stream@1.0",'
            '"input":{"count":1000000,"interval_ms":20}}\n'
        )
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["call"] == "s"  # the stream runs
        proc.stdout.close()
        with contextlib.suppress(BrokenPipeError):  # it may be gone before all is written
            proc.stdin.write('{"type":"ping"}\n' * 50)
            proc.stdin.close()
        code = proc.wait(WAIT_S)
        assert proc.stderr is not None
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        if proc.stderr is not None:
            proc.stderr.close()
    assert ("auth.ok", 0, "") == (first["event"], code, err)


def test_a_session_the_node_ends_ends_the_bridge_with_exit_1(
    node_proc: NodeProcess, bridge_of: Callable[..., BridgeProcess]
) -> None:
    """A token bridge whose token is revoked: the node's error, then unavailable, exit 1."""
    token = run_cli(
        "token", "issue", "--scope", "sub:gone.*", "--data-dir", str(node_proc.data_dir)
    ).stdout.strip()
    bridge = bridge_of("--token", token)
    bridge.until(lambda f: f["event"] == "auth.ok")
    revoked = run_cli("token", "revoke", token, "--data-dir", str(node_proc.data_dir))
    errors = [f["data"]["code"] for f in bridge.rest() if f["event"] == "error"]
    assert (0, ["revoked", "unavailable"], 1) == (revoked.returncode, errors, bridge.wait())


def test_a_cancel_gets_through_while_calls_wait_for_a_slot(
    bridge_of: Callable[..., BridgeProcess],
) -> None:
    """--max-calls 1 with an endless stream running: calls behind it wait, but a cancel
    still gets through, for the running stream and for a waiting call (which then never
    runs); the call left runs once the slot is free."""
    bridge = bridge_of("--max-calls", "1")
    bridge.until(lambda f: f["event"] == "auth.ok")
    bridge.send(endless("a"))
    bridge.until(lambda f: f.get("call") == "a")
    bridge.send(
        {"type": "call", "id": "c", "capability": "echo@1.0", "input": {"c": 1}},
        {"type": "call", "id": "d", "capability": "echo@1.0", "input": {"d": 1}},
        {"type": "cancel", "call": "d"},
        {"type": "cancel", "call": "a"},
    )
    frames = bridge.until(lambda f: f.get("call") == "c" and f["event"] in ("done", "error"))
    bridge.close_input()
    frames += bridge.rest()
    ends = {
        call: [(f["event"], f["data"].get("code")) for f in frames if f.get("call") == call]
        for call in ("c", "d")
    }
    last_a = [f for f in frames if f.get("call") == "a"][-1]
    assert (
        [("output", None), ("done", None)],
        [("error", "cancelled")],
        ("error", "cancelled"),
        0,
    ) == (ends["c"], ends["d"], (last_a["event"], last_a["data"]["code"]), bridge.wait())


def test_a_tool_result_gets_through_while_calls_wait_for_a_slot(
    bridge_of: Callable[..., BridgeProcess],
) -> None:
    """--max-calls 1: a chat waits for its tool result while another call waits for the
    slot; the tool_result line still reaches the chat, which ends, and the other call runs."""
    bridge = bridge_of("--max-calls", "1")
    bridge.until(lambda f: f["event"] == "auth.ok")
    bridge.send(TIME_CHAT)
    tool_call = bridge.until(lambda f: f["event"] == "tool_call")[-1]
    bridge.send(
        {"type": "call", "id": "next", "capability": "echo@1.0", "input": {"n": 1}},
        {
            "type": "tool_result",
            "call": "chat",
            "tool_call_id": tool_call["data"]["id"],
            "body": {"now": "noon"},
        },
    )
    frames = bridge.until(lambda f: f.get("call") == "next" and f["event"] in ("done", "error"))
    bridge.close_input()
    ends = [(f["call"], f["event"]) for f in frames if f["event"] in ("done", "error")]
    assert ([("chat", "done"), ("next", "done")], 0) == (ends, bridge.wait())


def test_the_node_going_away_answers_what_was_sent(tmp_path: Path) -> None:
    """The node stops answering, then dies: a running stream and every publish sent and not
    answered get an error frame (unavailable, with their call id or ref), then the session's
    own; exit 1."""
    node = start_node_process(tmp_path / "data", "--no-zeroconf")
    bridge = BridgeProcess(node)
    try:
        bridge.until(lambda f: f["event"] == "auth.ok")
        bridge.send(endless("s"))
        bridge.until(lambda f: f.get("call") == "s")
        node.proc.send_signal(signal.SIGSTOP)
        bridge.send(*(publish("gone.a", i, f"g{i}") for i in range(5)))
        bridge.wait_read()  # the bridge has read them, and sends them to a node that does
        time.sleep(0.5)  # not answer
        node.proc.kill()
        frames = bridge.rest()
        code = bridge.wait()
    finally:
        bridge.stop()
        node.stop()
    refs = [f["data"]["ref"] for f in frames if f["event"] == "error" and "ref" in f["data"]]
    codes = {f["data"]["code"] for f in frames if f["event"] == "error"}
    last_s = [f for f in frames if f.get("call") == "s"][-1]
    assert (True, {"unavailable"}, ("error", "unavailable"), 1) == (
        len(refs) > 0 and refs == [f"g{i}" for i in range(len(refs))],
        codes,
        (last_s["event"], last_s["data"]["code"]),
        code,
    )


def test_the_drain_timeout_covers_calls_still_waiting_for_a_slot(
    bridge_of: Callable[..., BridgeProcess],
) -> None:
    """--max-calls 1 --drain-timeout 1: at the end of input an endless stream runs and a
    call waits behind it; both end with error{timeout} and the bridge exits 1."""
    bridge = bridge_of("--max-calls", "1", "--drain-timeout", "1")
    bridge.until(lambda f: f["event"] == "auth.ok")
    bridge.send(endless("a"))
    bridge.until(lambda f: f.get("call") == "a")
    bridge.send({"type": "call", "id": "b", "capability": "echo@1.0"})
    bridge.close_input()
    frames = bridge.rest()
    ends = {
        call: [(f["event"], f["data"].get("code")) for f in frames if f.get("call") == call][-1]
        for call in ("a", "b")
    }
    assert ({"a": ("error", "timeout"), "b": ("error", "timeout")}, 1) == (ends, bridge.wait())
