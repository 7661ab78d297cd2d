"""A member's link to a peer it reaches only through a relay (spec §8).

:class:`RelayedLink` offers what the mesh uses of a :class:`~hearthnet.mesh.links.PeerLink`
(``node``, ``send``/``send_raw``, ``close``, ``outbound``), so gossip, anti-entropy,
membership, presence, heartbeats and remote calls run over it unchanged. Its frames do
not go to a socket: ``send_raw`` hands them to the member's path core (numbered, sealed
end to end, carried in ``route`` frames through the relay; see
:mod:`hearthnet.mesh.relaying`), and frames the path core delivers come back through the
mesh's frame dispatch like frames read from a socket.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiohttp

from hearthnet.mesh.links import FrameHandler, LinkErrors, PeerLink
from hearthnet.mesh.protocol import LinkState, PeerInfo, encode_frame

REPLACED_BY_DIRECT = "a direct link is up"  # why a relayed link closed for a direct one
SHUTTING_DOWN = "node shutting down"  # why every link closes when the node stops
# why a relayed link closed while its path goes on: the peer opened a new session, so it
# had ended its own link and the calls on it (path_switch.py)
PEER_RENEWED = "the peer opened a new relayed session"


class _NoSocket:
    """The socket slot of a relayed link: there is none; the relay's link carries it."""

    closed = True

    async def send_bytes(self, data: bytes) -> None:
        """Never called: a relayed link's frames go to the path core."""
        raise RuntimeError("a relayed link has no socket")

    async def receive(self, timeout: float | None = None) -> aiohttp.WSMessage:  # noqa: ASYNC109
        """Never called: a relayed link's frames come from the path core."""
        raise RuntimeError("a relayed link has no socket")

    async def close(self, *, code: int = 1000, message: bytes = b"") -> bool:
        """Nothing to close."""
        return False


class RelayedLink(PeerLink):
    """The link to ``peer`` through relay ``via`` (the path core may move it to another
    relay; ``via`` follows)."""

    def __init__(
        self,
        peer: PeerInfo,
        via: str,
        *,
        outbound: bool,
        transmit: Callable[[str, bytes], bool],
        on_frame: FrameHandler,
        on_down: Callable[[PeerLink, str], None],
        errors: LinkErrors,
        successor: Callable[[str], PeerLink | None] = lambda node: None,
    ) -> None:
        super().__init__(
            peer, _NoSocket(), outbound=outbound, on_frame=on_frame, on_down=on_down, errors=errors
        )
        self.via = via
        self.upgrading = False  # a direct upgrade (hole punching) is under way
        self._transmit = transmit
        self._successor = successor  # the peer's current link (a direct one replaces us)

    def send_raw(self, data: bytes) -> bool:
        """Hand one encoded frame to the path core; False (and the link closes) when the
        peer has stopped acknowledging what it was sent. Once a direct link replaced this
        one, frames still sent here (a call's replies) go on the peer's current link: the
        direct one, or the relayed one that took its place when it died within the
        switch (path_switch.py)."""
        if self.state is not LinkState.UP:
            nxt = self._successor(self.node) if self.down_reason == REPLACED_BY_DIRECT else None
            if nxt is None or nxt is self:
                return False
            return nxt.send_raw(data)
        if self._transmit(self.node, data):
            return True
        self.close("the relayed peer stopped acknowledging frames", send_bye=False)
        return False

    @property
    def queued(self) -> int:
        """Frames waiting here: none (they wait, bounded, in the path core)."""
        return 0

    def close(self, reason: str, *, send_bye: bool = True) -> None:
        """End the link at once (a ``bye`` goes through the relay first, if asked)."""
        if self.state is not LinkState.UP:
            return
        if send_bye:
            self._transmit(self.node, encode_frame("bye", code="closing", reason=reason[:200]))
        self.down_reason = reason
        self._to(LinkState.CLOSING)
        self._to(LinkState.DOWN)
        self.on_down(self, reason)

    async def run(self) -> None:
        """Not used: a relayed link is driven by its relay's link."""
        raise RuntimeError("a relayed link runs inside the relay's link")


def path_fields(link: PeerLink) -> dict[str, Any]:
    """``path`` and ``via`` of a linked peer, for ``hearthnet peers`` (spec §8)."""
    if isinstance(link, RelayedLink):
        return {"path": "upgrading" if link.upgrading else "relayed", "via": link.via}
    return {"path": "direct", "via": None}


def observed_address(link: PeerLink) -> str | None:
    """The address a direct link's socket is connected to (``ip:port``, ``[ip6]:port``),
    as this node sees it: for a punched link or one behind NAT, the public address the
    link really uses, not the URL the peer claims. None on a relayed path, or once the
    socket is gone."""
    if isinstance(link, RelayedLink):
        return None
    extra = getattr(link.ws, "get_extra_info", None)
    peer = extra("peername") if callable(extra) else None
    if not isinstance(peer, tuple) or len(peer) < 2:
        return None
    host, port = str(peer[0]), peer[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_relayed(link: PeerLink | None) -> bool:
    """True for a link through a relay."""
    return isinstance(link, RelayedLink)


def record_path(link: PeerLink | None) -> dict[str, Any]:
    """``path`` and ``via`` for heartbeat records and beacons (spec §7.5 spells a relayed
    path ``relay``, as the mesh-health job reads it)."""
    if isinstance(link, RelayedLink):
        return {"path": "relay", "via": link.via}
    return {"path": "direct", "via": None}
