"""Client programs the relay scenarios run inside a lab namespace (the test process cannot
reach a node's private address). Each signs as the node whose data dir it is given and
prints one JSON line with what it saw.

    python -m tests.chaos.relay_probe publish URL DATA_DIR TOPIC COUNT
    python -m tests.chaos.relay_probe stream URL DATA_DIR TARGET COUNT WITHIN_S
    python -m tests.chaos.relay_probe chat URL DATA_DIR TARGET WITHIN_S
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from hearthnet.client import Client
from hearthnet.errors import WireError
from hearthnet.identity import load_or_create_keys

LOOKUP = {
    "name": "lookup",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
}
TOOL_SCRIPT = [
    {"text": "Looking it up. ", "tool_calls": [{"name": "lookup", "arguments": {"q": "water"}}]},
    {"text": "Found: {results}"},
]
# long enough that a cancel after a few tokens lands mid-stream
SLOW_SCRIPT = [{"text": " ".join(f"w{i}" for i in range(300)), "token_delay_ms": 20}]
CANCEL_AFTER = 3


async def publish(client: Client, topic: str, count: int) -> dict[str, Any]:
    """``count`` messages ``{"n": i}``, each acknowledged before the next."""
    acked = []
    for n in range(count):
        got = await client.publish(topic, "message", {"n": n})
        acked.append({"n": n, "id": got["id"], "origin_seq": got["origin_seq"]})
    return {"acked": acked}


async def stream(client: Client, target: str, count: int, within_s: float) -> dict[str, Any]:
    """An ``echo.stream`` pinned to ``target``: how it ended, or ``hung`` after ``within_s``."""
    frames = 0
    try:
        async with (
            asyncio.timeout(within_s),
            client.stream("echo.stream@1.0", {"count": count, "size": 64}, target=target) as s,
        ):
            async for frame in s:
                if frame.terminal:
                    return {
                        "frames": frames,
                        "end": frame.event,
                        "code": frame.data.get("code"),
                        "transport": s.transport,
                    }
                frames += 1
    except TimeoutError:
        return {"hung": True, "frames": frames}
    except WireError as exc:  # refused before the first frame: an end too
        return {"frames": 0, "end": "error", "code": exc.code, "transport": None}
    return {"hung": True, "frames": frames, "why": "no terminal frame"}


async def chat(client: Client, target: str, within_s: float) -> dict[str, Any]:
    """A tool loop on ``target`` answered here, then a chat stream cancelled mid-way."""
    asked: list[dict[str, Any]] = []

    def lookup(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        asked.append({"name": name, "arguments": arguments})
        return {"found": f"notes on {arguments.get('q')}"}

    messages = [{"role": "user", "content": "How do I make water safe to drink?"}]
    async with asyncio.timeout(within_s):
        result = await client.chat(
            messages,
            tools=[LOOKUP],
            tool_handler=lookup,
            params={"script": TOOL_SCRIPT},
            target=target,
        )
    tokens = 0
    cancelled_at = ended_at = 0.0
    terminal: list[Any] = []
    async with (
        asyncio.timeout(within_s),
        client.stream(
            "llm.chat@2.0",
            {"messages": messages, "stream": True},
            params={"script": SLOW_SCRIPT},
            target=target,
        ) as s,
    ):
        async for frame in s:
            if frame.event == "token":
                tokens += 1
                if tokens == CANCEL_AFTER:
                    cancelled_at = time.monotonic()
                    await s.cancel()
            if frame.terminal:
                ended_at = time.monotonic()
                terminal = [frame.event, frame.data.get("code")]
        transport = s.transport
    return {
        "chat": {
            "text": result.text,
            "transport": result.transport,
            "tool_rounds": result.tool_rounds,
            "asked": asked,
        },
        "cancel": {
            "transport": transport,
            "tokens": tokens,
            "terminal": terminal,
            "ended_s": round(ended_at - cancelled_at, 3),
        },
    }


async def main(argv: list[str]) -> dict[str, Any]:
    command, url, data_dir, *rest = argv
    async with Client(url, keys=load_or_create_keys(Path(data_dir))) as client:
        if command == "publish":
            return await publish(client, rest[0], int(rest[1]))
        if command == "stream":
            return await stream(client, rest[0], int(rest[1]), float(rest[2]))
        if command == "chat":
            return await chat(client, rest[0], float(rest[1]))
    raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1:]))), flush=True)
