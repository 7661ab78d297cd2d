"""Calls across a settled direct link that dies on one of their frames (spec §8: a
direct link "falls back to the relay" and nothing is lost): the link carries call frames
plainly once its switch settled, and at the fall-back each end of a call sends again what
the dead link may have lost (mesh/call_hold.py). Here the cut falls exactly on a call's
opening, or on its ``cancel``: the frame is queued on a's socket after it was shut down.
Real nodes over loopback (the shared relayed set-up, tests/mesh/conftest.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

import cbor2
import pytest

from hearthnet.client import Client
from hearthnet.mesh.path_switch import RETIRE_S, PathSwitch
from hearthnet.node import Node
from tests.helpers import wait_until
from tests.mesh.conftest import RelayedTrio

Counts = tuple[int, int, int]


def _switches(trio: RelayedTrio) -> tuple[PathSwitch, PathSwitch]:
    switches = (trio.a.mesh.relaying.switch, trio.b.mesh.relaying.switch)
    assert switches[0] is not None
    assert switches[1] is not None
    return switches[0], switches[1]


def _counts(trio: RelayedTrio) -> Counts:
    """Fall-backs at a and b, and call frames a sent again, since start."""
    a, b = _switches(trio)
    return a.fallbacks, b.fallbacks, trio.a.mesh.remote.resent


def _since(trio: RelayedTrio, before: Counts) -> Counts:
    now = _counts(trio)
    return now[0] - before[0], now[1] - before[1], now[2] - before[2]


def _plain(node: Node, peer: Node) -> bool:
    return node.mesh.links[peer.keys.node_id].sequencer is None


async def _settled_direct(trio: RelayedTrio) -> None:
    """a dials b; once the switch settled at both ends (plain frames), each retires it
    as if RETIRE_S were up: the relayed sequence is kept for a fall-back."""
    a, b = trio.a, trio.b
    a.mesh.spawn(a.mesh.dial(b.url), "dial-b")
    await wait_until(
        lambda: trio.paths() == ("direct", "direct") and _plain(a, b) and _plain(b, a),
        20,
        "the switch settled at both ends",
    )
    switches = _switches(trio)
    for switch in switches:
        switch.tick(time.monotonic() + RETIRE_S)
    kept = (b.keys.node_id in switches[0].kept, a.keys.node_id in switches[1].kept)
    assert (True, True) == kept


def _cut_on(trio: RelayedTrio, kind: str) -> list[str]:
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


def _incoming_from(node: Node, peer: Node) -> Callable[[], object | None]:
    def find() -> object | None:
        for (via, _), incoming in node.mesh.remote.incoming.items():
            if via == peer.keys.node_id:
                return incoming
        return None

    return find


@pytest.mark.asyncio(loop_scope="session")
async def test_a_call_whose_opening_dies_with_the_direct_link_is_answered_through_the_relay(
    relayed_trio: RelayedTrio,
) -> None:
    """a calls b on a settled direct link and the link dies with the call's opening on
    it (b never saw it): both ends fall back, a sends the opening again through the
    relay, and the stream ends with every chunk once, in order."""
    a, b = relayed_trio.a, relayed_trio.b
    await _settled_direct(relayed_trio)
    before = _counts(relayed_trio)
    cut = _cut_on(relayed_trio, "call")
    got: list[int] = []
    kinds: list[str] = []
    async with (
        Client(a.url, keys=a.keys) as client,
        client.stream(
            "echo.stream@1.0",
            {"count": 30, "size": 64, "interval_ms": 10},
            target=b.keys.node_id,
            prefer_ws=False,
            deadline_ms=30_000,
        ) as stream,
    ):
        async for frame in stream:
            kinds.append(frame.event)
            if frame.event == "token":
                got.append(frame.data["i"])
    since = _since(relayed_trio, before)
    assert (["call"], list(range(1, 31)), "done", (1, 1), True, ("relayed", "relayed")) == (
        cut,
        got,
        kinds[-1],
        since[:2],
        since[2] >= 1,
        relayed_trio.paths(),
    )


@pytest.mark.asyncio(loop_scope="session")
async def test_a_cancel_that_dies_with_the_direct_link_still_ends_the_call_at_the_provider(
    relayed_trio: RelayedTrio,
) -> None:
    """a's client stops reading a long stream from b after 10 chunks, and the direct
    link dies with a's ``cancel`` on it: both ends fall back, a sends the cancel again
    through the relay, and b's call ends cancelled (not on its 5 s ack timeout, which
    does not cancel it)."""
    a, b = relayed_trio.a, relayed_trio.b
    await _settled_direct(relayed_trio)
    before = _counts(relayed_trio)
    cut = _cut_on(relayed_trio, "cancel")
    find = _incoming_from(b, a)
    running = None
    async with Client(a.url, keys=a.keys) as client:
        async with client.stream(
            "echo.stream@1.0",
            {"count": 1000, "size": 64, "interval_ms": 10},
            target=b.keys.node_id,
            prefer_ws=False,
            deadline_ms=30_000,
        ) as stream:
            got = 0
            async for frame in stream:
                got += frame.event == "token"
                if got == 10:
                    running = find()
                    break
        await wait_until(lambda: bool(cut), 10, "a's cancel sent")
        await wait_until(lambda: find() is None, 10, "b's call ended")
    handle = getattr(running, "handle", None)
    since = _since(relayed_trio, before)
    assert (["cancel"], True, (1, 1), True, ("relayed", "relayed")) == (
        cut,
        handle is not None and handle.ctx.cancelled,
        since[:2],
        since[2] >= 1,
        relayed_trio.paths(),
    )
