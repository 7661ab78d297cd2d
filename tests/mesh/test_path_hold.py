"""A member's path to a peer after the relayed and direct links cross (spec §8: the link
moves to the direct path, the relay kept as fallback): both ends driven step by step as
the relaying glue drives them (the wiring of tests/mesh/test_path_switch_ends.py), a
relay that is a list, no sockets."""

from __future__ import annotations

from hearthnet.mesh.links import PeerLink
from hearthnet.mesh.path_switch import RETIRE_S
from hearthnet.mesh.paths import PathState
from hearthnet.mesh.relayed_link import RelayedLink
from tests.mesh.test_path_switch_ends import RELAY, End, _frame, _pair, _pump


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
