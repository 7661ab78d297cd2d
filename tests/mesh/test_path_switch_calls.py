"""Calls across a settled direct link that dies on one of their frames (spec §8: a
direct link "falls back to the relay" and nothing is lost): the link carries call frames
plainly once its switch settled, and at the fall-back each end of a call sends again what
the dead link may have lost (mesh/call_hold.py). Here the cut falls exactly on a call's
opening, or on its ``cancel``: the frame is queued on a's socket after it was shut down.
Real nodes over loopback (the shared relayed set-up, tests/mesh/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from hearthnet.client import Client
from hearthnet.node import Node
from tests.helpers import wait_until
from tests.mesh.conftest import RelayedTrio
from tests.mesh.streams import stream_chunks
from tests.mesh.switch_cuts import counts_since, cut_on, fallback_counts, settle_direct


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
    await settle_direct(relayed_trio)
    before = fallback_counts(relayed_trio)
    cut = cut_on(relayed_trio, "call")
    came = await stream_chunks(a, b, chunks=30, at=0, dial=False, deadline_ms=30_000)
    since = counts_since(relayed_trio, before)
    assert (["call"], list(range(1, 31)), "done", (1, 1), True, ("relayed", "relayed")) == (
        cut,
        came.got,
        came.kinds[-1],
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
    await settle_direct(relayed_trio)
    before = fallback_counts(relayed_trio)
    cut = cut_on(relayed_trio, "cancel")
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
    since = counts_since(relayed_trio, before)
    assert (["cancel"], True, (1, 1), True, ("relayed", "relayed")) == (
        cut,
        handle is not None and handle.ctx.cancelled,
        since[:2],
        since[2] >= 1,
        relayed_trio.paths(),
    )
