"""Link heartbeats: pings, pongs, RTT, clock offset, three misses (spec §7.5). Pure."""

from __future__ import annotations

from hearthnet.mesh.actions import CloseLink, Record, Send
from hearthnet.mesh.frames import Ping, Pong
from hearthnet.mesh.heartbeat import Heartbeats, HeartbeatTracker, Observation, pong_for


def test_ping_pong_rtt_and_clock_offset() -> None:
    """A pong 40 ms after the ping gives RTT 40 ms; a peer clock 1 s ahead shows +1 s."""
    tracker = HeartbeatTracker(interval_s=5)
    ping, _ = tracker.tick(now=10.0, wall_ms=100_000)
    assert ping is not None
    pong = pong_for(ping, wall_ms=100_020 + 1000)
    observation = tracker.pong(pong["seq"], pong["ts_echo"], pong["ts"], now=10.04, wall_ms=100_040)
    assert Observation("pong", 1, 40.0, 1000.0) == observation


def test_three_missed_pongs_mark_the_link_down() -> None:
    """Unanswered pings are misses; after three in a row the link is down; a pong resets it."""
    tracker = HeartbeatTracker(interval_s=5)
    misses = []
    ping = None
    for t in (0, 5, 10, 15):
        ping, observed = tracker.tick(now=float(t), wall_ms=t * 1000)
        misses += observed
    down_after_three = tracker.down
    assert ping is not None
    answered = tracker.pong(ping["seq"], ping["ts"], 15_050, now=15.1, wall_ms=15_100)
    assert ([1, 2, 3], True, 75.0, 4, False) == (
        [m.seq for m in misses],
        down_after_three,
        tracker.loss_pct,
        answered.seq if answered else None,
        tracker.down,
    )


def test_late_or_unknown_pongs_are_ignored() -> None:
    """A pong for a seq never sent, or already counted missed, changes nothing."""
    tracker = HeartbeatTracker(interval_s=5)
    tracker.tick(now=0.0, wall_ms=0)
    unknown = (tracker.pong(99, 0, 0, 1.0, 1), tracker.pong("x", 0, 0, 1.0, 1))
    _, missed = tracker.tick(now=5.0, wall_ms=5000)  # seq 1 is counted missed
    late = tracker.pong(1, 0, 0, 5.1, 5100)
    assert (None, None, [1], None, 1) == (*unknown, [m.seq for m in missed], late, tracker.missed)


def test_heartbeats_ping_each_link_and_close_one_after_three_misses() -> None:
    """A ping per link at once; with no pongs, three misses are recorded and the link is
    closed on the fourth round."""
    beats = Heartbeats(interval_s=5.0)
    beats.up("a")
    first = beats.tick(0.0, 1000)
    actions = []
    for i in range(1, 4):
        actions = beats.tick(5.0 * i, 1000 + 5000 * i)
    assert (
        [Send("a", Ping(1, 1000))],
        [Record("a", Observation("miss", 3), 16000), CloseLink("a", "three pongs missed")],
    ) == (first, actions)


def test_a_pong_is_recorded_with_its_round_trip() -> None:
    """A pong for an outstanding ping gives a record with the RTT; a pong for a link that
    went down gives none."""
    beats = Heartbeats(interval_s=5.0)
    beats.up("a")
    beats.tick(10.0, 1000)
    record = beats.receive_pong("a", Pong(1, 1000, 1010), 10.02, 1020)
    beats.down("a")
    gone = beats.receive_pong("a", Pong(1, 1000, 1010), 10.03, 1030)
    rtt = record.observation.rtt_ms if record is not None else None
    assert (20.0, None) == (rtt, gone)


def test_a_ping_is_answered_with_its_seq_and_ts_echoed() -> None:
    """pong {seq, ts_echo, ts}: the ping's seq and ts, and our clock."""
    assert Pong(4, 123, 456) == Heartbeats.receive_ping(Ping(4, 123), 456)
