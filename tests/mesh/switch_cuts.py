"""Cuts of a settled direct link on one of its frames, for the tests of what calls send
again at a fall-back (spec §8): a relayed trio (tests/mesh/conftest.py) whose a–b link
went direct and settled, the fall-backs and re-sent frames counted, and a cut aimed at a
frame kind."""

from __future__ import annotations

import time

import cbor2

from hearthnet.mesh.path_switch import RETIRE_S, PathSwitch
from hearthnet.node import Node
from tests.helpers import wait_until
from tests.mesh.conftest import RelayedTrio

Counts = tuple[int, int, int]


def link_switches(trio: RelayedTrio) -> tuple[PathSwitch, PathSwitch]:
    switches = (trio.a.mesh.relaying.switch, trio.b.mesh.relaying.switch)
    assert switches[0] is not None
    assert switches[1] is not None
    return switches[0], switches[1]


def fallback_counts(trio: RelayedTrio) -> Counts:
    """Fall-backs at a and b, and call frames a sent again, since start."""
    a, b = link_switches(trio)
    return a.fallbacks, b.fallbacks, trio.a.mesh.remote.resent


def counts_since(trio: RelayedTrio, before: Counts) -> Counts:
    now = fallback_counts(trio)
    return now[0] - before[0], now[1] - before[1], now[2] - before[2]


def plain_link(node: Node, peer: Node) -> bool:
    return node.mesh.links[peer.keys.node_id].sequencer is None


async def settle_direct(trio: RelayedTrio) -> None:
    """a dials b; once the switch settled at both ends (plain frames), each retires it
    as if RETIRE_S were up: the relayed sequence is kept for a fall-back."""
    a, b = trio.a, trio.b
    a.mesh.spawn(a.mesh.dial(b.url), "dial-b")
    await wait_until(
        lambda: trio.paths() == ("direct", "direct") and plain_link(a, b) and plain_link(b, a),
        20,
        "the switch settled at both ends",
    )
    switches = link_switches(trio)
    for switch in switches:
        switch.tick(time.monotonic() + RETIRE_S)
    kept = (b.keys.node_id in switches[0].kept, a.keys.node_id in switches[1].kept)
    assert (True, True) == kept


def cut_on(trio: RelayedTrio, kind: str) -> list[str]:
    """The cut falls on a's next frame of ``kind`` to b: the direct link's ``sequencer``
    (the hook path_switch.py numbers frames through) sees it first, shuts a's socket,
    and lets the frame be queued plainly, on the dead socket. Returns where the kinds
    cut on are recorded."""
    link = trio.a.mesh.links[trio.b.keys.node_id]
    cut: list[str] = []

    def sequencer(data: bytes) -> bool:
        if not cut and cbor2.loads(data).get("t") == kind:
            trio.cut()
            cut.append(kind)
        return False

    link.sequencer = sequencer
    return cut
