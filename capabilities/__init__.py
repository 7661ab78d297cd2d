"""Built-in capabilities offered by every node (spec §2.1)."""

from __future__ import annotations

from capabilities.echo import Echo, EchoStream
from hearthnet.bus.capability import Capability


def builtin_capabilities() -> list[Capability]:
    """The capabilities a node offers with no configuration."""
    return [Echo(), EchoStream()]
