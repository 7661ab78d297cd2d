"""A relayed link turning direct, in order (spec §8: "the link moves to the direct path with
no frame lost or duplicated"): glue around :class:`~hearthnet.mesh.paths.PathCore`.

When a direct link to a peer replaces its relayed one (a punch, a dial, or the peer
dialling us), frames may still be on the relayed path. The switch:

1. ``drain {upto}`` goes through the relay after the last frame the relayed path carried
   (:meth:`PathCore.direct_up`); frames the relay lost are resent once its answer shows it.
2. Until the peer has acknowledged every frame of the relayed sequence, what the mesh sends
   on the new direct link continues that sequence (``pframe`` on the direct link, through
   the link's ``sequencer``), so the peer hands frames on in the order they were sent,
   whichever path brought them; heartbeats go plainly.
3. Then the direct link carries plain frames: everything before them has been delivered.
   Call frames too: what a fall-back must resend of a call (its opening, acks, reply
   frames, tool results, cancel) the calls send again themselves (:mod:`call_hold`), so
   a settled link pays nothing per frame for the fall-back it keeps.

Nothing of the mesh above sees the switch: the relayed link, once replaced, hands what is
still sent on it (a call's replies, say) to the direct link, and calls streaming across
the switch go on. After :data:`RETIRE_S` the switch is retired: the sequence is kept
while the direct link lives (``kept``), the direct link going plain once the peer has
acknowledged what was numbered until the retirement (a peer that stops acknowledging
gets plain frames after ``MAX_UNACKED`` frames); it is forgotten with the relayed
session only when the direct link is gone. Each end counts it from its own first sight
of the switch, and a fall-back ends the switch, so the next one counts afresh at both
ends.

A direct link that dies during the switch, or later while the sequence is kept, falls
back to the relay: the path core moves the peer back to its fallback relay and resends
every frame of the sequence not yet acknowledged, in order, through it; the receiving
end, falling back too, keeps what it delivered, so nothing is lost or handed on twice.
A relayed link takes the dead link's place at once, and what is still sent on the dead
link (a call's replies) goes to it, so calls streaming across the fall-back go on.
Keeping the sequence while the direct link lives makes both ends agree: were it
forgotten at an end's own retirement (settled or not), a link dying after it would fall
back at the other end only, and the calls across it would fail at both. An end with no
relay left to fall back to holds the sequence instead (:mod:`hearthnet.mesh.path_hold`):
a re-dialled direct link, or a relay attached later, takes it up within ``HOLD_S``.

A peer gone from the relay we fell back through (the relay answers ``unreachable``) may
have fallen back through another relay: when one we are attached to is among those its
hello listed (any other attached relay, when it listed none), the peer moves to it,
everything unacknowledged resent there, and the calls go on (:meth:`unreachable`); only
when no relay is left to try does the relayed link close. A relayed peer that left the
relay we reach it through (it detached, or lost its link to it) moves the same way,
to any other attached relay.

Where one end did forget (it restarted, or found no relay to fall back to), only the
other falls back; the one that forgot answers its frames with a new relayed session,
:meth:`renewed` resends everything unacknowledged at once, and the peer's next frame,
of a new sequence, closes the relayed link that took the dead link's place (the peer
ended the calls of the dead link; the sequence goes on, :meth:`opened`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from hearthnet.errors import WireError
from hearthnet.mesh.addresses import well_formed
from hearthnet.mesh.links import PeerLink
from hearthnet.mesh.path_frames import Drain, PAck, PathFrame, PFrame
from hearthnet.mesh.path_hold import HeldSequences
from hearthnet.mesh.paths import PathCore, PathState, Transmit, describe
from hearthnet.mesh.pathseq import is_gossip, is_heartbeat
from hearthnet.mesh.relayed_link import PEER_RENEWED, is_relayed
from hearthnet.metrics import MetricsRegistry

log = logging.getLogger("hearthnet.mesh.relaying")

RETIRE_S = 10.0  # a switch is retired this long after an end first saw it (plain frames)
UNREACHABLE = "the relay cannot reach the peer"  # why a fallen-back relayed link closed
_SEQUENCE = (PFrame, PAck, Drain)  # the path frames a direct link carries in a switch
# what ``hearthnet_path_switch_events{event}`` counts (docs/operations.md)
SWITCH_EVENTS = ("fallbacks", "moved", "held", "resumed", "expired", "unexpected")


class PathSwitch:
    """The peers whose relayed link a direct one replaced, while their relayed sequence
    finishes; the relaying glue feeds it link events, path frames off direct links and
    the clock, and carries out the path core's actions with ``carry``."""

    def __init__(
        self,
        paths: PathCore,
        links: dict[str, PeerLink],
        carry: Callable[[list[Any]], None],
        forget: Callable[[str], None],
    ) -> None:
        self.paths = paths
        self.links = links
        self.carry = carry
        self.forget = forget  # ends the peer's sequence and session (the relaying glue's)
        self.retiring: dict[str, float] = {}  # peer -> when its relayed sequence is retired
        # peers whose retired sequence was settled: kept (plain frames) for a fall-back
        # while their direct link lives
        self.kept: set[str] = set()
        # peers fallen back to the relay -> until when a new session from them means they
        # did not fall back (so ended the calls on the link)
        self.fell: dict[str, float] = {}
        # peers fallen back -> the relay URLs their dead direct link's hello listed; and
        # relayed peers -> until when, and which relays answered ``unreachable`` for them
        # (not tried again until then)
        self._listed: dict[str, frozenset[str]] = {}
        self._tried: dict[str, tuple[float, set[str]]] = {}
        # peers that opened a new relayed session soon after we fell back -> until when
        # their next path frame is awaited: a new sequence in it means they forgot ours
        self.renewing: dict[str, float] = {}
        self._direct: dict[str, PeerLink] = {}  # peer -> direct link still sequenced
        # peers whose switch retired unsettled -> the last frame numbered then: once the
        # peer acknowledged up to it, the direct link goes plain (the rest stays kept)
        self._marks: dict[str, int] = {}
        self.unexpected = 0  # path frames on a direct link from a peer with no sequence
        self.sequenced = 0  # frames sent in a relayed sequence on a direct link
        self.fallbacks = 0  # direct links that died within a switch, fallen back to the relay
        self.moved = 0  # relayed peers moved to another relay on ``unreachable``
        # peers whose direct link died with no relay to fall back to (path_hold.py)
        self.held = HeldSequences(paths, forget, links, carry)
        # peer -> the relay its relayed frames came through last (the glue records it):
        # where ``unreachable`` moves it first; cleared when the peer goes direct, or
        # that relay is lost or detaches us (tick)
        self.came_via: dict[str, str] = {}

    def established(self, link: PeerLink) -> None:
        """A direct link finished its handshake (before the mesh admits it): if it is to
        replace a relayed link with frames still unacknowledged, or a direct link still
        continuing their sequence (a rival dialled at the same time that wins over it),
        or to take up a sequence held or relayed with no relayed link, it continues
        that sequence until the peer has acknowledged it."""
        current = self.links.get(link.node)
        switching = is_relayed(current) or (current is not None and link.node in self._direct)
        # a re-dial takes up a held sequence; a path relayed with no relayed link (a
        # probe out) continues its sequence too
        relayed = self.paths.path(link.node)[0] in (PathState.RELAYED, PathState.UPGRADING)
        switching = switching or link.node in self.held or relayed
        if is_relayed(link) or not switching or not link.v2:
            return  # a hearthnet-peer.v1 peer drops pframes; it gets plain frames at once
        if self.paths.settled(link.node):  # nothing in flight: plain frames at once
            _trace(self.paths, "direct link to %s established: settled, plain", link.node)
            return
        self._direct[link.node] = link
        if link.node in self._marks:  # what the old link still carries is sent until now
            self._marks[link.node] = self.paths.numbers(link.node)[0]
        link.sequencer = lambda data, peer=link.node: self._sequence(peer, data)
        _trace(self.paths, "direct link to %s established: it continues the sequence", link.node)

    def replaced(self, peer: str, now: float) -> None:
        """The relayed link to ``peer`` closed for a direct one: drain the relayed path."""
        self.came_via.pop(peer, None)  # direct now: no relay is where its frames come
        self.retiring.setdefault(peer, now + RETIRE_S)
        if self.paths.path(peer)[0] is not PathState.DIRECT:
            self.carry(self.paths.direct_up(peer, now))
            _trace(self.paths, "relayed path to %s replaced by the direct link, drained", peer)

    def direct_serves(self, peer: str, now: float) -> None:
        """The glue's check after a direct link is admitted and after frames from ``peer``
        came through a relay: while a direct link is the peer's link, a path the core
        still has relayed (a probe answered, or the peer's relayed frames opened, after
        the direct link came up: no relayed link was there to be replaced) moves to it as
        :meth:`replaced` moves it, the relay kept as fallback."""
        link = self.links.get(peer)
        if link is None or is_relayed(link):
            return
        state = self.paths.path(peer)[0]
        if self.held.resume(peer):  # a re-dial: the held sequence continues on it
            if not link.v2:  # a hearthnet-peer.v1 peer drops pframes
                self.forget(peer)
                return
            state = PathState.RELAYED if state is PathState.DOWN else state
        if state in (PathState.RELAYED, PathState.UPGRADING):
            self.replaced(peer, now)

    def transmit(self, action: Transmit) -> None:
        """A frame of a relayed sequence continued on the direct link (the path core's
        ``Transmit`` with no relay). The ``upgrade`` marker is not sent: the hellos
        already name the punched link's ends, and a node without it would refuse it."""
        link = self._link(action.peer)
        if isinstance(action.frame, _SEQUENCE) and (
            link is None or not link.enqueue(action.frame.encode())
        ):  # a pframe is resent later; a pack or drain is sent again when due
            log.debug(
                "%s to %s: no direct link took it",
                action.frame.KIND,
                action.peer,
                extra={"peer": action.peer},
            )

    def _link(self, peer: str) -> PeerLink | None:
        """The direct link to ``peer``: the one admitted, else (while the mesh is still
        admitting it) the one that was established."""
        link = self.links.get(peer)
        if link is None or is_relayed(link):
            link = self._direct.get(peer)
        return link

    def direct_down(self, link: PeerLink, now: float, *, gone: bool = False) -> bool:
        """A direct link ended. Within the switch it falls back to the relay (True: the
        glue opens a relayed link in its place and calls go on): the peer's sequence
        continues there, everything unacknowledged resent in order. With no relay to
        fall back to, the sequence is held for the next link (:mod:`path_hold`); with the
        peer ``gone`` (it said bye, or left the community), it ends with the link."""
        peer = link.node
        if peer not in self.retiring and peer not in self.kept:
            return False
        # ``link`` was the peer's link (the mesh reports no other): whichever direct link
        # ``_direct`` holds, one dialled at the same time that lost to it, or this one
        state, fallback = self.paths.path(peer)
        _trace(self.paths, "direct link to %s down in a switch or kept sequence", peer)
        if gone or state is not PathState.DIRECT:
            self.forget(peer)
            return False
        self._direct.pop(peer, None)
        self._marks.pop(peer, None)
        # this switch is over: the next one is retired RETIRE_S after it, not after this
        # one (else an end that saw it first could forget while the other falls back)
        self.retiring.pop(peer, None)
        self.kept.discard(peer)
        if fallback is None:  # no relay: what is unacknowledged waits for the next link
            self.carry(self.held.hold(peer, now, link))
            return False
        self.fell[peer] = now + RETIRE_S
        self._listed[peer] = frozenset(well_formed(link.peer.relays))
        self._tried.pop(peer, None)
        self.fallbacks += 1
        self.carry(self.paths.direct_down(peer, now))
        # what the mesh still sends on the dead link goes to the link that replaces it
        link.sequencer = lambda data: self._after(link, data)
        return True

    def _after(self, dead: PeerLink, data: bytes) -> bool:
        """A dead direct link's ``sequencer`` after the fall-back: the peer's current link
        (the relayed one) takes the frame."""
        current = self.links.get(dead.node)
        return current is not None and current is not dead and current.send_raw(data)

    def path_frame(self, link: PeerLink, frame: PathFrame, now: float) -> None:
        """A path frame off a direct link (the peer continues a relayed sequence on it)."""
        peer = link.node
        resumed = self.held.resume(peer)  # the peer re-dialled and continues the sequence
        if not resumed and peer not in self.retiring and self.paths.path(peer)[0] is PathState.DOWN:
            # its relayed frames never reached us (or we forgot them): the sequence is
            # taken up here all the same, so what it resends arrives
            self.unexpected += 1
            _trace(self.paths, "a path frame off the direct link from %s, no sequence", peer)
        self.retiring.setdefault(peer, now + RETIRE_S)
        actions: list[Any] = []
        if self.paths.path(peer)[0] is not PathState.DIRECT:
            actions += self.paths.direct_up(peer, now)
        actions += self.paths.receive(peer, frame, now)
        self.carry(actions)
        self.settle(peer)

    def settle(self, peer: str) -> None:
        """Once ``peer`` acknowledged the whole relayed sequence, its direct link carries
        plain frames (the sequence stays kept for a fall-back while the link lives)."""
        link = self._direct.get(peer)
        if link is not None and self._settled(peer):
            self._end(peer)

    def _settled(self, peer: str) -> bool:
        """Whether frames may go plainly: the peer acknowledged the whole sequence, or,
        after the switch retired, everything numbered until then (what followed went on
        this link alone, in order, so plain frames cannot overtake it)."""
        mark = self._marks.get(peer)
        if mark is not None and self.paths.settled(peer, mark):
            return True
        return self.paths.settled(peer)

    def _end(self, peer: str) -> None:
        """The switch's sequence settled (or gave up ordering): the direct link carries
        plain frames, every kind, a call's too (a fall-back's resend of those is the
        calls' own: :mod:`hearthnet.mesh.call_hold`)."""
        self._marks.pop(peer, None)
        # both: of two links dialled at once, the one established last may have lost
        ended = False
        for link in (self._direct.pop(peer, None), self.links.get(peer)):
            if link is not None:
                ended = ended or link.sequencer is not None
                link.sequencer = None
        if ended:
            _trace(self.paths, "direct link to %s goes plain", peer)

    def _sequence(self, peer: str, data: bytes) -> bool:
        """The direct link's ``sequencer``: frames continue the relayed sequence (True), or
        go plainly (False: a heartbeat, or the sequence is settled)."""
        if is_heartbeat(data):
            return False
        if peer not in self._direct or self._settled(peer):
            self._end(peer)
            return False
        try:
            actions = self.paths.send(peer, data, time.monotonic(), sheddable=is_gossip(data))
        except WireError as exc:  # too much unacknowledged: give up ordering, not frames
            log.info("direct link to %s: %s; frames go plainly", peer, exc, extra={"peer": peer})
            self._end(peer)
            return False
        self.sequenced += 1
        self.carry(actions)
        return True

    def renewed(self, peer: str, now: float) -> None:
        """``peer`` opened a new relayed session in place of ours: what it was sent under
        the old one and did not acknowledge is resent at once (:meth:`PathCore.renewed`).
        If we fell back to the relay for it lately, its next path frame says whether it
        forgot the link too (:meth:`opened`)."""
        fell = self.fell.get(peer, now)
        self._drop_fell(peer)
        if fell > now:
            self.renewing[peer] = now + RETIRE_S
        self.carry(self.paths.renewed(peer, now))

    def opened(self, peer: str, frame: PathFrame) -> None:
        """A path frame from ``peer`` through the relay, before the path core takes it.
        After a fall-back and a new session from the peer, a ``pframe`` of a new
        sequence (a later epoch than the one we follow) means the peer forgot the
        sequence and the link (it restarted, or its end of the dead link found no relay
        to fall back to): it ended the calls on it, so the relayed link that took the
        dead link's place closes too (``PEER_RENEWED``: the calls on it end here instead
        of hanging, the sequence goes on, the next frame opens a new relayed link). Of
        the same sequence, the peer only made new keys (a session it evicted, or keys
        that stopped verifying): it kept the link, and the calls go on."""
        if peer not in self.renewing or not isinstance(frame, PFrame):
            return  # a pack or drain carries our sequence's epoch, not the peer's
        del self.renewing[peer]
        followed = self.paths.numbers(peer)[1]
        if followed is not None and frame.e <= followed:
            return
        link = self.links.get(peer)
        if link is not None and is_relayed(link):
            link.close(PEER_RENEWED, send_bye=False)

    def unreachable(self, peer: str, relay: str, now: float) -> None:
        """``relay`` answered ``unreachable`` for a frame to ``peer``: the peer is not
        there. It left that relay for another one (it fell back through another relay,
        or detached), or it crashed. The peer moves to another relay we are attached
        to (after a fall-back: one that its hello listed), everything unacknowledged
        resent there, and the calls go on: first the relay its frames came through last
        (if not this one), else one not tried yet (a relay that answered ``unreachable``
        is not tried again for :data:`RETIRE_S`). With none left to try, the relayed link
        that a fall-back opened closes, so the calls on it end now rather than when its
        heartbeats time out; any other relayed link is left to its heartbeats. An answer
        from a relay the peer already moved away from changes nothing."""
        fell = self.fell.get(peer, now) > now
        if not fell and peer in self.fell:
            self._drop_fell(peer)
        state, via = self.paths.path(peer)
        if state is PathState.RELAYED and via != relay:
            return  # frames sent before the move: the relay now carrying them resends
        if not fell and state is not PathState.RELAYED:
            return
        until, tried = self._tried.get(peer, (now + RETIRE_S, set()))
        if until <= now:
            until, tried = now + RETIRE_S, set()
        tried.add(relay)
        self._tried[peer] = (until, tried)
        other = self._other_relay(peer, tried, relay) if state is PathState.RELAYED else None
        if other is not None:
            self.moved += 1
            self.carry(self.paths.leave_relay(relay, now, alive=False, peer=peer, to=other))
            return
        if not fell:
            return
        self._drop_fell(peer)
        link = self.links.get(peer)
        if link is not None and is_relayed(link):
            link.close(UNREACHABLE, send_bye=False)

    def _other_relay(self, peer: str, tried: set[str], answered: str) -> str | None:
        """The relay ``peer``'s frames came through last, if attached and not the one
        that ``answered`` (its frames say it reaches the peer, tried or not); else the
        best attached relay not yet tried that its hello listed (by the URL we dialled
        it at, or its own): any of them when it listed none."""
        attached = self.paths.relays.attached_relays
        came = self.came_via.get(peer)
        if came is not None and came != answered and came in attached:
            return came
        listed = self._listed.get(peer, frozenset())
        for relay in attached:
            if relay in tried:
                continue
            link = self.links.get(relay)
            urls = set(well_formed((link.address or "", link.peer.url or ""))) if link else set()
            if not listed or urls & listed:
                return relay
        return None

    def _drop_fell(self, peer: str) -> None:
        self.fell.pop(peer, None)
        self._listed.pop(peer, None)
        self._tried.pop(peer, None)

    def tick(self, now: float) -> None:
        """Settled peers go plain; retired sequences are kept while the direct link
        lives, else forgotten."""
        for peer in list(self._direct):
            self.settle(peer)
        for peer, at in list(self.renewing.items()):
            if now >= at:
                del self.renewing[peer]
        for peer, at in list(self.fell.items()):
            if now >= at:
                self._drop_fell(peer)
        for peer, (at, _) in list(self._tried.items()):
            if now >= at:
                del self._tried[peer]
        self.held.tick(now)
        if self.came_via:  # a relay lost or detached no longer brings anyone's frames
            attached = set(self.paths.relays.attached_relays)
            for peer, relay in list(self.came_via.items()):
                if relay not in attached:
                    del self.came_via[peer]
        for peer, at in list(self.retiring.items()):
            if now >= at:
                del self.retiring[peer]
                if is_relayed(self.links.get(peer)):
                    continue  # relayed again, in use
                if peer not in self.links:
                    self.forget(peer)
                    continue
                # the fall-back stays while the direct link lives (see above); a sequence
                # the peer has not acknowledged yet goes on until what was numbered until
                # now is (settle)
                self.kept.add(peer)
                _trace(self.paths, "switch to %s retired, its sequence kept", peer)
                if self.paths.settled(peer):
                    self._end(peer)
                elif peer in self._direct:  # plain once what was sent until now is acked
                    self._marks[peer] = self.paths.numbers(peer)[0]

    def forgotten(self, peer: str) -> None:
        """The peer's sequence ended (retired, or its link died): plain frames from now."""
        self.retiring.pop(peer, None)
        self.kept.discard(peer)
        self._drop_fell(peer)
        self.renewing.pop(peer, None)
        self.held.forgotten(peer)
        self.came_via.pop(peer, None)
        self._end(peer)


def _trace(paths: PathCore, what: str, peer: str) -> None:
    """A switch event at debug level, with where the peer's sequence stands (what a lost
    frame is traced by: the path, numbers sent and acknowledged, frames waiting, and the
    peer's sequence followed). One line per event of a switch, none per frame."""
    if log.isEnabledFor(logging.DEBUG):
        log.debug(what + ": %s", peer, describe(paths, peer), extra={"peer": peer})


def switch_counts(switch: PathSwitch) -> dict[str, int]:
    """The switch's counters since start, for ``/status`` (``relaying.paths.switch``) and
    ``/metrics``: frames ``sequenced`` on direct links, direct links that fell back to
    the relay (``fallbacks``), relayed peers ``moved`` to another relay on
    ``unreachable``, sequences ``held`` with no relay to fall back to, then ``resumed``
    by a link or ``expired``, and path frames off a direct link from a peer with no
    sequence (``unexpected``)."""
    held = switch.held
    return {
        "sequenced": switch.sequenced,
        "fallbacks": switch.fallbacks,
        "moved": switch.moved,
        "held": held.held,
        "resumed": held.resumed,
        "expired": held.expired,
        "unexpected": switch.unexpected,
    }


def register_switch_metrics(m: MetricsRegistry, switch: PathSwitch) -> None:
    """``hearthnet_path_switch_events{event}`` and ``hearthnet_path_switch_sequenced_frames``."""
    m.read_counter(
        "hearthnet_path_switch_events",
        "Path switches of relayed links turning direct, by event: fallbacks, moved, held, "
        "resumed, expired, unexpected (spec §8).",
        lambda: {(e,): float(n) for e, n in switch_counts(switch).items() if e in SWITCH_EVENTS},
        ("event",),
    )
    m.read_counter(
        "hearthnet_path_switch_sequenced_frames",
        "Frames sent on a direct link in a relayed link's sequence, while it turned direct.",
        lambda: float(switch.sequenced),
    )
