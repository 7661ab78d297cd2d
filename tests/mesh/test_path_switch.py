"""A relayed link that turns direct while a call streams across it (spec §8: "the link
moves to the direct path with no frame lost or duplicated", and "falls back to the relay
if the direct path dies"): the stream goes on and ends with every chunk once, in order.
Real nodes over loopback (the shared relayed set-up, tests/mesh/conftest.py), and the
path core alone."""

from __future__ import annotations

import time

import pytest

from hearthnet.mesh.path_frames import PathFrame, PFrame
from hearthnet.mesh.path_switch import RETIRE_S
from hearthnet.mesh.paths import Action, Deliver, PathCore, Transmit
from hearthnet.node import Node
from tests.helpers import wait_until
from tests.mesh.conftest import RelayedTrio
from tests.mesh.streams import Step, Streamed, stream_chunks

CHUNKS = 120
SWITCH_AT = 30  # chunks received before the direct link is dialled


async def _stream(trio: RelayedTrio, at_switch: Step | None, chunks: int = CHUNKS) -> Streamed:
    """echo.stream of ``chunks`` from b to a; at chunk SWITCH_AT a dials b and
    ``at_switch`` is spawned."""
    return await stream_chunks(
        trio.a, trio.b, chunks=chunks, at=SWITCH_AT, step=at_switch, deadline_ms=30_000
    )


def _plain(node: Node, peer: Node) -> bool:
    """Whether ``node``'s link to ``peer`` carries plain frames (its switch settled; the
    sequence may still be kept for a fall-back)."""
    return node.mesh.links[peer.keys.node_id].sequencer is None


@pytest.mark.asyncio(loop_scope="session")
async def test_a_stream_across_the_switch_to_direct_loses_and_repeats_nothing(
    relayed_trio: RelayedTrio,
) -> None:
    """echo.stream from b to a while a dials b: every chunk once, in order, then done."""
    a, b = relayed_trio.a, relayed_trio.b
    streamed = await _stream(relayed_trio, None)
    # both ends settle well before the relayed sequence is retired (10 s): the direct
    # link carries plain frames again, call frames too
    await wait_until(lambda: _plain(a, b) and _plain(b, a), 5, "the direct links plain again")
    assert (list(range(1, CHUNKS + 1)), "done", {"relayed", "direct"}) == (
        streamed.got,
        streamed.kinds[-1],
        streamed.paths,
    )


SWITCH_TRIES = 12  # switches tried until one leaves b's frames on the direct link
# unacknowledged when it dies, and until one does while a's are all acknowledged: a narrower
# window (on a loaded machine about 1 try in 2 goes plain before the check sees b's frames
# unacknowledged: 8 tries all missed it in 1 run of 12). A cut can also come too late: a's
# acknowledgements, written before it, still reach b, which then has nothing to resend.
# A try is ~1 s, and the loop stops at the first try that is cut.
RETIRED_TRIES = 20


async def _cut_try(
    trio: RelayedTrio, *, retire_a: bool = False
) -> tuple[list[int], list[str], str]:
    """One stream across a switch, the direct link cut the moment b has sent frames on it
    that a has not acknowledged (the check and the cut in one step of the event loop);
    with ``retire_a``, a's sequence acknowledged too and a's switch retired first (its
    tick as if its RETIRE_S were up: the two ends' retirements straddle the cut).
    Returns the chunks, the frame kinds, and ``cut``, or ``plain`` when b's frames went
    plainly instead (its relayed sequence acknowledged when the direct link came up, or
    before the check saw them unacknowledged): then nothing was cut."""
    a, b = trio.a, trio.b
    switch_a, switch_b = a.mesh.relaying.switch, b.mesh.relaying.switch
    core_a, core_b = a.mesh.relaying.paths, b.mesh.relaying.paths
    assert switch_a is not None
    assert switch_b is not None
    assert core_a is not None
    assert core_b is not None
    sequenced = switch_b.sequenced
    outcome: list[str] = []

    def b_unacknowledged() -> bool:
        ready = not retire_a or core_a.settled(b.keys.node_id)
        return ready and switch_b.sequenced > sequenced and not core_b.settled(a.keys.node_id)

    def b_plain() -> bool:
        return _plain(b, a)

    async def cut_when_b_sequences() -> None:
        # checked at every turn of the event loop (the nodes run on it), not every 5 ms:
        # b's frames stay unacknowledged on the direct link for a few milliseconds at
        # most, and a coarser look missed that window in all 20 tries of a CI run
        await wait_until(
            lambda: trio.paths() == ("direct", "direct") and (b_unacknowledged() or b_plain()),
            20,
            "the direct link up both ways",
            every_s=0,
        )
        cut = b_unacknowledged()
        if cut and retire_a:
            switch_a.tick(time.monotonic() + RETIRE_S)
            cut = b.keys.node_id in switch_a.kept
        if cut:
            trio.cut()
        outcome.append("cut" if cut else "plain")

    streamed = await _stream(trio, cut_when_b_sequences)
    await wait_until(lambda: bool(outcome), 20, "the switch's try cut, or gone plain")
    return streamed.got, streamed.kinds, outcome[0]


@pytest.mark.asyncio(loop_scope="session")
async def test_a_direct_link_cut_within_the_switch_falls_back_and_resends_in_order(
    relayed_trio: RelayedTrio,
) -> None:
    """The direct link cut while b's frames on it are unacknowledged: both ends fall back
    to the relay, b resends, the stream ends with every chunk once, in order."""
    got, kinds, outcome, fell = await _cut_tries(relayed_trio, retire_a=False)
    assert (
        list(range(1, CHUNKS + 1)),
        "done",
        "cut",
        (1, 1, True),
        ("relayed", "relayed"),
    ) == (got, kinds[-1], outcome, fell, relayed_trio.paths())


@pytest.mark.asyncio(loop_scope="session")
async def test_a_cut_between_the_two_ends_retirements_falls_back_at_both_and_streams_on(
    relayed_trio: RelayedTrio,
) -> None:
    """a has retired the switch (its sequence acknowledged) and b has not when the
    direct link dies with b's frames on it unacknowledged: both ends fall back (a kept
    its sequence and session), b resends, the stream ends with every chunk once, in
    order."""
    got, kinds, outcome, fell = await _cut_tries(relayed_trio, retire_a=True)
    assert (
        list(range(1, CHUNKS + 1)),
        "done",
        "cut",
        (1, 1, True),
        ("relayed", "relayed"),
    ) == (got, kinds[-1], outcome, fell, relayed_trio.paths())


async def _cut_tries(
    trio: RelayedTrio, *, retire_a: bool
) -> tuple[list[int], list[str], str, tuple[int, int, bool]]:
    """Streams across switches until one is cut with b's frames still unacknowledged
    when it falls back (:func:`_cut_try`); returns the last stream's chunks and frame
    kinds, its outcome, and the fall-backs at a and b and whether b resent, counted over
    that try. Every stream before it must have ended whole too."""
    a, b = trio.a, trio.b
    switches = [n.mesh.relaying.switch for n in (a, b)]
    assert switches[0] is not None
    assert switches[1] is not None
    assert b.mesh.relaying.paths is not None
    core_b = b.mesh.relaying.paths
    for _ in range(RETIRED_TRIES if retire_a else SWITCH_TRIES):
        before = (switches[0].fallbacks, switches[1].fallbacks, core_b.stats.resent)
        # the cut itself waited for both ends direct, so the chunks' paths are not asserted
        got, kinds, outcome = await _cut_try(trio, retire_a=retire_a)
        if outcome == "cut" and core_b.stats.resent > before[2]:
            break
        # nothing cut (the stream went direct plainly): the stream is whole. Or a's
        # acknowledgements reached b before it fell back (nothing to resend): b's
        # sequence had settled, and a chunk b sent plainly on the dying link in between
        # was sent again by the call itself at the fall-back (call_hold.py): the stream
        # is whole too. Back to relayed, another switch.
        assert (list(range(1, CHUNKS + 1)), "done") == (got, kinds[-1])
        await trio.relayed()
    after = (switches[0].fallbacks, switches[1].fallbacks, core_b.stats.resent)
    return got, kinds, outcome, (after[0] - before[0], after[1] - before[1], after[2] > before[2])


SETTLED_CHUNKS = 600  # 6 s of stream: the switch settles and is retired well within it


@pytest.mark.asyncio(loop_scope="session")
async def test_a_stream_on_a_settled_direct_link_that_dies_goes_on_through_the_relay(
    relayed_trio: RelayedTrio,
) -> None:
    """The switch settled and retired at both ends (the sequences kept for a fall-back),
    the stream's frames going plainly on the direct link: the link is cut while one of
    b's is still queued on it; both ends fall back, b sends again the reply frames a has
    not acknowledged and a its last ack (call_hold.py), and the stream ends with every
    chunk once, in order. (Before, call frames went in the kept sequence at two to three
    times the CPU per frame, resent by the path core.)"""
    a, b = relayed_trio.a, relayed_trio.b
    switch_a, switch_b = a.mesh.relaying.switch, b.mesh.relaying.switch
    assert switch_a is not None
    assert switch_b is not None
    remote_b = b.mesh.remote
    before = (switch_a.fallbacks, switch_b.fallbacks, remote_b.resent)
    seen: list[object] = []

    async def cut_in_flight() -> None:
        await wait_until(
            lambda: relayed_trio.paths() == ("direct", "direct") and _plain(a, b) and _plain(b, a),
            20,
            "the switch settled at both ends",
        )
        for switch in (switch_a, switch_b):  # as if RETIRE_S were up: the sequences kept
            switch.tick(time.monotonic() + RETIRE_S)
        seen.append((a.keys.node_id in switch_b.kept, b.keys.node_id in switch_a.kept))
        link = b.mesh.links[a.keys.node_id]
        await wait_until(  # the check and the cut in one step of the event loop: what
            # b's link has queued then dies with it
            lambda: bool(link.queued),
            20,
            "b's stream frames on the direct link, one still queued",
        )
        relayed_trio.cut()

    streamed = await _stream(relayed_trio, cut_in_flight, SETTLED_CHUNKS)
    got, kinds = streamed.got, streamed.kinds
    assert (
        (True, True),
        list(range(1, SETTLED_CHUNKS + 1)),
        "done",
        (1, 1, True),
        ("relayed", "relayed"),
    ) == (
        seen[0] if seen else None,
        got,
        kinds[-1],
        (
            switch_a.fallbacks - before[0],
            switch_b.fallbacks - before[1],
            remote_b.resent > before[2],
        ),
        relayed_trio.paths(),
    )


def _carry(actions: list[Action], direct: list[PathFrame], relay: list[PathFrame]) -> list[bytes]:
    """Put the sender's transmits on their path; return what it delivered."""
    out: list[bytes] = []
    for action in actions:
        if isinstance(action, Transmit):
            (relay if action.via is not None else direct).append(action.frame)
        elif isinstance(action, Deliver):
            out.append(action.frame)
    return out


def test_the_path_core_resends_what_a_dead_direct_link_lost_through_the_relay() -> None:
    """Frames 1-10 relayed, 11-20 direct (13-20 lost with the link): after the fall-back
    the receiver hands on 1-20 once, in order."""
    sender, receiver = PathCore("a", ["r"]), PathCore("b", ["r"])
    relay: list[PathFrame] = []
    direct: list[PathFrame] = []
    for core in (sender, receiver):
        core.relay_attached("r", None, 0.01, 0.0)
    delivered: list[bytes] = []

    def deliver(frames: list[PathFrame]) -> None:
        """The receiver takes ``frames`` (its acks go back to the sender at once)."""
        for frame in frames:
            for action in receiver.receive("a", frame, 1.0):
                if isinstance(action, Deliver):
                    delivered.append(action.frame)
                elif isinstance(action, Transmit):
                    sender.receive("b", action.frame, 1.0)
        frames.clear()

    frames = [bytes([0xA1, 0x61, 0x66, i]) for i in range(1, 21)]
    for f in frames[:10]:
        _carry(sender.send("b", f, 0.5), direct, relay)
    _carry(sender.direct_up("b", 1.0), direct, relay)  # the drain goes through the relay
    receiver.direct_up("a", 1.0)
    for f in frames[10:]:
        _carry(sender.send("b", f, 1.0), direct, relay)
    direct_frames = [f for f in direct if isinstance(f, PFrame)]
    deliver(direct[:2])  # 11 and 12 arrive before the link dies; 13-20 die with it
    direct.clear()
    _carry(receiver.direct_down("a", 2.0), [], [])
    _carry(sender.direct_down("b", 2.0), direct, relay)  # everything unacknowledged again
    deliver(relay)
    assert (frames, [], 10) == (delivered, direct, len(direct_frames))
