"""``pubsub.publish@1.0`` (spec §2.1, §6.4): publish through the bus.

The same publish as ``POST /pubsub/v1/topics/{topic}/messages``, through the same
:meth:`~hearthnet.pubsub.service.PubSub.publish`: the caller's access rules (spec §6.9,
a token's ``pub:`` scope), payload size and rate limit are checked for the *caller*,
whoever it is, and the answer comes once the message is durable. The message's
``sender`` is the caller; its origin is the node that runs the call.
"""

from __future__ import annotations

from typing import Any

from hearthnet.bus.capability import CallContext
from hearthnet.bus.descriptor import CapabilityDescriptor
from hearthnet.pubsub.envelope import MAX_TTL_S
from hearthnet.pubsub.service import PubSub
from hearthnet.pubsub.topics import MAX_BYTES as MAX_TOPIC_BYTES

DEFAULT_TYPE = "message"


class PubSubPublish:
    """``pubsub.publish@1.0``: input ``{"topic", "data", "type"?, "ttl_s"?}`` ->
    ``{"topic", "id", "seq", "origin_seq", "ts"}``."""

    descriptor = CapabilityDescriptor(
        name="pubsub.publish",
        version="1.0",
        request_schema={
            "type": "object",
            "required": ["topic", "data"],
            "properties": {
                "topic": {"type": "string", "minLength": 1, "maxLength": MAX_TOPIC_BYTES},
                "type": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,64}$"},
                "data": {},
                "ttl_s": {"type": "integer", "minimum": 1, "maximum": MAX_TTL_S},
            },
            "additionalProperties": False,
        },
        response_schema={
            "type": "object",
            "required": ["topic", "id", "seq", "origin_seq", "ts"],
            "properties": {
                "topic": {"type": "string"},
                "id": {"type": "string"},
                "seq": {"type": "integer"},
                "origin_seq": {"type": "integer"},
                "ts": {"type": "integer"},
            },
        },
        max_concurrent=256,
        description="Publish a message to a topic, as the caller (its access rules apply).",
        check_on_first_call=True,  # a constant: checked by the tests
    )

    def __init__(self, pubsub: PubSub) -> None:
        self._pubsub = pubsub

    async def call(self, ctx: CallContext, value: Any) -> dict[str, Any]:
        """Publish for the caller; returns once the message is durable (spec §6.4).

        Raises:
            Forbidden: the access rules do not let the caller publish there.
            RateLimited, PayloadTooLarge, BadRequest: as for any publish.
        """
        stored = await self._pubsub.publish(
            ctx.caller,
            value["topic"],
            value.get("type", DEFAULT_TYPE),
            value["data"],
            value.get("ttl_s"),
        )
        msg = stored.message
        return {
            "topic": msg.topic,
            "id": msg.id,
            "seq": stored.seq,
            "origin_seq": msg.origin_seq,
            "ts": msg.ts,
        }
