"""A member's attachments to its relays (spec §8): attach, detach, keepalive, silence.

The relays are linked as ordinary peers; once a relay's link is admitted it is sent
``attach``, and its ``attached`` answer (with the address the relay observed, our direct
upgrade's candidate) puts it in the path core. While attached, every relay is kept alive
(:mod:`hearthnet.mesh.relay_keepalive`); a relay that went silent, detached us or whose
link ended is lost, and the path core moves its peers to another attached relay. The path
core's :class:`~hearthnet.mesh.relay_choice.AttachRelay` and
:class:`~hearthnet.mesh.relay_choice.DetachRelay` are carried out here too.
"""

from __future__ import annotations

import logging
from collections import Counter as Tally
from collections.abc import Callable, Mapping

from hearthnet.clock import now_ms
from hearthnet.mesh.addresses import PeerBook
from hearthnet.mesh.linkread import abort
from hearthnet.mesh.links import PeerLink
from hearthnet.mesh.pacing import Budget
from hearthnet.mesh.paths import Action, PathCore
from hearthnet.mesh.protocol import encode_frame
from hearthnet.mesh.relay_choice import AttachRelay, DetachRelay
from hearthnet.mesh.relay_frames import Attach, Attached, Detach
from hearthnet.mesh.relay_keepalive import KeepaliveConfig, RelayKeepalive
from hearthnet.mesh.relayed_link import is_relayed

log = logging.getLogger("hearthnet.mesh.relaying")


class RelayAttachments:
    """The relays this member attaches to and how it notices losing one; the relaying glue
    feeds it their links, their ``attached`` and ``detach`` frames and the clock, and it
    hands the path core's answers to ``carry``."""

    def __init__(
        self,
        *,
        links: Mapping[str, PeerLink],  # our links and relays of federated communities
        paths: PathCore,
        keepalive: KeepaliveConfig,
        counts: Tally[str],
        carry: Callable[[list[Action]], None],
        candidate: Callable[[str | None], str | None],
        book: PeerBook | None = None,
    ) -> None:
        self.links = links
        self.paths = paths
        self.carry = carry  # the path core's actions, carried out by the relaying glue
        self.candidate = candidate  # a relay's observed address -> our punch candidate
        self.counts = counts  # shared with the relaying glue (relays_silent)
        self.book = book  # where the relays' URLs wait for their next dial
        self.relays: set[str] = set()  # NodeIDs of the configured relays, once linked
        # spec §8 failover: a relay that dies silently (no RST) is noticed in seconds
        self.keepalive = RelayKeepalive(keepalive)
        self._silenced: set[str] = set()  # relays lost to silence whose link is still closing
        # a relay this node federates with (its relay role's peer): never attached to as a
        # member, whatever URL brought it (it refuses ``attach`` on a federated link)
        self.federates: Callable[[str], bool] = lambda node: False

    def linked(self, link: PeerLink, *, ours: bool) -> None:
        """A direct link was admitted: attach when it goes to one of our relays (``ours``:
        dialled at a relay's URL; or a relay already known by its NodeID); never to a
        relay this node federates with."""
        if self.federates(link.node):
            self.relays.discard(link.node)  # known as our relay before it was verified
            return
        if ours or link.node in self.relays:
            self.relays.add(link.node)
            link.send_raw(Attach(now_ms()).encode())

    def found(self, urls: tuple[str, ...]) -> None:
        """Attach to the relays linked at another of their addresses than ``urls`` (the
        relay URLs): a node knows its relay under several (the URL it was given, often a
        name, and the IP or ``https://`` address peers told it), dials them all and keeps
        the first link up. The relay is the node our own dial found at a relay URL: in
        this run (a dial that found it linked already, dropped as a duplicate) or an
        earlier one."""
        if self.book is None:
            return
        for url in urls:
            node = self.book.verified_node(url)
            link = self.links.get(node) if node is not None else None
            if link is not None and node not in self.relays and not is_relayed(link):
                log.info("relay %s is linked at %s, not %s: attaching", node, link.address, url)
                self.linked(link, ours=True)

    def unlinked(self, link: PeerLink, now: float) -> None:
        """A direct link ended: losing one of our relays moves its peers (once: a relay
        lost to silence already moved them)."""
        if link.node not in self.relays:
            return
        self.keepalive.forget(link.node)
        if link.node in self._silenced:  # already lost to silence (see _silent)
            self._silenced.discard(link.node)
        else:
            self._lost(link.node, now)

    def attached(self, link: PeerLink, frame: Attached, now: float) -> None:
        """One of our relays answered ``attach``: peers may go through it now."""
        if link.node not in self.relays or frame.relay != link.node:
            return
        rtt = max(0, now_ms() - frame.ts_echo) / 1000 if frame.ts_echo is not None else 1.0
        log.info("attached to relay %s (rtt %.1f ms)", link.node, rtt * 1000)
        # spec §8: the observed address, with the port we listen and punch on, is the
        # candidate a direct upgrade offers (none: no upgrade is tried)
        ours = self.candidate(frame.observed_addr)
        # spec §8 budgets: pace to what it grants (its ``budget`` frame refines it), from
        # the first frame on: peers waiting for a relay go through it at once
        self.paths.pacer.grant(link.node, frame.bytes_per_s, None, now)
        self.carry(self.paths.relay_attached(link.node, ours, rtt, now))
        self.keepalive.watch(link.node, link.frames_in, now)

    def budget(self, link: PeerLink, frame: Budget, now: float) -> None:
        """One of our relays says what it holds us to now: we pace to that."""
        if link.node in self.relays:
            self.paths.pacer.grant(link.node, frame.bytes_per_s, frame.burst, now)

    def detached(self, link: PeerLink, frame: Detach, now: float) -> None:
        """One of our relays detached us: its peers move to another relay."""
        log.info("relay %s detached us: %s", link.node, frame.code or frame.reason)
        self.keepalive.forget(link.node)
        self._lost(link.node, now)

    def _lost(self, relay: str, now: float) -> None:
        """``relay`` is lost: its peers move to another attached relay, and our other
        relays not linked now are dialled at once, their backoff forgotten (spec §8
        failover: the first try at another relay waits for nothing)."""
        self.carry(self.paths.relay_lost(relay, now))
        if self.book is not None:
            self.book.retry_now(self.relays - {relay} - set(self.links), now)

    def act(self, action: AttachRelay | DetachRelay) -> None:
        """Attach to or detach from a relay, as the path core's relay choice asks."""
        link = self.links.get(action.relay)
        if link is None or is_relayed(link):
            return  # to attach, the mesh redials the relay's URL; linked() attaches then
        frame: Attach | Detach = (
            Attach(now_ms())
            if isinstance(action, AttachRelay)
            else Detach(reason="a closer relay is attached")
        )
        link.send_raw(frame.encode())

    def tick(self, now: float) -> None:
        """Keepalives to the attached relays; a relay silent too long is lost."""
        frames: dict[str, int] = {}
        for relay in self.keepalive.watched:
            link = self.links.get(relay)
            if link is not None and not is_relayed(link):
                frames[relay] = link.frames_in
        due = self.keepalive.tick(now, frames)
        if self.keepalive.stalls:  # our loop stood still: not the relays' silence
            self.counts["keepalive_stalls"] = self.keepalive.stalls
        for relay in due.ping:  # the relay answers pong: news enough
            self.links[relay].send_raw(encode_frame("ping", seq=0, ts=now_ms()))
        for relay in due.silent:
            self._silent(relay, now)

    def _silent(self, relay: str, now: float) -> None:
        """Nothing came from ``relay`` for ``mesh.relay_silence_s`` although it was
        pinged: its peers move to another relay now, and its link is dropped at once,
        with no closing handshake a silent relay would not answer (the mesh dials it
        again when due: at once, as a link that went down)."""
        log.warning(
            "relay %s silent for %.1f s; its peers move to another relay",
            relay,
            self.keepalive.config.silence_s,
            extra={"peer": relay},
        )
        self.counts["relays_silent"] += 1
        self._lost(relay, now)
        link = self.links.get(relay)
        if link is not None and not is_relayed(link):
            self._silenced.add(relay)
            link.close("the relay went silent", send_bye=False)
            abort(link.ws)
