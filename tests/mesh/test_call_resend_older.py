"""Calls across a settled direct link that dies, and what the ends send again (spec §8;
mesh/call_hold.py), seen from the peer's build: a node built before
``hearthnet-peer.v5`` lists no ``call_resend`` in its hello and answers an opening sent
again for a call it runs with ``capacity_exceeded``, so it is not sent one again: a call
it may never have seen ends at once with a clear ``unavailable``. With a peer that lists
it, what a fall-back sent again is counted in ``/metrics`` and ``/status``. Real nodes
over loopback (the shared relayed set-up, tests/mesh/conftest.py, and the settled link
and cut of tests/mesh/test_path_switch_calls.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import cbor2
import pytest
import pytest_asyncio

from hearthnet.mesh.protocol import SUBPROTOCOLS
from hearthnet.node import Node
from tests.mesh.conftest import RelayedTrio
from tests.mesh.streams import stream_chunks
from tests.mesh.switch_cuts import counts_since, cut_on, fallback_counts, settle_direct


@pytest_asyncio.fixture(loop_scope="session")
async def older_a(relayed_trio: RelayedTrio) -> AsyncIterator[RelayedTrio]:
    """The relayed set-up with a speaking the peer-link versions before v5 only, as a
    node built before them: its direct link to b is v4, and no hello lists features."""
    dialer = relayed_trio.a.mesh.dialer
    dialer.subprotocols = SUBPROTOCOLS[1:]
    try:
        yield relayed_trio
    finally:
        dialer.subprotocols = SUBPROTOCOLS


async def _stream(a: Node, b: Node) -> tuple[list[int], list[str], dict[str, Any]]:
    """``echo.stream`` of 30 chunks from b to a: the chunks' numbers, every frame's
    kind, the last frame's data."""
    came = await stream_chunks(a, b, chunks=30, at=0, dial=False, deadline_ms=30_000)
    return came.got, came.kinds, came.last


def _calls(node: Node) -> dict[str, Any]:
    return node.mesh.remote.counts.status()


@pytest.mark.asyncio(loop_scope="session")
async def test_an_older_peer_is_not_sent_an_opening_again_and_the_call_ends_clearly(
    older_a: RelayedTrio,
) -> None:
    """a and b on a v4 direct link (a as built before v5): the link dies with a call's
    opening on it. Both ends fall back, a does not send the opening again (b would take
    it for a second call and answer ``capacity_exceeded``), and the call ends at once
    with ``unavailable`` saying why (sent again, the opening would have run the call
    here: b is of this build, but on a v4 link it is taken for an older one)."""
    trio = older_a
    a, b = trio.a, trio.b
    await settle_direct(trio)
    peers = (a.mesh.links[b.keys.node_id].peer, b.mesh.links[a.keys.node_id].peer)
    before, calls = fallback_counts(trio), (_calls(a), _calls(b))
    cut = cut_on(trio, "call")
    got, kinds, last = await _stream(a, b)
    since = counts_since(trio, before)
    assert (
        [(4, False), (4, False)],
        ["call"],
        [],
        ["error"],
        "unavailable",
        True,
        (1, 1),
        (1, 0, 0),
        ("relayed", "relayed"),
    ) == (
        [(p.link, p.takes_call_resends) for p in peers],
        cut,
        got,
        kinds,
        last.get("code"),
        "cannot take the call again" in str(last.get("message")),
        since[:2],
        (
            _calls(a)["older_peer_ended"] - calls[0]["older_peer_ended"],
            _calls(a)["resent"]["call"] - calls[0]["resent"]["call"],
            _calls(b)["openings_dropped"] - calls[1]["openings_dropped"],
        ),
        trio.paths(),
    )


def _cut_on_reply(trio: RelayedTrio) -> list[str]:
    """The cut falls on b's first reply ``frame`` to a (a's socket is shut as b queues
    it): b has the call, a never hears of it. Returns the kinds cut on."""
    link = trio.b.mesh.links[trio.a.keys.node_id]
    cut: list[str] = []

    def sequencer(data: bytes) -> bool:
        if not cut and cbor2.loads(data).get("t") == "frame":
            trio.cut()
            cut.append("frame")
        return False

    link.sequencer = sequencer
    return cut


async def _shown(node: Node) -> tuple[dict[str, Any], dict[str, float]]:
    """``relaying.paths.calls`` in ``/status``, and ``/metrics``' call resend series."""
    async with aiohttp.ClientSession() as http:
        async with http.get(node.url + "/status") as resp:
            calls = (await resp.json())["relaying"]["paths"]["calls"]
        async with http.get(node.url + "/metrics") as resp:
            lines = (await resp.text()).splitlines()
    metrics = {
        name: float(value)
        for name, value in (line.rsplit(" ", 1) for line in lines if line[:1] != "#")
        if "call_frames_resent" in name or "call_openings" in name or "older_peer" in name
    }
    return calls, metrics


@pytest.mark.asyncio(loop_scope="session")
async def test_what_a_fall_back_sent_again_is_counted(relayed_trio: RelayedTrio) -> None:
    """a and b on a v5 direct link, both listing ``call_resend``: the link dies with b's
    first reply frame of a's call on it. Both fall back; a sends the opening again (it had
    no answer) and b drops it as taken, b sends its reply frames again, and the stream
    ends whole. ``/metrics`` and ``/status`` count it at both ends."""
    trio = relayed_trio
    a, b = trio.a, trio.b
    await settle_direct(trio)
    peers = (a.mesh.links[b.keys.node_id].peer, b.mesh.links[a.keys.node_id].peer)
    before = (await _shown(a), await _shown(b))
    cut = _cut_on_reply(trio)
    got, kinds, _ = await _stream(a, b)
    after = (await _shown(a), await _shown(b))
    a_metrics, b_metrics = after[0][1], after[1][1]

    def grew(end: int, name: str) -> float:
        return after[end][1][name] - before[end][1][name]

    call = 'hearthnet_call_frames_resent{kind="call"}'
    frame = 'hearthnet_call_frames_resent{kind="frame"}'
    assert (
        [(5, True), (5, True)],
        ["frame"],
        list(range(1, 31)),
        "done",
        (1.0, 1.0, True),
        (
            after[0][0]["resent"]["call"] - before[0][0]["resent"]["call"],
            after[1][0]["openings_dropped"] - before[1][0]["openings_dropped"],
            after[1][0]["resent"]["frame"] > before[1][0]["resent"]["frame"],
        ),
        (a_metrics["hearthnet_calls_ended_older_peer"], len(b_metrics) >= 7),
        ("relayed", "relayed"),
    ) == (
        [(p.link, p.takes_call_resends) for p in peers],
        cut,
        got,
        kinds[-1],
        (grew(0, call), grew(1, "hearthnet_call_openings_dropped"), grew(1, frame) >= 1),
        (1, 1, True),
        (before[0][1]["hearthnet_calls_ended_older_peer"], True),
        trio.paths(),
    )
