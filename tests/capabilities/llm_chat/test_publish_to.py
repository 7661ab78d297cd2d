"""llm.chat@2.0 with publish_to (docs/browser.md): the answer also goes to a topic, as the
caller, only where the caller may publish."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from hearthnet.client import Client
from hearthnet.node import Node
from tests.capabilities.llm_chat.support import USER
from tests.conftest import MakeConfig
from tests.helpers import token_for

SCRIPT = [{"text": "Boil it for one minute, then let it cool."}]


@pytest.fixture
async def node(make_config: MakeConfig) -> AsyncIterator[Node]:
    """A node with the demo model."""
    async with Node(make_config(llm={"demo": True})) as n:
        yield n


async def _chat(client: Client, topic: str) -> list[Any]:
    value = {"messages": [USER], "stream": True, "publish_to": topic}
    params = {"backend": "demo", "script": SCRIPT}
    async with asyncio.timeout(10), client.stream("llm.chat@2.0", value, params=params) as s:
        return [frame async for frame in s]


async def test_answer_streams_to_the_topic(node: Node) -> None:
    """Tokens arrive on the topic as token messages and end with one message.complete
    holding the whole answer, sent by the caller; the caller's own stream is unchanged."""
    token = token_for(node, "pub:chat.**", "sub:chat.**", "call:llm.chat@2")
    async with Client(node.url, token=token) as client:
        frames = await _chat(client, "chat.room.kitchen")
        page = await client.history("chat.room.kitchen", limit=500)
    messages = [m["data"] for m in page["messages"]]
    streamed = "".join(f.data["text"] for f in frames if f.event == "token")
    tokens = [m for m in messages if m["type"] == "token"]
    complete = [m for m in messages if m["type"] == "message.complete"]
    call_ids = {m["data"]["call"] for m in messages}
    assert (
        SCRIPT[0]["text"],
        SCRIPT[0]["text"],
        list(range(1, len(tokens) + 1)),
        ["assistant"],
        [SCRIPT[0]["text"]],
        1,
        {"token"},
        "done",
    ) == (
        streamed,
        "".join(m["data"]["text"] for m in tokens),
        [m["data"]["i"] for m in tokens],
        [m["data"]["role"] for m in complete],
        [m["data"]["text"] for m in complete],
        len(call_ids),
        {m["sender"]["kind"] for m in messages},
        frames[-1].event,
    )


async def test_refused_where_the_caller_may_not_publish(node: Node) -> None:
    """A caller without publish rights to the topic gets forbidden before the model runs:
    no token frame, nothing on the topic."""
    token = token_for(node, "sub:chat.**", "call:llm.chat@2")
    async with Client(node.url, token=token) as client:
        frames = await _chat(client, "chat.room.kitchen")
    async with Client(node.url, keys=node.keys) as owner:
        listed = await owner.request_json("GET", "/pubsub/v1/topics")
    assert ([("error", "forbidden")], []) == (
        [(f.event, f.data.get("code")) for f in frames],
        listed["topics"],
    )
