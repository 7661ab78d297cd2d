"""A member's path to a peer after the relayed and direct links cross (spec §8: the link
moves to the direct path, the relay kept as fallback): both ends driven step by step as
the relaying glue drives them (the wiring of tests/mesh/test_path_switch_ends.py), a
relay that is a list, no sockets."""

from __future__ import annotations

from hearthnet.mesh.links import PeerLink
from hearthnet.mesh.path_hold import CALLS_ENDED, HOLD_S, MAX_HELD, HeldSequences
from hearthnet.mesh.path_switch import RETIRE_S
from hearthnet.mesh.paths import PathCore, PathState
from hearthnet.mesh.protocol import LinkState
from hearthnet.mesh.relayed_link import RelayedLink
from tests.mesh.test_path_switch_ends import (
    RELAY,
    End,
    _frame,
    _pair,
    _pump,
    _relay_link,
    plain,
)


def _direct_alone(end: End, now: float) -> PeerLink:
    """A direct link to the peer admitted while ``end`` has no relayed link to it (a probe
    still out, or none yet): nothing to replace, the glue's ``link_up`` check only."""
    end.links.pop(end.peer, None)
    link = end._new_direct()
    end.switch.established(link)
    end.links[end.peer] = end.direct = link
    end.now = now
    end.switch.direct_serves(end.peer, now)
    return link


def test_a_relayed_path_opened_after_the_direct_link_came_up_goes_direct() -> None:
    """b's relayed frame reaches a after a's direct link to b came up: a's path to b is
    direct with the relay as fallback (not relayed), a cut falls back to the relay, and a
    frame sent after it arrives once."""
    a, b = _pair()
    b.send(_frame(1), 0.0)  # b's relayed link: its frame waits in the relay
    link = _direct_alone(a, 0.5)
    _pump(a, 1.0)  # the relay hands b's frame to a: a's path core connects back
    path = a.paths.path(b.keys.node_id)
    fell = a.cut(link, 2.0)
    a.send(_frame(2), 2.0)
    _pump(a, 2.0)
    assert (
        (PathState.DIRECT, RELAY),
        True,
        True,
        [_frame(1)],
        [_frame(2)],
    ) == (
        path,
        fell,
        isinstance(a.links[b.keys.node_id], RelayedLink),
        a.delivered,
        b.delivered,
    )


def test_a_probe_out_when_the_direct_link_comes_up_goes_direct_at_admission() -> None:
    """a's path to b is relayed (a probe out, no relayed link yet) when a direct link is
    admitted: the path moves to it at once; after the switch retires it is kept."""
    a, b = _pair()
    a.carry(a.paths.connect(b.keys.node_id, 0.0))
    state = a.paths.path(b.keys.node_id)[0]
    _direct_alone(a, 0.5)
    path = a.paths.path(b.keys.node_id)
    a.tick(0.5 + RETIRE_S)
    assert (PathState.RELAYED, (PathState.DIRECT, RELAY), {b.keys.node_id}) == (
        state,
        path,
        a.switch.kept,
    )


def _no_relay_cut(a: End, b: End) -> tuple[bool, bool]:
    """Relayed frame 1, a switch, both ends' relay lost, then b's frames 2 and 3 on the
    direct link in the relayed sequence: 2 reaches a (not yet acknowledged), 3 dies with
    the link, cut at both ends. Returns whether each end fell back."""
    b.send(_frame(1), 0.0)
    _pump(a, 0.0)
    links = (a.direct_link(1.0), b.direct_link(1.0))
    b.send(_frame(2), 1.1)  # sequenced: frame 1 is not acknowledged yet
    for end in (a, b):  # the relay dies: nothing to fall back to from now on
        end.carry(end.paths.relay_lost(RELAY, 1.2))
    a.relay.clear()
    _pump(a, 1.2)  # frame 2 arrives on the direct link
    b.send(_frame(3), 1.3)
    return a.cut(links[0], 2.0), b.cut(links[1], 2.0)


def test_a_direct_link_dying_with_no_relay_holds_the_sequence_for_a_redial() -> None:
    """No relay at either end when the direct link dies with b's frames unacknowledged:
    neither falls back, both hold the sequence, and a re-dial 3 s later resends what
    was lost on the new link: a hands on 1-4 once, in order."""
    a, b = _pair()
    fell = _no_relay_cut(a, b)
    held = (a.paths.path(b.keys.node_id)[0], b.paths.settled(a.keys.node_id))
    for end in (a, b):
        _direct_alone(end, 5.0)
    _pump(a, 5.0)
    b.send(_frame(4), 5.1)
    _pump(a, 5.1)
    for end in (a, b):
        end.tick(6.0)
    _pump(a, 6.0)
    assert (
        (False, False),
        (PathState.DOWN, False),
        [_frame(i) for i in range(1, 5)],
        ((1, 1, 0), (1, 1, 0)),
        True,
    ) == (
        fell,
        held,
        a.delivered,
        tuple((e.switch.held.held, e.switch.held.resumed, e.switch.held.expired) for e in (a, b)),
        b.paths.settled(a.keys.node_id),
    )


def test_a_held_sequence_goes_through_a_relay_attached_later() -> None:
    """The same cut, then the relay attached again at both ends (no re-dial): b's path
    core resends what a did not acknowledge through it, a hands on 1-4 once, in order,
    and the held sequences count as resumed once their time is up."""
    a, b = _pair()
    _no_relay_cut(a, b)
    for end in (a, b):
        end.carry(end.paths.relay_attached(RELAY, None, 0.01, 5.0))
    _pump(a, 5.0)
    b.relayed_link()  # the glue opens one with the peer's first frame
    b.send(_frame(4), 5.1)
    for end in (a, b):
        end.tick(5.2 + RETIRE_S)
    _pump(a, 5.2 + RETIRE_S)
    assert (
        [_frame(i) for i in range(1, 5)],
        ((1, 1, 0), (1, 1, 0)),
        (PathState.RELAYED, PathState.RELAYED),
    ) == (
        a.delivered,
        tuple((e.switch.held.held, e.switch.held.resumed, e.switch.held.expired) for e in (a, b)),
        (a.paths.path(b.keys.node_id)[0], b.paths.path(a.keys.node_id)[0]),
    )


def test_a_held_sequence_with_no_link_in_time_is_forgotten() -> None:
    """No link within HOLD_S: both ends forget the sequence (a later link starts a new
    one)."""
    a, b = _pair()
    _no_relay_cut(a, b)
    for end in (a, b):
        end.tick(2.0 + HOLD_S)
    assert ((1, 0, 1), (0, None)) == (
        (b.switch.held.held, b.switch.held.resumed, b.switch.held.expired),
        b.paths.numbers(a.keys.node_id),
    )


def test_at_most_max_held_sequences_are_held_the_oldest_forgotten_first() -> None:
    """One peer past MAX_HELD: the one held longest is forgotten, and its calls end."""
    forgotten: list[str] = []
    ended: list[str] = []
    held = HeldSequences(PathCore("a", []), forgotten.append)
    held.ended = lambda peer, why: ended.append(peer)
    for i in range(MAX_HELD + 1):
        held.hold(f"p{i}", float(i))
    assert (["p0"], ["p0"], False, True, MAX_HELD) == (
        forgotten,
        ended,
        "p0" in held,
        f"p{MAX_HELD}" in held,
        held.held - held.expired,
    )


def test_what_is_sent_on_the_dead_link_while_held_goes_on_over_the_redial() -> None:
    """Calls tied to the held sequence: b's frame 4 (a call's reply) sent on the dead
    direct link while held waits in the sequence, and the held sequence names that link
    for frames to a (a call's acks); a re-dial brings 1-4 to a once, in order, and frame
    5, sent on the dead link after the re-dial, goes to the new one."""
    a, b = _pair()
    _no_relay_cut(a, b)
    dead = b.direct
    assert dead is not None
    took = dead.send_raw(_frame(4))
    named = b.switch.held.link(a.keys.node_id) is dead
    for end in (a, b):
        _direct_alone(end, 5.0)
    _pump(a, 5.0)
    dead.send_raw(_frame(5))
    _pump(a, 5.1)
    assert (True, True, None, [_frame(i) for i in range(1, 6)]) == (
        took,
        named,
        b.switch.held.link(a.keys.node_id),
        a.delivered,
    )


def test_the_calls_of_a_held_sequence_forgotten_end_with_a_clear_error() -> None:
    """No link within HOLD_S: both ends forget the sequence and end the calls tied to it
    (:data:`CALLS_ENDED`), and a frame sent on the dead link after that is dropped; a
    sequence taken up in time ends no calls."""
    a, b = _pair()
    ended: list[tuple[str, str]] = []
    for end in (a, b):
        end.switch.held.ended = lambda peer, why: ended.append((peer, why))
    _no_relay_cut(a, b)
    dead = b.direct
    assert dead is not None
    _direct_alone(a, 3.0)  # a took it up (its own re-dial); b did not
    for end in (a, b):
        end.tick(2.0 + HOLD_S)
    why = CALLS_ENDED.format(peer=a.keys.node_id, s=HOLD_S)
    assert ([(a.keys.node_id, why)], False) == (ended, dead.send_raw(_frame(4)))


def test_a_direct_link_up_while_a_relayed_frame_is_unacknowledged_continues_its_sequence() -> None:
    """a's path to b is relayed with frame 1 still in the relay (no relayed link yet)
    when a direct link comes up: frame 2, sent on the direct link and arriving first,
    is handed on after frame 1 at b; once a's sequence is acknowledged, the direct link
    goes plain."""
    a, b = _pair()
    a.carry(a.paths.connect(b.keys.node_id, 0.0))
    a.carry(a.paths.send(b.keys.node_id, _frame(1), 0.0))  # waits in the relay
    link = _direct_alone(a, 0.5)
    b.direct_link(0.5)
    a.send(_frame(2), 0.6)
    b.off_direct(link._queue.popleft())  # the direct link is faster than the relay
    _pump(a, 0.7)
    settled = _settle(a)
    assert ([_frame(1), _frame(2)], True, True) == (b.delivered, settled, plain(a, link))


def _settle(end: End) -> bool:
    """Acks exchanged and the switch's tick: True once ``end``'s sequence is settled."""
    end.tick(1.0)
    end.other.tick(1.0)
    _pump(end, 1.0)
    end.tick(1.1)
    return end.paths.settled(end.peer)


def test_a_relayed_peer_the_relay_no_longer_has_moves_to_the_other_attached_relay() -> None:
    """No fall-back: a reaches b through r, and r answers ``unreachable`` for b (b left
    it): a moves b to r2, its other attached relay, resending what b did not acknowledge,
    and the relayed link stays; a late answer from r changes nothing, and r2 answering
    ``unreachable`` too leaves the link to its heartbeats (nothing left to try)."""
    a, b = _pair()
    _relay_link(a, "r2", "http://192.0.2.2:7000", 0.05)
    a.carry(a.paths.connect(b.keys.node_id, 0.0))
    a.send(_frame(1), 0.0)
    _pump(a, 0.0)
    a.send(_frame(2), 0.05)
    a.relay.clear()  # r no longer has b: it drops a's frame
    a.switch.unreachable(b.keys.node_id, RELAY, 0.1)
    _pump(a, 0.1)
    moved = (a.paths.path(b.keys.node_id), a.switch.moved)
    a.switch.unreachable(b.keys.node_id, RELAY, 0.2)
    late = a.paths.path(b.keys.node_id)
    a.switch.unreachable(b.keys.node_id, "r2", 0.3)
    assert (
        ((PathState.RELAYED, "r2"), 1),
        (PathState.RELAYED, "r2"),
        [_frame(1), _frame(2)],
        LinkState.UP,
        1,
    ) == (moved, late, b.delivered, a.links[b.keys.node_id].state, a.switch.moved)


def test_unreachable_moves_a_peer_to_the_relay_its_frames_come_through() -> None:
    """b is on r alone and its link to r blinks: r answers ``unreachable``, a tries r2
    (b is not there either); b's frames then come through r again, and r2's
    ``unreachable`` moves a back to r at once, although r was tried."""
    a, b = _pair()
    _relay_link(a, "r2", "http://192.0.2.2:7000", 0.05)
    b.send(_frame(1), 0.0)
    _pump(a, 0.0)
    a.switch.came_via[b.keys.node_id] = RELAY  # as the glue records b's frames' relay
    a.switch.unreachable(b.keys.node_id, RELAY, 0.1)
    tried = a.paths.path(b.keys.node_id)
    a.switch.came_via[b.keys.node_id] = RELAY  # b is back on r: its next frame came so
    a.switch.unreachable(b.keys.node_id, "r2", 0.2)
    assert ((PathState.RELAYED, "r2"), (PathState.RELAYED, RELAY), 2) == (
        tried,
        a.paths.path(b.keys.node_id),
        a.switch.moved,
    )


def test_the_relay_a_peers_frames_came_through_is_forgotten_when_it_goes_direct_or_is_lost() -> (
    None
):
    """``came_via`` names the relay a peer's relayed frames came through last: a direct
    link replacing b's relayed one clears b's; a relay lost (or detaching us) clears the
    peers it named at the next tick, and leaves those another relay names."""
    a, b = _pair()
    peer = b.keys.node_id
    b.send(_frame(1), 0.0)
    _pump(a, 0.0)
    a.switch.came_via[peer] = RELAY  # as the glue records b's frames' relay
    a.direct_link(0.5)
    direct = dict(a.switch.came_via)
    _relay_link(a, "r2", "http://192.0.2.2:7000", 0.05)
    a.switch.came_via.update({peer: "r2", "ed25519:other": RELAY})
    a.carry(a.paths.relay_lost("r2", 1.0))
    a.tick(1.0)
    assert ({}, {"ed25519:other": RELAY}) == (direct, a.switch.came_via)
