"""Model backends of ``llm.chat@2.0``: where the model's turns come from (spec §5).

A backend turns a :class:`~hearthnet.bus.toolloop.TurnPlan` (the conversation so far,
the tools, the tool choice) into a stream of backend events: text pieces, tool-call
pieces and one end. It knows nothing of the bus, the transports or the tool loop.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any, Protocol

from hearthnet.bus.toolloop import BackendEvent, TurnPlan


class ChatBackend(Protocol):
    """A source of model turns."""

    name: str

    def check_params(self, params: dict[str, Any]) -> None:
        """Refuse call ``params`` this backend cannot honour (raise a WireError)."""

    def turn(self, plan: TurnPlan, params: dict[str, Any]) -> AsyncGenerator[BackendEvent, None]:
        """Stream one model turn; the last event is a ``TurnEnd``.

        Closing the iterator early (a cancelled call) must release whatever it holds,
        such as the HTTP response from a model server.
        """

    async def aclose(self) -> None:
        """Release long-lived resources (connection pools) at node shutdown."""
