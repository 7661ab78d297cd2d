"""Shared pieces of the llm.chat tests: tools, a caller-identity capability, raw frames."""

from __future__ import annotations

from typing import Any

from hearthnet.bus.capability import CallContext
from hearthnet.bus.descriptor import CapabilityDescriptor
from hearthnet.clock import now_ms
from hearthnet.identity import KeyPair
from hearthnet.ids import new_ulid

LOOKUP = {
    "name": "lookup",
    "description": "Look something up in the community's notes.",
    "parameters": {
        "type": "object",
        "properties": {"q": {"type": "string"}},
        "required": ["q"],
        "additionalProperties": False,
    },
}
CLOCK = {"name": "clock", "description": "The time.", "parameters": {"type": "object"}}
USER = {"role": "user", "content": "How do I make water safe to drink?"}
# The demo model's script for one round of LOOKUP: a tool call, then an answer with its result.
LOOKUP_SCRIPT = [
    {"text": "Looking it up. ", "tool_calls": [{"name": "lookup", "arguments": {"q": "water"}}]},
    {"text": "Found: {results}"},
]


class WhoAmI:
    """``test.whoami@1.0``: answers with the identity the bus authenticated."""

    descriptor = CapabilityDescriptor(name="test.whoami", version="1.0")

    async def call(self, ctx: CallContext, value: Any) -> dict[str, Any]:
        """Who called, and with what."""
        return {"identity": ctx.caller.identity, "got": value}


def llm_call_frame(
    keys: KeyPair, community: str, value: Any, params: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The signed first frame of an llm.chat@2.0 WebSocket, built by hand."""
    body: dict[str, Any] = {"input": value}
    if params is not None:
        body["params"] = params
    envelope = {
        "body": body,
        "capability": "llm.chat",
        "version": "2.0",
        "request_id": new_ulid(),
        "from": keys.node_id,
        "community": community,
        "ts": now_ms(),
    }
    return {"type": "call", "envelope": envelope, "signature": keys.sign_object(envelope)}
