"""A call streaming to a peer whose direct link dies with no relay to fall back to (spec
§8; mesh/path_hold.py, mesh/call_hold.py): the peer's sequence is held for a re-dial, and
the call is tied to it, so it goes on over the re-dialled link with every chunk once, in
order; with no link in time it ends with a clear error. Real nodes over loopback,
in-process: a relay and two members that reach each other through it, then directly,
the relay stopped before the stream starts."""

from __future__ import annotations

import asyncio

from hearthnet.mesh.path_hold import CALLS_ENDED, HOLD_S
from hearthnet.mesh.path_switch import PathSwitch
from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import wait_until
from tests.mesh.streams import stream_chunks
from tests.mesh.test_path_hold_links import _cut, without_relay
from tests.mesh.test_relaying import path_to

CHUNKS = 150
CUT_AT = 40  # chunks received when a's direct link to b is cut
DOWN_S = 1.0  # how long the link stays down before a re-dials


def _switches(a: Node, b: Node) -> tuple[PathSwitch, PathSwitch]:
    switches = (a.mesh.relaying.switch, b.mesh.relaying.switch)
    assert switches[0] is not None
    assert switches[1] is not None
    return switches[0], switches[1]


def _held(switches: tuple[PathSwitch, PathSwitch]) -> tuple[tuple[int, int, int], ...]:
    return tuple((s.held.held, s.held.resumed, s.held.expired) for s in switches)


async def test_a_call_streaming_across_a_cut_with_no_relay_goes_on_after_a_redial(
    make_config: MakeConfig,
) -> None:
    """echo.stream from b to a over their direct link, no relay left; at chunk 40 the
    link is cut at a's socket (both ends see it die), and a re-dials 1 s later: both
    ends held the sequence and took it up, and the stream ends with every chunk once,
    in order."""
    async with without_relay(make_config, direct=True) as (a, b):
        switches = _switches(a, b)
        before = _held(switches)

        async def cut_and_redial() -> None:
            _cut(a, b)
            await wait_until(
                lambda: (path_to(a, b), path_to(b, a)) == (None, None), 10, "the cut seen"
            )
            await asyncio.sleep(DOWN_S)
            a.mesh.spawn(a.mesh.dial(b.url), "redial-b")

        streamed = await stream_chunks(
            a, b, chunks=CHUNKS, at=CUT_AT, step=cut_and_redial, dial=False
        )
        after = _held(switches)
    counts = tuple(
        tuple(x - y for x, y in zip(n, o, strict=True)) for n, o in zip(after, before, strict=True)
    )
    # the chunks' count and last frame first: a failure shows them, not a 150-item list
    assert (CHUNKS, "done", ((1, 1, 0), (1, 1, 0)), list(range(1, CHUNKS + 1))) == (
        len(streamed.got),
        streamed.kinds[-1],
        counts,
        streamed.got,
    )


async def test_a_call_to_a_peer_not_back_within_the_hold_ends_with_a_clear_error(
    make_config: MakeConfig,
) -> None:
    """The same cut with no re-dial: the stream stops at the cut and, once the hold is
    over (HOLD_S), ends with an ``unavailable`` error saying no link took the dead one's
    place in time; both ends count the held sequence expired."""
    async with without_relay(make_config, direct=True) as (a, b):
        switches = _switches(a, b)
        before = _held(switches)

        async def cut() -> None:
            _cut(a, b)

        streamed = await stream_chunks(a, b, chunks=CHUNKS, at=CUT_AT, step=cut, dial=False)
        await wait_until(lambda: _held(switches)[1][2] > before[1][2], HOLD_S, "b's hold over")
        after = _held(switches)
    counts = tuple(
        tuple(x - y for x, y in zip(n, o, strict=True)) for n, o in zip(after, before, strict=True)
    )
    assert (
        "error",
        "unavailable",
        CALLS_ENDED.format(peer=b.keys.node_id, s=HOLD_S),
        ((1, 0, 1), (1, 0, 1)),
    ) == (
        streamed.kinds[-1],
        streamed.last.get("code"),
        streamed.last.get("message"),
        counts,
    )
