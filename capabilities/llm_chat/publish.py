"""``publish_to`` of ``llm.chat@2.0``: the answer, as it streams, on a pub/sub topic.

The caller names a topic; its text goes there as ``token`` messages
``{"call", "i", "text"}`` and, when the model is done, as one ``message.complete``
``{"call", "role": "assistant", "text", "stop_reason", "tokens_out"}`` (``call`` is the
request id, so watchers can tell concurrent answers apart). Everyone subscribed to the
topic, on any node, watches the answer; a late joiner reads the answer so far from the
log's history.

Model tokens are gathered and published at most every :data:`FLUSH_INTERVAL_S` (and
before any other frame than a token), so a fast model costs a few messages per second,
well inside a token client's publish budget (spec §2.5). The messages are published as
the *caller* (they carry its ``sender``), and only if the caller may publish to the
topic: the node never lends its own rights.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from hearthnet.caller import Caller
from hearthnet.frames import Frame
from hearthnet.pubsub.topics import validate_topic

FLUSH_INTERVAL_S = 0.05


class TopicPublisher(Protocol):
    """What ``publish_to`` needs from pub/sub (the node's :class:`PubSub` is one)."""

    def authorize_publish(self, caller: Caller, topic: str, data: Any) -> None:
        """Raise unless ``caller`` may publish ``data`` to ``topic`` now."""

    def publish(
        self, caller: Caller, topic: object, msg_type: object, data: Any, ttl_s: object = None
    ) -> Awaitable[Any]:
        """Publish durably as ``caller``."""


class AnswerOnTopic:
    """Mirrors one call's stream to a topic (gathers tokens, publishes in order)."""

    def __init__(
        self,
        pubsub: TopicPublisher,
        caller: Caller,
        topic: str,
        call_id: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pubsub = pubsub
        self.caller = caller
        self.topic = topic
        self.call_id = call_id
        self.clock = clock
        self.text: list[str] = []
        self.pending: list[str] = []
        self.published = 0
        self._last_flush = clock()

    def check(self) -> None:
        """Refuse (forbidden, rate_limited...) before the model runs."""
        validate_topic(self.topic)
        self.pubsub.authorize_publish(self.caller, self.topic, {"call": self.call_id, "text": ""})

    async def on_frame(self, frame: Frame) -> None:
        """Take one frame of the caller's stream (in stream order)."""
        if frame.event == "token":
            text = str(frame.data.get("text", ""))
            self.text.append(text)
            self.pending.append(text)
            if self.clock() - self._last_flush >= FLUSH_INTERVAL_S:
                await self.flush()
            return
        await self.flush()
        if frame.event == "done" and frame.data.get("stop_reason") != "tool_calls":
            # over SSE a tool round ends the stream with tool_calls: the answer goes on in
            # the caller's next call, so it is not complete yet
            await self.pubsub.publish(
                self.caller,
                self.topic,
                "message.complete",
                {
                    "call": self.call_id,
                    "role": "assistant",
                    "text": "".join(self.text),
                    "stop_reason": frame.data.get("stop_reason"),
                    "tokens_out": frame.data.get("tokens_out"),
                },
            )

    async def flush(self) -> None:
        """Publish the gathered tokens as one ``token`` message."""
        self._last_flush = self.clock()
        if not self.pending:
            return
        text, self.pending = "".join(self.pending), []
        self.published += 1
        await self.pubsub.publish(
            self.caller,
            self.topic,
            "token",
            {"call": self.call_id, "i": self.published, "text": text},
        )
