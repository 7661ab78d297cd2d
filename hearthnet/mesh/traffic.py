"""What flows on the links once they are up (spec §7.3–7.5): each frame parsed into its
typed form, fed to the pure core it belongs to, and the core's actions carried out.

The cores are :class:`~hearthnet.mesh.gossip.Gossip` (msg, batch, ihave, iwant, commits;
its glue is :class:`~hearthnet.mesh.gossip_traffic.GossipTraffic`),
:class:`~hearthnet.mesh.flood.PresenceFlood` and :class:`~hearthnet.mesh.flood.MembershipFlood`,
:class:`~hearthnet.mesh.health.LinkHealth` (ping, pong) and
:class:`~hearthnet.mesh.remote.RemoteCalls` (call, frame, ack, tool_result, cancel, caps).
Frames go out through :class:`~hearthnet.mesh.routing.Routes`, never to a link directly,
except the answer to a frame, which goes back on the path it came on. Handlers see a
:class:`~hearthnet.mesh.routing.PeerPath` (a direct link today, a relayed path later).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from hearthnet.community import MembershipRecord
from hearthnet.errors import HearthNetError
from hearthnet.membership import Admission, Membership, Source
from hearthnet.mesh.addresses import PeerBook
from hearthnet.mesh.call_frames import Ack, Call, Cancel, StreamFrame, ToolResult
from hearthnet.mesh.flood import MembershipFlood, PresenceFlood
from hearthnet.mesh.frames import (
    BatchMsgs,
    Bye,
    Caps,
    IHave,
    IWant,
    MembershipBatch,
    Msg,
    Peers,
    Ping,
    Pong,
    Presence,
    parse_frame,
)
from hearthnet.mesh.gossip import Gossip
from hearthnet.mesh.gossip_traffic import GossipTraffic
from hearthnet.mesh.health import LinkHealth
from hearthnet.mesh.remote import RemoteCalls
from hearthnet.mesh.routing import PeerPath, Routes
from hearthnet.metrics import Counter
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.service import PubSub

log = logging.getLogger("hearthnet.mesh")

SubmitRecords = Callable[[list[MembershipRecord], Source, str | None], Awaitable[Admission]]


def _parse_records(raw: list[dict[str, Any]]) -> tuple[list[MembershipRecord], list[str]]:
    """Verify records (a thread's work: a signature check each); errors as messages."""
    parsed, errors = [], []
    for item in raw:
        try:
            parsed.append(MembershipRecord.parse(item))
        except HearthNetError as exc:
            errors.append(str(exc))
    return parsed, errors


class LinkTraffic:
    """Frames in from links, through the cores, actions out.

    Args:
        membership: the records held (membership frames carry only the others).
        submit_records: admits verified records (the node floods on what they add).
        repair_per_round: messages sent per iwant answered.
        message_log: where delivered messages are ingested and repairs read.
        pubsub: presence applied and read; its duplicate counter.
        routes: where frames go out.
        remote: remote calls and capability routes.
        health: pings and pongs.
        book: peer addresses shared with a new link.
        spawn: starts a task in the mesh's task group.
        repaired / sig_failures: counters.
    """

    def __init__(
        self,
        *,
        node_id: str,
        membership: Membership,
        submit_records: SubmitRecords,
        repair_per_round: int,
        message_log: MessageLog,
        pubsub: PubSub,
        routes: Routes,
        remote: RemoteCalls,
        health: LinkHealth,
        book: PeerBook,
        spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]],
        repaired: Counter,
        sig_failures: Counter,
    ) -> None:
        self.membership = membership
        self.submit_records = submit_records
        self.pubsub = pubsub
        self.routes = routes
        self.remote = remote
        self.book = book
        self.spawn = spawn
        self.sig_failures = sig_failures
        self.gossip = Gossip(
            message_log.knows,
            repair_per_round,
            is_member=lambda identity: membership.level_of(identity) is not None,
        )
        self.messages = GossipTraffic(
            gossip=self.gossip,
            message_log=message_log,
            pubsub=pubsub,
            routes=routes,
            health=health,
            spawn=spawn,
            repaired=repaired,
            sig_failures=sig_failures,
        )
        self.presence = PresenceFlood(node_id)
        self.membership_flood = MembershipFlood(membership.caps.per_request)
        self._membership_frames = asyncio.Lock()
        self._handlers: dict[type, Callable[[PeerPath, Any], None]] = {
            Msg: self.messages.msg,
            BatchMsgs: self.messages.batch,
            IHave: self.messages.ihave,
            IWant: self.messages.iwant,
            MembershipBatch: self._membership,
            Presence: self._presence,
            Ping: health.receive_ping,
            Pong: health.receive_pong,
            Caps: self._caps,
            Peers: lambda link, frame: book.learn_exchanged(list(frame.peers), node_id),
            Bye: lambda link, frame: None,  # a bye ends the link in its read loop first
            Call: remote.on_call,
            StreamFrame: remote.on_frame,
            Ack: remote.on_ack,
            ToolResult: remote.on_tool_result,
            Cancel: remote.on_cancel,
        }

    def receive(self, link: PeerPath, frame: dict[str, Any]) -> None:
        """A decoded frame from the peer at the far end of ``link``: parsed into its typed
        form, then handled. A direct link calls this; so does a relayed path (spec §8) for
        the frames it unwraps, with itself as ``link``: answers go back on it.

        Raises:
            BadRequest: the frame is malformed (the link logs it and goes on).
        """
        typed = parse_frame(frame)
        if typed is not None:
            self._handlers[type(typed)](link, typed)

    def greet(self, link: PeerPath) -> None:
        """What a new link gets: every membership record, the addresses we know, the
        capabilities we reach, our local presence and our gossip heads."""
        records = (r.to_json() for r in self.membership.records.values())
        for frame in self.membership_flood.snapshot(records):
            link.send_raw(frame.encode())
        link.send_raw(Peers(tuple(self._addresses_for(link.node))).encode())
        link.send_raw(Caps(tuple(self.remote.announcement(exclude_via=link.node))).encode())
        events = self.pubsub.local_presence("refresh")
        if events:
            link.send_raw(self.presence.start(events).encode())
        self.messages.send_ihave(link)

    def _addresses_for(self, newcomer: str, limit: int = 64) -> list[dict[str, Any]]:
        """What a new link learns of where peers can be dialled: the addresses of the
        peers linked now first, as :meth:`share_address` told the peers linked when they
        came up (one only claimed goes without a NodeID: a node that links after a
        peer's claim, and before our own dial verified it, must hear of it too, or a
        node behind NAT never links a public peer that linked us first), then the
        verified ones that worked, at most ``limit`` in all."""
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        for other in self.routes.links.values():
            address = other.address
            if other.node != newcomer and address is not None and address not in seen:
                seen.add(address)
                out.append(self.book.exchange_entry(address, other.node))
        out.extend(e for e in self.book.urls_for_exchange(limit) if e["url"] not in seen)
        return out[:limit]

    def share_address(self, link: PeerPath, address: str | None) -> None:
        """Tell the other linked peers where the newly linked ``link`` can be dialled
        (spec §7.1 peer exchange). :meth:`greet` shares only what we knew when a link
        came up: without this, a node that links to us later stays unknown to peers
        already linked, and a peer that can only dial out (behind NAT) never links it.
        An address only claimed by the peer (its inbound hello's ``url``) goes without a
        NodeID, so whoever dials it records the node that answers there."""
        if address is None:
            return
        frame = Peers((self.book.exchange_entry(address, link.node),)).encode()
        for other in list(self.routes.links.values()):
            if other.node != link.node:
                other.send_raw(frame)

    def forget(self, node: str, why: str | None = None) -> None:
        """The link to ``node`` went down: its routes go (its calls end, ``why`` their
        error's message), and peers hear if ours changed."""
        self.messages.forget(node)
        if self.remote.forget(node, why):
            self.announce_caps()

    # --- membership and presence --------------------------------------------------------------

    def _membership(self, link: PeerPath, frame: MembershipBatch) -> None:
        admit = self.membership_flood.receive(frame, link.node, self.membership.records)
        if admit is not None:
            self.spawn(self._admit(admit.node, list(admit.records)), "membership")

    async def _admit(self, node: str, raw: list[dict[str, Any]]) -> None:
        """Verify and admit a peer's records off the event loop (spec §1.5: folding never
        stalls other clients); what they add is flooded on by the node."""
        # frames are admitted in arrival order: a later frame may name signers an
        # earlier one added
        async with self._membership_frames:
            parsed, errors = await asyncio.to_thread(_parse_records, raw)
            for error in errors:
                self.sig_failures.inc("membership")
                log.warning("bad membership record from %s: %s", node, error, extra={"peer": node})
            if parsed:
                await self.submit_records(parsed, Source.GOSSIP, node)

    def broadcast_records(self, records: list[MembershipRecord], skip: str | None) -> None:
        """Flood new membership records to every link but ``skip``."""
        self.routes.forward(self.membership_flood.broadcast((r.to_json() for r in records), skip))

    def _presence(self, link: PeerPath, frame: Presence) -> None:
        received = self.presence.receive(frame, link.node)
        if received is None:
            return
        apply, forward = received
        for event in apply.events:
            self.pubsub.apply_remote_presence(event)
        self.routes.forward(forward)

    def local_presence(self, events: list[dict[str, Any]]) -> None:
        """Local members joined, changed or left (or a refresh): flood it."""
        if events and len(self.routes):
            self.routes.forward(self.presence.announce(events))

    def presence_tick(self) -> None:
        """Refresh our local members' presence on every node (remote entries expire)."""
        self.local_presence(self.pubsub.local_presence("refresh"))

    # --- capabilities (spec §7.4) ---------------------------------------------------------------

    def _caps(self, link: PeerPath, frame: Caps) -> None:
        if self.remote.learn(link.node, list(frame.providers)):
            self.announce_caps(skip=link.node)

    def announce_caps(self, skip: str | None = None) -> None:
        """Our capability routes to every link but ``skip`` (split horizon per link)."""
        for link in list(self.routes.links.values()):
            if link.node != skip:
                link.send_raw(Caps(tuple(self.remote.announcement(exclude_via=link.node))).encode())
