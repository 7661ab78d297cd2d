"""A member's pacing of its relayed paths (spec §8 budgets): token buckets per relay, frames
waiting in the path sequence, gossip shed under back-pressure, and the whole pipeline through
the real relay core at 20× the budget. Pure: no sockets, a fake clock."""

from __future__ import annotations

import random
from collections.abc import Iterable

from hearthnet.identity import KeyPair
from hearthnet.mesh.frames import IHave, Msg
from hearthnet.mesh.pacing import PACE_OVERHEAD_BYTES, Pacer, TokenBucket
from hearthnet.mesh.path_frames import PFrame
from hearthnet.mesh.paths import Deliver, PathConfig, PathCore, Transmit
from hearthnet.mesh.pathseq import is_gossip
from hearthnet.mesh.protocol import encode_frame
from hearthnet.mesh.relay_core import RelayConfig, RelayCore, Send
from hearthnet.mesh.relay_frames import Attach, Attached, Route, RouteError
from hearthnet.mesh.relay_member import RelayEndpoint

KA, KB, KR = (KeyPair.from_seed(bytes([0x61 + i]) * 32) for i in range(3))
A, B, R = KA.node_id, KB.node_id, KR.node_id
ADDR = "192.0.2.1:1000"
NOW_MS = 1_763_800_000_000
FRAME = 1000  # bytes of one peer frame in these tests
CHARGED = FRAME + PACE_OVERHEAD_BYTES


def members(node: str) -> bool:
    """A, B and the relay are members."""
    return node in {A, B, R}


def paced_core(node: str, rate: int = 10 * CHARGED, **cfg: int) -> PathCore:
    """A path core attached to R, which granted ``rate`` bytes/s with a burst of a second
    (ours: half of it, five frames)."""
    c = PathCore(node, [R], config=PathConfig(**cfg), rng=random.Random(0))
    c.relay_attached(R, ADDR, 0.01, 0.0)
    c.pacer.grant(R, rate, rate, 0.0)
    return c


def sent_numbers(actions: Iterable[object]) -> list[int]:
    """The sequence numbers of the pframes among ``actions``."""
    return [x.frame.s for x in actions if isinstance(x, Transmit) and isinstance(x.frame, PFrame)]


def test_only_gossip_messages_may_be_shed() -> None:
    """A msg frame is gossip (anti-entropy repairs it); ihave, ping and call frames are not."""
    frames = [
        Msg(b'{"id": 1}', 2).encode(),
        IHave({A: 3}, {A: 1}).encode(),
        encode_frame("ping", seq=1, ts=5),
        encode_frame("call", sid="s", to=B),
    ]
    assert [True, False, False, False] == [is_gossip(f) for f in frames]


def test_a_bucket_lets_its_burst_go_then_its_rate() -> None:
    """Half a burst at once, then the rate; a frame larger than the burst goes when full."""
    b = TokenBucket(rate=1000.0, burst=500.0, tokens=500.0, updated=0.0)
    first = [b.take(200, 0.0) for _ in range(3)]
    later = [b.take(200, 0.05), b.take(200, 0.1)]
    big = TokenBucket(rate=1000.0, burst=500.0, tokens=500.0, updated=0.0)
    assert ([True, True, False], [False, True], [True, False]) == (
        first,
        later,
        [big.take(5000, 0.0), big.take(1, 4.0)],
    )


def test_a_refusal_pauses_the_relay_for_its_retry_after() -> None:
    """After rate_limited with retry_after_ms 500, nothing goes through that relay for 0.5 s."""
    p = Pacer()
    p.grant(R, 100_000, 50_000, 0.0)
    p.refused(R, 500, 1.0)
    assert ([False, True], 1) == ([p.admit(R, 10, 1.49), p.admit(R, 10, 1.51)], p.refusals)


def test_frames_over_the_budget_wait_and_go_as_it_refills() -> None:
    """Five frames fit the burst; the rest go on later ticks, in order, none lost."""
    a = paced_core(A)
    now_sent = sent_numbers([x for i in range(20) for x in a.send(B, bytes(FRAME), 0.0)])
    later = sent_numbers(a.tick(0.5)) + sent_numbers(a.tick(1.0)) + sent_numbers(a.tick(1.5))
    assert (list(range(1, 6)), list(range(6, 21))) == (now_sent, later)


def test_the_core_names_the_moment_the_next_waiting_frame_fits() -> None:
    """release_at is when the sixth frame fits (0.1 s at 10 frames/s); a release just
    before sends nothing, at that moment exactly it, and names the next moment."""
    a = paced_core(A)
    for _ in range(7):
        a.send(B, bytes(FRAME), 0.0)
    first = a.paced.release_at
    early = sent_numbers(a.paced.release(0.099))
    on_time = sent_numbers(a.paced.release(0.1))
    assert (0.1, [], [6], 0.2) == (
        round(first or 0, 6),
        early,
        on_time,
        round(a.paced.release_at or 0, 6),
    )


def test_nothing_waiting_names_no_release() -> None:
    """Frames within the budget leave at once and leave release_at None."""
    a = paced_core(A)
    sent = sent_numbers([x for _ in range(5) for x in a.send(B, bytes(FRAME), 0.0)])
    assert ([1, 2, 3, 4, 5], None) == (sent, a.paced.release_at)


def test_a_relays_budget_is_shared_a_frame_per_peer_in_turn() -> None:
    """Two peers waiting behind one relay get its refill alternately."""
    a = paced_core(A)
    for _ in range(10):
        a.send(B, bytes(FRAME), 0.0)
        a.send("peer-c", bytes(FRAME), 0.0)
    peers = [x.peer for x in a.tick(0.4) if isinstance(x, Transmit) and x.frame.KIND == "pframe"]
    assert [B, "peer-c", B, "peer-c"] == peers


def test_gossip_is_shed_past_the_bound_and_other_frames_still_wait() -> None:
    """Over shed_bytes, a sheddable frame is dropped and counted; a call frame still queues."""
    a = paced_core(A, shed_bytes=3 * FRAME)
    for _ in range(10):
        a.send(B, bytes(FRAME), 0.0, sheddable=True)
    shed = a.statistics().shed
    a.send(B, b"call", 0.0)
    waiting = a._peers[B].out.waiting
    assert (2, 4) == (shed, waiting)  # 5 went, 3 held, 2 shed; then the call frame


def test_a_direct_link_takes_the_waiting_frames_at_once() -> None:
    """Frames held for the relay's budget all go when the peer's link turns direct."""
    a = paced_core(A)
    for _ in range(12):
        a.send(B, bytes(FRAME), 0.0)
    moved = [x for x in a.direct_up(B, 0.0) if isinstance(x, Transmit) and x.via is None]
    assert list(range(6, 13)) == sent_numbers(moved)


def test_twenty_times_the_budget_through_the_relay_core_is_never_refused() -> None:
    """At 20× a 64 KiB/s budget for 2 s: the relay refuses nothing, gossip past the bound is
    shed, and every frame not shed arrives once and in order, call frames included."""
    rate = 64 * 1024
    relay = RelayCore(R, members, RelayConfig(member_bytes_per_s=rate))
    granted: dict[str, Attached] = {}
    for node in (A, B):
        relay.link_up(node, node, ADDR, 0.0)
        for x in relay.receive(node, Attach(), 0.0):
            if isinstance(x, Send) and x.link == node and isinstance(x.frame, Attached):
                granted[node] = x.frame
    cores = {n: PathCore(n, [R], rng=random.Random(1)) for n in (A, B)}
    ends = {A: RelayEndpoint(KA, members), B: RelayEndpoint(KB, members)}
    for n in (A, B):
        cores[n].relay_attached(R, ADDR, 0.01, 0.0)
        cores[n].pacer.grant(R, granted[n].bytes_per_s, None, 0.0)
    delivered: list[bytes] = []
    refused: list[RouteError] = []
    clock = [0.0]

    def run(node: str, actions: Iterable[object]) -> None:
        for x in actions:
            if isinstance(x, Transmit) and x.via == R:
                for route in ends[node].wrap(x.peer, x.frame, NOW_MS):
                    hop(node, route)
            elif isinstance(x, Deliver):
                delivered.append(x.frame)

    def hop(src: str, route: Route) -> None:
        for out in relay.receive(src, route, clock[0]):
            assert isinstance(out, Send)
            if isinstance(out.frame, RouteError):
                refused.append(out.frame)
                cores[src].pacer.refused(R, out.frame.retry_after_ms, clock[0])
                continue
            assert isinstance(out.frame, Route)
            dst = str(out.link)
            opened = ends[dst].unwrap(out.frame, NOW_MS)
            for r in opened.routes:
                hop(dst, r)
            for f in opened.frames:
                run(dst, cores[dst].receive(src, f, clock[0]))

    sent: list[bytes] = []
    per_step = 20 * rate // FRAME // 100  # 20 times the budget in 10 ms steps
    for step in range(200):  # 2 s of load
        clock[0] = step / 100
        for _ in range(per_step):
            i = len(sent)
            frame = i.to_bytes(4, "big") + bytes(FRAME - 4)
            call = i % 50 == 0  # one frame in 50 must not be shed
            before = cores[A].statistics().shed
            run(A, cores[A].send(B, frame, clock[0], sheddable=not call))
            if cores[A].statistics().shed == before:
                sent.append(frame)
        if step % 25 == 0:  # the glue ticks every 0.25 s
            for n in (A, B):
                run(n, cores[n].tick(clock[0]))
    while clock[0] < 40 and len(delivered) < len(sent):
        clock[0] += 0.25
        for n in (A, B):
            run(n, cores[n].tick(clock[0]))
    calls = [f for f in sent if int.from_bytes(f[:4], "big") % 50 == 0]
    assert (0, True, sent, calls) == (
        relay.statistics().rate_limited,
        cores[A].statistics().shed > len(sent),
        delivered,
        [f for f in delivered if int.from_bytes(f[:4], "big") % 50 == 0],
    )
