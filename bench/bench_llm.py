"""LLM tool-loop benchmark (spec §5): a 3-round tool loop over WebSocket vs SSE.

The node is started by the CLI with ``--llm-demo``. The demo model answers from a
script at once, so what is measured is what the node and the transport add to a tool
round, not a model's speed:

- **per round**: WebSocket, from sending the ``tool_result`` on the open socket to the
  first frame of the model's next turn; SSE, from starting the re-call (signing, HTTP
  request on a keep-alive connection, authentication, history check) to its first frame;
- **per conversation**: the whole loop (3 tool rounds and the answer) through
  ``client.chat``, with the number of llm.chat calls and HTTP requests it took;
- **node CPU** per conversation (from /proc), so client cost is not mistaken for node cost.

WS and SSE conversations alternate so load drift hits both alike.

Run: python -m bench.bench_llm [--conversations 200]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import uvloop

from bench.common import proc_cpu_s, save, self_cpu_s, start_node, summarize_latencies
from hearthnet.bus.transcript import Transcript
from hearthnet.client import Client
from hearthnet.identity import load_or_create_keys

ROUNDS = 3
STEP = {
    "name": "step",
    "description": "Do one step.",
    "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
}
SCRIPT = [
    {"text": f"Working on step {n} now.", "tool_calls": [{"name": "step", "arguments": {"n": n}}]}
    for n in range(1, ROUNDS + 1)
] + [{"text": "All three steps are done: {results}"}]
USER = {"role": "user", "content": "Do the three steps."}
PARAMS = {"backend": "demo", "script": SCRIPT}


def value(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The llm.chat input for a conversation so far."""
    return {"messages": messages, "tools": [STEP], "stream": True}


def step_result(n: Any) -> dict[str, Any]:
    """The instant tool."""
    return {"step": n, "ok": True}


async def ws_rounds(client: Client) -> list[float]:
    """One conversation over one WebSocket; seconds from each tool_result to the next frame."""
    rounds: list[float] = []
    sent: float | None = None
    async with client.stream("llm.chat@2.0", value([USER]), params=PARAMS) as stream:
        async for frame in stream:
            if sent is not None:
                rounds.append(time.perf_counter() - sent)
                sent = None
            if frame.event == "tool_call":
                await stream.send_tool_result(
                    frame.data["id"], step_result(frame.data["arguments"]["n"])
                )
                sent = time.perf_counter()
            if frame.terminal:
                assert frame.event == "done", frame.data
                break
    assert len(rounds) == ROUNDS, rounds
    return rounds


async def sse_rounds(client: Client) -> list[float]:
    """One conversation as SSE re-calls; seconds from starting each re-call to its first frame."""
    transcript = Transcript([USER])
    rounds: list[float] = []
    for call in range(ROUNDS + 1):
        started = time.perf_counter()
        first: float | None = None
        calls = []
        async with client.stream(
            "llm.chat@2.0", value(transcript.messages), params=PARAMS, prefer_ws=False
        ) as stream:
            async for frame in stream:
                if first is None:
                    first = time.perf_counter() - started
                tool_call = transcript.feed(frame)
                if tool_call is not None:
                    calls.append(tool_call)
                if frame.terminal:
                    assert frame.event == "done", frame.data
                    break
        if call:
            assert first is not None
            rounds.append(first)
        for tc in calls:
            transcript.record_result(tc.id, step_result(tc.arguments["n"]))
        if calls:
            transcript.close_round()
    assert len(rounds) == ROUNDS, rounds
    return rounds


async def chat_once(client: Client, prefer_ws: bool) -> tuple[float, int]:
    """One whole conversation through client.chat: (seconds, llm.chat calls)."""
    started = time.perf_counter()
    result = await client.chat(
        [USER],
        tools=[STEP],
        tool_handler=lambda name, args: step_result(args["n"]),
        params=PARAMS,
        prefer_ws=prefer_ws,
    )
    assert (result.tool_rounds, result.stop_reason) == (ROUNDS, "end"), result
    return time.perf_counter() - started, result.calls


async def run(conversations: int) -> dict[str, Any]:
    """Start the node, warm up, measure both transports, stop the node."""
    node = start_node("--llm-demo")
    try:
        keys = load_or_create_keys(node.data_dir)
        async with Client(node.url, keys=keys) as client:
            for _ in range(20):  # warm up: imports, JIT-free caches, connection pool
                await ws_rounds(client)
                await sse_rounds(client)
            out: dict[str, Any] = {"node_ready_s": round(node.ready_s, 3)}
            per_round: dict[str, list[float]] = {"ws": [], "sse": []}
            node_cpu = {"ws": 0.0, "sse": 0.0}
            client_cpu = {"ws": 0.0, "sse": 0.0}
            for _ in range(conversations):
                for name, fn in (("ws", ws_rounds), ("sse", sse_rounds)):
                    cpu0, me0 = proc_cpu_s(node.pid), self_cpu_s()
                    per_round[name] += await fn(client)
                    node_cpu[name] += proc_cpu_s(node.pid) - cpu0
                    client_cpu[name] += self_cpu_s() - me0
            whole: dict[str, list[float]] = {"ws": [], "sse": []}
            calls: dict[str, int] = {}
            for _ in range(conversations):
                for name in ("ws", "sse"):
                    seconds, made = await chat_once(client, prefer_ws=name == "ws")
                    whole[name].append(seconds)
                    calls[name] = made
        for name in ("ws", "sse"):
            out[name] = {
                "per_round": summarize_latencies(per_round[name]),
                "conversation_client_chat": summarize_latencies(whole[name]),
                "llm_chat_calls_per_conversation": calls[name],
                "http_requests_per_conversation": 1 if name == "ws" else ROUNDS + 1,
                "node_cpu_ms_per_conversation": round(node_cpu[name] / conversations * 1000, 3),
                "client_cpu_ms_per_conversation": round(client_cpu[name] / conversations * 1000, 3),
            }
        out["rounds"] = ROUNDS
        out["conversations"] = conversations
        out["sse_over_ws_per_round_p50"] = round(
            out["sse"]["per_round"]["p50_ms"] / out["ws"]["per_round"]["p50_ms"], 2
        )
        return out
    finally:
        node.stop()


def main() -> None:
    """Parse flags, run, save bench/results/llm.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=200)
    args = parser.parse_args()
    result = uvloop.run(run(args.conversations))
    save("llm", result)


if __name__ == "__main__":
    main()
