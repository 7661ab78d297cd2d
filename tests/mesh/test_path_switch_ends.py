"""Both ends of a relayed link turning direct, and falling back (spec §8: "falls back to
the relay if the direct path dies"), driven step by step with a chosen interleaving and a
fake clock: two path switches, path cores and relay sessions wired as the relaying glue
wires them (hearthnet/mesh/relayed_paths.py), a relay that is a list, no sockets."""

from __future__ import annotations

from typing import Any

import aiohttp
import cbor2

from hearthnet.identity import KeyPair
from hearthnet.mesh.links import LinkErrors, PeerLink
from hearthnet.mesh.path_frames import PATH_FRAME_TYPES, PathFrame
from hearthnet.mesh.path_switch import RETIRE_S, PathSwitch
from hearthnet.mesh.paths import Deliver, PathCore, PathState, Transmit
from hearthnet.mesh.protocol import LinkState, PeerInfo, encode_frame
from hearthnet.mesh.relay_frames import Route, decode
from hearthnet.mesh.relay_member import RelayEndpoint
from hearthnet.mesh.relayed_link import RelayedLink

KA, KB = (KeyPair.from_seed(bytes([0x51 + i]) * 32) for i in range(2))
RELAY = "r"


class _Socket:
    """The socket of a direct link that nothing runs (:func:`_pump` takes its frames)."""

    closed = False

    async def send_bytes(self, data: bytes) -> None:
        """Never called: the link is not run."""

    async def receive(self, timeout: float | None = None) -> aiohttp.WSMessage:  # noqa: ASYNC109
        """Never called: the link is not run."""
        raise RuntimeError("not run")

    async def close(self, *, code: int = 1000, message: bytes = b"") -> bool:
        """Nothing to close."""
        return False


class End:
    """One member: its path core, relay sessions, path switch and link to the other end."""

    def __init__(
        self, keys: KeyPair, peer: str, relay: list[tuple[End, Route]], epoch: int = 0
    ) -> None:
        self.keys, self.peer, self.relay = keys, peer, relay
        self.other: End
        self.now = 0.0
        self.paths = PathCore(keys.node_id, [RELAY], epoch=epoch)
        self.paths.relay_attached(RELAY, f"198.51.100.{1 + (keys.node_id < peer)}:7000", 0.01, 0.0)
        self.endpoint = RelayEndpoint(keys, lambda node: True)
        self.links: dict[str, PeerLink] = {}
        self.switch = PathSwitch(self.paths, self.links, self.carry, self.forget)
        self.delivered: list[bytes] = []
        self.direct: PeerLink | None = None
        self.hello_relays: tuple[str, ...] = ()  # the relays the peer's hello lists
        self.relayed_link()

    def _info(self) -> PeerInfo:
        return PeerInfo(self.peer, "", None, "", relays=self.hello_relays)

    def relayed_link(self) -> None:
        """A relayed link to the peer takes the link's place (as the glue opens one)."""
        self.links[self.peer] = RelayedLink(
            self._info(),
            RELAY,
            outbound=True,
            transmit=self.transmit,
            on_frame=lambda link, frame: None,
            on_down=lambda link, reason: None,
            errors=LinkErrors(),
        )

    def transmit(self, peer: str, data: bytes) -> bool:
        """The relayed link's frame into the path core (``RelayedPaths._transmit``)."""
        self.carry(self.paths.send(peer, data, self.now))
        return True

    def _new_direct(self) -> PeerLink:
        return PeerLink(
            self._info(),
            _Socket(),
            outbound=True,
            on_frame=lambda link, frame: None,
            on_down=lambda link, reason: None,
            v2=True,
        )

    def direct_link(self, now: float, *, rivals: int = 0) -> PeerLink:
        """A direct link replaces the relayed one (the switch as the glue sees it);
        ``rivals`` more direct links finish their handshake after it and lose to it (two
        dials at once), so they close without ever being the peer's link."""
        link = self._new_direct()
        self.switch.established(link)
        for _ in range(rivals):
            rival = self._new_direct()
            self.switch.established(rival)
            rival.close("a duplicate link", send_bye=False)
        self.links[self.peer] = self.direct = link
        self.now = now
        self.switch.replaced(self.peer, now)
        return link

    def cut(self, link: PeerLink, now: float) -> bool:
        """The direct link died under us; True when the switch fell back to the relay."""
        self.now = now
        link.close("cut", send_bye=False)
        fell = self.switch.direct_down(link, now)
        if fell:
            self.relayed_link()
        else:
            del self.links[self.peer]
        return fell

    def carry(self, actions: list[Any]) -> None:
        """The path core's actions, as the relaying glue carries them out."""
        for action in actions:
            if isinstance(action, Transmit) and action.via is not None:
                for route in self.endpoint.wrap(action.peer, action.frame, self._ms()):
                    self.relay.append((self.other, route))
            elif isinstance(action, Transmit):
                self.switch.transmit(action)
            elif isinstance(action, Deliver):
                self.delivered.append(action.frame)

    def forget(self, peer: str) -> None:
        """The glue's ``forget``: the peer's sequence and session start afresh."""
        self.paths.epoch += 1
        self.paths.forget(peer)
        self.endpoint.forget(peer)
        self.switch.forgotten(peer)

    def unwrap(self, route: Route) -> None:
        """A route from the relay (``RelayedPaths.unwrap``)."""
        opened = self.endpoint.unwrap(route, self._ms())
        self.relay.extend((self.other, r) for r in opened.routes)
        if opened.renewed:
            self.switch.renewed(self.peer, self.now)
        for frame in opened.frames:
            self.switch.opened(self.peer, frame)
            self.take(frame)
        if opened.frames:
            self.switch.direct_serves(self.peer, self.now)

    def take(self, frame: PathFrame) -> None:
        self.carry(self.paths.receive(self.peer, frame, self.now))

    def off_direct(self, data: bytes) -> None:
        """A frame off the direct link: a path frame goes to the switch (as
        ``Relaying.on_frame`` hands it on), any other is the mesh's."""
        assert self.direct is not None
        if cbor2.loads(data).get("t") in ("pframe", "pack", "drain"):
            frame = decode(data)
            assert isinstance(frame, PATH_FRAME_TYPES)
            self.switch.path_frame(self.direct, frame, self.now)
        else:
            self.delivered.append(data)

    def send(self, data: bytes, now: float) -> None:
        self.now = now
        self.links[self.peer].send_raw(data)

    def tick(self, now: float) -> None:
        """The glue's tick: the path core (acks, resends), then the switch."""
        self.now = now
        self.carry(self.paths.tick(now))
        self.switch.tick(now)

    def _ms(self) -> int:
        return 1_763_800_000_000 + int(self.now * 1000)


def plain(end: End, link: PeerLink) -> bool:
    """Whether ``end``'s frames on ``link`` go plainly (its switch settled; the sequence
    may still be kept for a fall-back: path_switch.py)."""
    return link.sequencer is None


def _pair() -> tuple[End, End]:
    relay: list[tuple[End, Route]] = []
    a, b = End(KA, KB.node_id, relay), End(KB, KA.node_id, relay)
    a.other, b.other = b, a
    return a, b


def _pump(a: End, now: float) -> None:
    """Everything in the relay and on the direct link arrives (each in order), and what
    it causes, at ``now``; a direct link that is not up carries nothing."""
    b = a.other
    a.now = b.now = now
    while True:
        if a.relay:
            end, route = a.relay.pop(0)
            end.unwrap(route)
            continue
        for end in (a, b):
            link = end.direct
            if link is not None and link.state is LinkState.UP and link.queued:
                end.other.off_direct(link._queue.popleft())  # what its writer would send
                break
        else:
            return


def _frame(i: int) -> bytes:
    return bytes([0xA1, 0x61, 0x66, i])


def test_a_second_switch_after_a_fall_back_retires_on_its_own_time_at_both_ends() -> None:
    """Switch, cut, fall back, and switch again just before the first switch's retirement,
    b seeing the second switch before and a after it: a cut 1 s into the second switch
    falls back at both ends, and a's frame through the relay opens at b and arrives once."""
    a, b = _pair()
    a.send(_frame(1), 0.0)
    _pump(a, 0.0)
    first = (a.direct_link(1.0), b.direct_link(1.0))
    _pump(a, 1.0)
    fell_first = (a.cut(first[0], 2.0), b.cut(first[1], 2.0))
    _pump(a, 2.0)
    second_b = b.direct_link(1.0 + RETIRE_S - 0.1)  # b's relayed link closes first
    a.tick(1.0 + RETIRE_S)  # a's tick, still relayed: the first switch's time is up
    second_a = a.direct_link(1.0 + RETIRE_S + 0.1)
    _pump(a, 1.0 + RETIRE_S + 0.1)
    for end in (a, b):
        end.tick(1.0 + RETIRE_S + 0.4)
    _pump(a, 1.0 + RETIRE_S + 0.4)
    fell_second = (a.cut(second_a, RETIRE_S + 2.0), b.cut(second_b, RETIRE_S + 2.0))
    a.send(_frame(2), RETIRE_S + 2.0)
    _pump(a, RETIRE_S + 2.0)
    for end in (a, b):  # resends of anything the relay did not bring
        end.tick(RETIRE_S + 5.0)
    _pump(a, RETIRE_S + 5.0)
    assert (
        ((True, True), (True, True)),
        [_frame(1), _frame(2)],
        {},
        (PathState.RELAYED, PathState.RELAYED),
    ) == (
        (fell_first, fell_second),
        b.delivered,
        dict(b.endpoint.refused),
        (a.paths.path(b.keys.node_id)[0], b.paths.path(a.keys.node_id)[0]),
    )


def test_a_direct_link_that_won_over_a_rival_falls_back_when_cut_unacknowledged() -> None:
    """Two direct links come up at once at a, the later losing: the winner cut while a's
    frames on it are unacknowledged falls back at both ends, and b gets them once, in
    order."""
    a, b = _pair()
    a.send(_frame(1), 0.0)
    links = (a.direct_link(1.0, rivals=1), b.direct_link(1.0))
    a.send(_frame(2), 1.1)  # on the direct link, in the relayed sequence: lost with it
    fell = (a.cut(links[0], 1.2), b.cut(links[1], 1.2))
    _pump(a, 1.2)
    for end in (a, b):
        end.tick(4.0)
    _pump(a, 4.0)
    assert ((True, True), [_frame(1), _frame(2)]) == (fell, b.delivered)


def test_a_punched_link_cut_in_the_switch_leaves_nothing_unacknowledged() -> None:
    """Frames sent while a punch is under way (through the relay) and on the punched
    link, which dies with frames of both ends unacknowledged: each end gets the other's
    once, in order, and both sequences are acknowledged to the end."""
    a, b = _pair()
    lead, follow = (a, b) if a.keys.node_id < b.keys.node_id else (b, a)
    for end in (lead, follow):  # relayed; the leader's backoff is over at once
        end.send(_frame(1), 0.0)
    _pump(a, 0.0)
    lead.tick(0.5)  # candidates, answered, punch: both start the simultaneous open
    _pump(a, 0.5)
    upgrading = (a.paths.path(b.keys.node_id)[0], b.paths.path(a.keys.node_id)[0])
    for end in (lead, follow):
        end.send(_frame(2), 0.6)  # through the relay, acknowledged by nobody yet
    links = (a.direct_link(0.7), b.direct_link(0.7))  # the punched link replaces it
    for end in (a, b):
        end.send(_frame(3), 0.8)
    fell = (a.cut(links[0], 0.9), b.cut(links[1], 0.9))
    for end in (a, b):
        end.send(_frame(4), 1.0)
    _pump(a, 1.0)
    for now in (3.5, 6.0):
        for end in (a, b):
            end.tick(now)
        _pump(a, now)
    frames = [_frame(i) for i in range(1, 5)]
    assert (
        (PathState.UPGRADING, PathState.UPGRADING),
        (True, True),
        (frames, frames),
        (True, True),
        (True, True),
    ) == (
        upgrading,
        fell,
        (a.delivered, b.delivered),
        (a.paths.stats.resent >= 2, b.paths.stats.resent >= 2),  # 2 and 3 at least
        (a.paths.settled(b.keys.node_id), b.paths.settled(a.keys.node_id)),
    )


def test_a_cut_between_the_two_ends_retirements_falls_back_at_both_ends() -> None:
    """The direct link dies after a has retired the switch and before b has: both fall
    back (a kept its settled sequence and session), and a gets b's frames once, in order,
    with no resend awaited."""
    a, b = _pair()
    for i in (1, 2):
        b.send(_frame(i), 0.0)
    _pump(a, 0.0)
    links = (a.direct_link(1.0), b.direct_link(1.0))
    _pump(a, 1.0)
    b.send(_frame(3), 2.0)
    _pump(a, 2.0)
    for end in (a, b):
        end.tick(5.0)
    _pump(a, 5.0)
    a.tick(1.0 + RETIRE_S)  # a retires the switch; b ticks later
    fell = (a.cut(links[0], 1.05 + RETIRE_S), b.cut(links[1], 1.05 + RETIRE_S))
    b.send(_frame(4), 1.1 + RETIRE_S)
    _pump(a, 1.1 + RETIRE_S)
    assert (
        (True, True),
        [_frame(i) for i in range(1, 5)],
        {},
        (PathState.RELAYED, PathState.RELAYED),
    ) == (
        fell,
        a.delivered,
        dict(a.endpoint.refused),
        (a.paths.path(b.keys.node_id)[0], b.paths.path(a.keys.node_id)[0]),
    )


def test_a_sequence_unacknowledged_at_retirement_is_kept_and_both_ends_fall_back() -> None:
    """a's frame on the direct link is still unacknowledged when a retires the switch:
    a keeps its sequence and session (the link lives), then the link dies with b's ack
    of it: both ends fall back, each gets the other's frames once, in order, nothing is
    refused, and the relayed links that took the dead link's place stay up."""
    a, b = _pair()
    for i in (1, 2):
        b.send(_frame(i), 0.0)
    a.send(_frame(9), 0.0)
    _pump(a, 0.0)
    links = (a.direct_link(1.0), b.direct_link(1.0))
    a.send(_frame(10), 1.0)  # in the relayed sequence, stuck on the link past a's retirement
    assert a.direct is not None
    stuck = a.direct._queue.popleft()
    _pump(a, 1.0)
    a.tick(1.0 + RETIRE_S)  # a: unacknowledged, so kept and still sequenced
    kept = (b.keys.node_id in a.switch.kept, links[0].sequencer is not None)
    b.off_direct(stuck)  # then it arrives; b's ack dies with the link
    fell = (a.cut(links[0], 1.05 + RETIRE_S), b.cut(links[1], 1.05 + RETIRE_S))
    relayed = (a.links[b.keys.node_id], b.links[a.keys.node_id])
    b.send(_frame(3), 1.1 + RETIRE_S)
    a.send(_frame(11), 1.1 + RETIRE_S)
    _pump(a, 1.1 + RETIRE_S)  # a's resend of 10 goes with the fall-back
    for end in (a, b):  # a tick later, the acks are back
        end.tick(1.35 + RETIRE_S)
    _pump(a, 1.35 + RETIRE_S)
    assert (
        (True, True),
        (True, True),
        ([_frame(i) for i in range(1, 4)], [_frame(i) for i in (9, 10, 11)]),
        ({}, {}),
        (LinkState.UP, LinkState.UP),
        (True, True),
    ) == (
        kept,
        fell,
        (a.delivered, b.delivered),
        (dict(a.endpoint.refused), dict(b.endpoint.refused)),
        (relayed[0].state, relayed[1].state),
        (a.paths.settled(b.keys.node_id), b.paths.settled(a.keys.node_id)),
    )


def test_a_sequence_acknowledged_after_retirement_goes_plain_on_the_direct_link() -> None:
    """a's sequence kept unacknowledged at its retirement: once b's ack arrives on the
    direct link, a's frames on it go plainly and the fall-back stays kept."""
    a, b = _pair()
    a.send(_frame(1), 0.0)
    _pump(a, 0.0)
    links = (a.direct_link(1.0), b.direct_link(1.0))
    a.send(_frame(2), 1.0)
    assert a.direct is not None
    stuck = a.direct._queue.popleft()
    _pump(a, 1.0)
    a.tick(1.0 + RETIRE_S)
    before = links[0].sequencer is not None
    b.off_direct(stuck)
    b.tick(1.2 + RETIRE_S)  # b owes an ack: it goes on the direct link
    _pump(a, 1.2 + RETIRE_S)
    a.tick(1.3 + RETIRE_S)
    a.send(_frame(3), 1.3 + RETIRE_S)
    _pump(a, 1.3 + RETIRE_S)
    assert (True, True, True, [_frame(i) for i in (1, 2, 3)]) == (
        before,
        plain(a, links[0]),
        b.keys.node_id in a.switch.kept,
        b.delivered,
    )


def test_after_retirement_the_link_goes_plain_once_what_was_sent_until_then_is_acked() -> None:
    """a retires with frame 2 unacknowledged and sends 3 in the sequence; b's ack of 2
    arrives while 3 is still in flight: a's next frame goes plainly, after 3 on the same
    link, and b hands on 1-4 once, in order (a busy link need not wait for a moment with
    nothing in flight)."""
    a, b = _pair()
    a.send(_frame(1), 0.0)
    _pump(a, 0.0)
    links = (a.direct_link(1.0), b.direct_link(1.0))
    a.send(_frame(2), 1.0)
    stuck = links[0]._queue.popleft()
    _pump(a, 1.0)
    a.tick(1.0 + RETIRE_S)
    a.send(_frame(3), 1.1 + RETIRE_S)  # still in the sequence: 2 is unacknowledged
    b.off_direct(stuck)
    b.tick(1.2 + RETIRE_S)  # b acknowledges 2; 3 is still on its way
    assert b.direct is not None
    while b.direct.queued:
        a.off_direct(b.direct._queue.popleft())
    in_flight = a.paths.settled(b.keys.node_id)
    a.send(_frame(4), 1.3 + RETIRE_S)
    went_plain = plain(a, links[0])
    _pump(a, 1.3 + RETIRE_S)
    assert (False, True, [_frame(i) for i in range(1, 5)], True) == (
        in_flight,
        went_plain,
        b.delivered,
        b.keys.node_id in a.switch.kept,
    )


def _fell_back(a: End, b: End) -> tuple[PeerLink, PeerLink]:
    """A switch settled at both ends, then the direct link dies at b only (a is gone
    from it): b falls back; returns a's dead direct link and b's relayed link."""
    for end in (a, b):
        end.send(_frame(1), 0.0)
    _pump(a, 0.0)
    links = (a.direct_link(1.0), b.direct_link(1.0))
    for end in (a, b):
        end.send(_frame(2), 1.5)
    _pump(a, 1.5)
    for end in (a, b):
        end.tick(2.0)
    _pump(a, 2.0)
    assert b.cut(links[1], 3.0)
    return links[0], b.links[a.keys.node_id]


def test_a_peer_that_restarted_after_a_fall_back_has_the_relayed_link_closed() -> None:
    """b falls back and a has restarted (a new process: no session, a later sequence):
    b's frames make a open a new session, b resends at once, and a's first frame of
    its new sequence closes b's relayed link (a ended the calls on it); what b sent
    reaches the new a, and a's frame reaches b."""
    a, b = _pair()
    _fell_back(a, b)
    relay = a.relay
    relay[:] = [(end, route) for end, route in relay if end is not a]  # a's process died
    fresh = End(KA, KB.node_id, relay, epoch=a.paths.epoch + 1_000)
    fresh.other, b.other = b, fresh
    b.send(_frame(3), 3.1)
    _pump(b, 3.1)  # refused by the new a, which answers with a hello; b resends at once
    open_before = b.links[KA.node_id].state
    fresh.send(_frame(7), 3.2)
    _pump(b, 3.2)
    assert (
        LinkState.UP,
        "the peer opened a new relayed session",
        ([_frame(3)], [_frame(1), _frame(2), _frame(7)]),
        {"invalid_signature": 1},
    ) == (
        open_before,
        b.links[KA.node_id].down_reason,
        (fresh.delivered, b.delivered),
        dict(fresh.endpoint.refused),
    )


def test_a_peer_that_only_made_new_keys_after_a_fall_back_keeps_the_relayed_link() -> None:
    """Both ends fall back, then a drops its relayed session with b (evicted) but keeps
    the link and its sequence: a's next frame opens a new session, and b, seeing a's
    sequence go on, keeps its relayed link: the calls go on, every frame once, in order."""
    a, b = _pair()
    dead, relayed_b = _fell_back(a, b)
    assert a.cut(dead, 3.0)
    a.endpoint.forget(b.keys.node_id)  # a new session, the same sequence
    a.send(_frame(3), 3.1)
    b.send(_frame(3), 3.1)
    _pump(a, 3.1)
    for end in (a, b):
        end.tick(3.5)
    _pump(a, 3.5)
    frames = [_frame(i) for i in (1, 2, 3)]
    assert (LinkState.UP, LinkState.UP, (frames, frames)) == (
        relayed_b.state,
        a.links[b.keys.node_id].state,
        (a.delivered, b.delivered),
    )


def _rival(end: End, now: float) -> PeerLink:
    """A second direct link finishes its handshake and wins over the end's direct link
    (the two dials' winning direction): it takes the link's place, the old one closes."""
    link = end._new_direct()
    end.switch.established(link)
    assert end.direct is not None
    old, end.links[end.peer], end.direct = end.direct, link, link
    old.close("duplicate link", send_bye=False)
    end.now = now
    return link


def test_a_rival_that_wins_over_the_switched_link_continues_the_sequence() -> None:
    """A rival direct link replaces a's direct link while a's relayed frame is still in
    the relay: what a sends on the rival continues the relayed sequence, so b hands a's
    frames on once, in order, though the rival's arrive first."""
    a, b = _pair()
    a.send(_frame(1), 0.0)  # still in the relay when the links come up
    a.direct_link(1.0)
    b.direct_link(1.0)
    rival = _rival(a, 1.1)
    a.send(_frame(2), 1.2)
    while rival.queued:  # the rival's frames arrive before the relay's
        b.off_direct(rival._queue.popleft())
    for now in (1.3, 1.6):
        _pump(a, now)
        for end in (a, b):
            end.tick(now)
    _pump(a, 1.6)
    assert ([_frame(1), _frame(2)], True, True) == (
        b.delivered,
        a.paths.settled(b.keys.node_id),
        plain(a, rival),
    )


def test_a_rival_admitted_after_the_winner_fell_back_switches_again_in_order() -> None:
    """The winning direct link dies within the switch (both ends fall back), then the
    rival dialled with it comes up at both ends: frames sent through the fall-back and
    on the rival reach each end once, in order, and both sequences settle."""
    a, b = _pair()
    for end in (a, b):
        end.send(_frame(1), 0.0)
    _pump(a, 0.0)
    won = (a.direct_link(1.0), b.direct_link(1.0))
    for end in (a, b):
        end.send(_frame(2), 1.1)  # on the winner, in the relayed sequence: lost with it
    fell = (a.cut(won[0], 1.2), b.cut(won[1], 1.2))
    for end in (a, b):
        end.send(_frame(3), 1.3)  # through the relay
    rivals = (a.direct_link(1.4), b.direct_link(1.4))
    for end in (a, b):
        end.send(_frame(4), 1.5)  # on the rival
    for now in (1.5, 1.75, 2.0):
        _pump(a, now)
        for end in (a, b):
            end.tick(now)
    _pump(a, 2.0)
    frames = [_frame(i) for i in range(1, 5)]
    assert (
        (True, True),
        (frames, frames),
        (True, True),
        (True, True),
    ) == (
        fell,
        (a.delivered, b.delivered),
        (a.paths.settled(b.keys.node_id), b.paths.settled(a.keys.node_id)),
        (plain(a, rivals[0]), plain(b, rivals[1])),
    )


def test_a_fall_back_to_a_peer_the_relay_cannot_reach_closes_the_relayed_link() -> None:
    """b falls back, and the relay answers ``unreachable`` for a frame to a (a is not
    there): b's relayed link closes at once; the same answer on a relayed link that no
    fall-back opened changes nothing."""
    a, b = _pair()
    b.send(_frame(1), 0.0)
    _pump(a, 0.0)
    plain = b.links[a.keys.node_id]
    b.switch.unreachable(a.keys.node_id, RELAY, 0.5)
    link = b.direct_link(1.0)
    _pump(a, 1.0)
    fell = b.cut(link, 2.0)
    relayed = b.links[a.keys.node_id]
    b.switch.unreachable(a.keys.node_id, RELAY, 2.1)
    assert (True, LinkState.UP, "the relay cannot reach the peer") == (
        fell,
        plain.state,
        relayed.down_reason,
    )


def _relay_link(end: End, relay: str, url: str, rtt: float) -> None:
    """``end`` is attached to one more relay, linked at ``url``."""
    end.paths.relay_attached(relay, None, rtt, 0.0)
    end.links[relay] = PeerLink(
        PeerInfo(relay, "", None, "", relay=True),
        _Socket(),
        outbound=True,
        on_frame=lambda link, frame: None,
        on_down=lambda link, reason: None,
        address=url,
        v2=True,
    )


def test_a_fall_back_to_a_relay_without_the_peer_moves_to_another_relay_it_listed() -> None:
    """Both ends fall back; b's relay lost a (a fell back through another relay): the
    relay answers ``unreachable``, and b moves a to r2, the relay a's hello listed (not
    r3, closer but not listed), resending what r lost; the calls go on. A late answer
    from r changes nothing; r2 answering ``unreachable`` too closes the link."""
    a, b = _pair()
    b.hello_relays = ("http://192.0.2.2:7000",)
    _relay_link(b, "r2", "http://192.0.2.2:7000/", 0.05)
    _relay_link(b, "r3", "http://192.0.2.3:7000", 0.02)
    b.send(_frame(1), 0.0)
    _pump(a, 0.0)
    links = (a.direct_link(1.0), b.direct_link(1.0))
    _pump(a, 1.0)
    fell = (a.cut(links[0], 2.0), b.cut(links[1], 2.0))
    relayed = b.links[a.keys.node_id]
    b.send(_frame(2), 2.0)
    b.relay.clear()  # r no longer has a: it drops b's frames for it
    b.switch.unreachable(a.keys.node_id, RELAY, 2.1)
    _pump(a, 2.1)
    moved = (b.paths.path(a.keys.node_id), relayed.state, b.switch.moved)
    b.switch.unreachable(a.keys.node_id, RELAY, 2.2)
    late = (b.paths.path(a.keys.node_id), relayed.state)
    b.switch.unreachable(a.keys.node_id, "r2", 2.3)
    assert (
        (True, True),
        ((PathState.RELAYED, "r2"), LinkState.UP, 1),
        ((PathState.RELAYED, "r2"), LinkState.UP),
        [_frame(1), _frame(2)],
        "the relay cannot reach the peer",
    ) == (fell, moved, late, a.delivered, relayed.down_reason)


def test_a_peer_whose_hello_listed_no_relays_moves_to_any_other_attached_relay() -> None:
    """b falls back and its relay answers ``unreachable``; a's hello listed no relays
    (an older peer): b tries its other attached relay, r3."""
    a, b = _pair()
    _relay_link(b, "r3", "http://192.0.2.3:7000", 0.02)
    b.send(_frame(1), 0.0)
    _pump(a, 0.0)
    link = b.direct_link(1.0)
    _pump(a, 1.0)
    fell = b.cut(link, 2.0)
    b.switch.unreachable(a.keys.node_id, RELAY, 2.1)
    assert (True, (PathState.RELAYED, "r3"), LinkState.UP) == (
        fell,
        b.paths.path(a.keys.node_id),
        b.links[a.keys.node_id].state,
    )


def test_a_settled_direct_link_carries_call_frames_plainly_and_still_falls_back() -> None:
    """Both ends' switch settled and retired (the sequences kept for a fall-back): b's
    reply frame of a call goes plainly on the direct link, like a gossip frame after it,
    and both die with it. Both ends fall back to the relay all the same; nothing of the
    sequence is resent (it was settled): what a call lost there its ends send again
    themselves (mesh/call_hold.py). (Before, call frames went in the kept sequence, at
    two to three times the CPU per frame.)"""
    a, b = _pair()
    a.send(_frame(1), 0.0)
    _pump(a, 0.0)
    links = (a.direct_link(1.0), b.direct_link(1.0))
    _pump(a, 1.0)
    for end in (a, b):
        end.tick(1.0 + RETIRE_S)
    _pump(a, 1.0 + RETIRE_S)
    reply = encode_frame("frame", sid="s1", f={"event": "token", "data": {"i": 7}})
    b.send(reply, 2.0 + RETIRE_S)
    b.send(_frame(2), 2.0 + RETIRE_S)
    sent = [cbor2.loads(frame).get("t") for frame in links[1]._queue]
    links[1]._queue.clear()  # on the wire when the link dies
    modes = (plain(a, links[0]), plain(b, links[1]))
    kept = (b.keys.node_id in a.switch.kept, a.keys.node_id in b.switch.kept)
    fell = (a.cut(links[0], 2.1 + RETIRE_S), b.cut(links[1], 2.1 + RETIRE_S))
    _pump(a, 2.1 + RETIRE_S)
    for end in (a, b):
        end.tick(2.5 + RETIRE_S)
    _pump(a, 2.5 + RETIRE_S)
    b.send(_frame(3), 3.0 + RETIRE_S)  # the relayed link that took the dead one's place
    _pump(a, 3.0 + RETIRE_S)
    assert (
        (True, True),
        (True, True),
        ["frame", None],
        (True, True),
        [_frame(3)],
        (PathState.RELAYED, PathState.RELAYED),
    ) == (
        modes,
        kept,
        sent,
        fell,
        a.delivered,
        (a.paths.path(b.keys.node_id)[0], b.paths.path(a.keys.node_id)[0]),
    )
