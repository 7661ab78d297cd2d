"""What a capability is, and what its handler sees of a call.

A capability is a plain object with a ``descriptor`` and either an async ``call``
(non-streaming) or an async-generator ``stream`` (streaming). It is registered with
the bus; it knows nothing of HTTP, SSE or WebSocket, so one handler runs unchanged on
every transport (spec §3.4) and on every node of the mesh.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, runtime_checkable

from hearthnet.bus.descriptor import CapabilityDescriptor
from hearthnet.bus.envelope import VerifiedCall
from hearthnet.caller import Caller
from hearthnet.errors import BadRequest, Cancelled, DeadlineExceeded
from hearthnet.frames import Frame

MAX_PENDING_TOOL_RESULTS = 16


@runtime_checkable
class Capability(Protocol):
    """A capability offered on the bus."""

    descriptor: CapabilityDescriptor


@runtime_checkable
class UnaryCapability(Capability, Protocol):
    """A capability that answers with one output object."""

    async def call(self, ctx: CallContext, value: Any) -> Any:
        """Compute the output for ``value`` (already schema-validated)."""


@runtime_checkable
class StreamingCapability(Capability, Protocol):
    """A capability that answers with a stream of frames."""

    def stream(self, ctx: CallContext, value: Any) -> AsyncIterator[Frame]:
        """Yield frames; a final ``done``/``error`` is optional (the bus adds ``done``)."""


class CallContext:
    """The handler's view of one call: who, deadline, and the upstream channel.

    ``inline_tools`` is true when the transport can carry ``tool_result`` frames back
    to a running handler (WebSocket, or a peer link); over SSE it is false and a tool
    loop ends its stream with ``done{stop_reason:"tool_calls"}`` instead (spec §5).
    """

    def __init__(
        self, call: VerifiedCall, *, node_id: str, deadline: float, inline_tools: bool
    ) -> None:
        self.call = call
        self.node_id = node_id
        self.deadline = deadline  # time.monotonic() seconds
        self.inline_tools = inline_tools
        self.cancelled = False
        # Set by a remote provider: tool results are forwarded instead of awaited here.
        self.forward_tool_result: Callable[[str, Any], None] | None = None
        self._waiting: dict[str, asyncio.Future[Any]] = {}
        self._closed_ids: set[str] = set()

    @property
    def caller(self) -> Caller:
        """The authenticated caller."""
        return self.call.caller

    @property
    def params(self) -> dict[str, Any]:
        """The call's ``params`` object."""
        return self.call.envelope.params

    @property
    def request_id(self) -> str:
        """The caller's request id (log it)."""
        return self.call.request_id

    def remaining_s(self) -> float:
        """Seconds until the call's deadline (may be negative)."""
        return self.deadline - time.monotonic()

    def expect_tool_result(self, tool_call_id: str) -> asyncio.Future[Any]:
        """Register a tool call the handler will wait for; returns its future."""
        if len(self._waiting) >= MAX_PENDING_TOOL_RESULTS:
            raise BadRequest("too many tool calls waiting")
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[tool_call_id] = fut
        return fut

    async def tool_result(self, tool_call_id: str, timeout_s: float) -> Any:
        """Wait for the client's ``tool_result`` for an expected id.

        Raises:
            DeadlineExceeded: no result within ``timeout_s``.
        """
        fut = self._waiting.get(tool_call_id) or self.expect_tool_result(tool_call_id)
        try:
            async with asyncio.timeout(timeout_s):
                return await fut
        except TimeoutError as exc:
            raise DeadlineExceeded(
                f"no tool result for {tool_call_id} within {timeout_s:g} s"
            ) from exc
        finally:
            self._waiting.pop(tool_call_id, None)
            self._closed_ids.add(tool_call_id)

    def deliver_tool_result(self, tool_call_id: object, body: Any) -> None:
        """Hand a client's ``tool_result`` to the waiting handler.

        Raises:
            BadRequest: no tool call with that id is waiting (unknown, answered, or too late).
            Cancelled: the call was already cancelled.
        """
        if self.cancelled:
            raise Cancelled("the call was cancelled")
        if not isinstance(tool_call_id, str):
            raise BadRequest("tool_call_id must be a string")
        if self.forward_tool_result is not None:
            # the call runs on another node: the result travels the call's path (spec §7.4)
            self.forward_tool_result(tool_call_id, body)
            return
        fut = self._waiting.get(tool_call_id)
        if fut is None or fut.done():
            # A done future not yet collected by its waiter was answered a moment ago.
            answered = fut is not None or tool_call_id in self._closed_ids
            state = "already answered or timed out" if answered else "unknown"
            raise BadRequest(f"tool_call_id {tool_call_id[:64]!r} is {state}")
        fut.set_result(body)

    def cancel(self) -> None:
        """Mark cancelled and end every pending tool wait (the handler task is cancelled too)."""
        self.cancelled = True
        for fut in self._waiting.values():
            fut.cancel()
        self._waiting.clear()
