"""Which path reaches which node (spec §7.2, §8). The one place that maps a NodeID to
something a frame can be sent on.

A path is a direct :class:`~hearthnet.mesh.links.PeerLink` or, for a peer reached through
a relay (spec §8), a :class:`~hearthnet.mesh.relayed_link.RelayedLink` kept in the same
table: whatever :meth:`Routes.path_to` returns for a node is what gossip, heartbeats and
remote calls send on. A direct link replaces a relayed one (:meth:`Routes.admit`); that
is how a punched link (the direct upgrade, :mod:`hearthnet.mesh.punching`) takes over.
"""

from __future__ import annotations

from typing import Protocol

from hearthnet.mesh.actions import Forward, ForwardBatch
from hearthnet.mesh.frames import PeerFrame
from hearthnet.mesh.links import PeerLink
from hearthnet.mesh.protocol import PeerInfo, winning_direction
from hearthnet.mesh.relayed_link import REPLACED_BY_DIRECT, is_relayed, path_fields

__all__ = ["REPLACED_BY_DIRECT", "PeerPath", "Routes"]


class PeerPath(Protocol):
    """What the mesh sends frames on: a direct link or a relayed one (spec §8)."""

    @property
    def node(self) -> str:
        """The NodeID at the far end."""

    @property
    def peer(self) -> PeerInfo:
        """Who is at the far end, as its hello said, and the link version it speaks."""

    def send_raw(self, data: bytes) -> bool:
        """Queue an encoded frame; False when it could not be queued."""

    def close(self, reason: str) -> None:
        """End the path."""


class Routes:
    """The direct links of this node, one per peer, and the paths to other nodes.

    Args:
        node_id: this node (simultaneous dials keep the lower NodeID's outbound link).
    """

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self.links: dict[str, PeerLink] = {}

    def __len__(self) -> int:
        return len(self.links)

    def admit(self, link: PeerLink) -> bool:
        """Take an established link; False when it lost to a link already up with the
        same peer (simultaneous dials, spec §7.2: the lower NodeID's outbound link wins;
        the loser is closed by the caller, or here when it was the older one)."""
        existing = self.links.get(link.node)
        # relays (spec §8): a direct link replaces a relayed one, never the other way round
        if existing is not None and (is_relayed(existing) or is_relayed(link)):
            if is_relayed(link):
                return False
            existing.close(REPLACED_BY_DIRECT, send_bye=False)
            existing = self.links.get(link.node)
        if existing is not None:
            outbound_wins = winning_direction(self.node_id, link.node)
            if existing.outbound == outbound_wins or link.outbound != outbound_wins:
                return False
            existing.close("duplicate link")
        self.links[link.node] = link
        return True

    def remove(self, link: PeerLink) -> bool:
        """A link went down; False when it was not the peer's current link (a duplicate
        that lost)."""
        if self.links.get(link.node) is not link:
            return False
        del self.links[link.node]
        return True

    def path_to(self, node: str) -> PeerPath | None:
        """The path a frame for ``node`` goes on, or None when there is none.

        The seam for relays (spec §8): a node with no direct link but a relayed path
        gets that path here.
        """
        return self.links.get(node)

    def path_kind(self, node: str) -> str:
        """``direct``, ``relayed`` or ``upgrading`` (a relayed link being punched)."""
        link = self.links.get(node)
        return "direct" if link is None else str(path_fields(link)["path"])

    def send(self, node: str, frame: PeerFrame) -> bool:
        """Send ``frame`` on the path to ``node``; False when there is none or it is full."""
        path = self.path_to(node)
        return path is not None and path.send_raw(frame.encode())

    def forward(self, forward: Forward) -> None:
        """Send the same bytes on every link but ``forward.skip`` (flooding goes link by
        link; relayed links included: the copy the relay's own flood brings is a
        duplicate the receiver drops). A message with ``data_enc`` skips older links."""
        for link in list(self.links.values()):
            if link.node != forward.skip and (not forward.binary or link.peer.takes_binary):
                link.send_raw(forward.data)

    def forward_batch(self, forward: ForwardBatch) -> None:
        """A whole signed batch to every link but ``forward.skip``: one ``batch`` frame to
        a peer on a v3 link, ``msg`` frames to the others (spec §6.2; each encoded once,
        when the first link needs it), without the messages with ``data_enc`` to a peer
        that does not take them."""
        batch: bytes | None = None
        msgs: dict[bool, list[bytes]] = {}
        for link in list(self.links.values()):
            if link.node == forward.skip:
                continue
            if link.peer.takes_batches:
                if batch is None:
                    batch = forward.batch.encode()
                link.send_raw(batch)
            else:
                binary = link.peer.takes_binary
                if binary not in msgs:
                    msgs[binary] = forward.msgs(binary)
                for data in msgs[binary]:
                    link.send_raw(data)

    def close(self, node: str, reason: str) -> None:
        """End the path to ``node``, if there is one."""
        path = self.path_to(node)
        if path is not None:
            path.close(reason)

    def close_all(self, reason: str) -> None:
        """End every link (shutdown)."""
        for link in list(self.links.values()):
            link.close(reason)
