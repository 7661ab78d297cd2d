"""Ping, missed pongs and idle close (spec §3.6), with a fake clock."""

from __future__ import annotations

from hearthnet.transport.keepalive import Close, Keepalive, SendPing


def test_pings_every_interval_and_closes_after_two_missed_pongs() -> None:
    """Ping at 30 and 60 s; with no pong, close 4408 at 90 s."""
    k = Keepalive(now=0, ping_s=30, missed_pongs=2, idle_s=1000)
    actions = []
    for t in (10, 30, 60, 90):
        k.data(t)
        actions.append(k.tick(t))
    assert [None, SendPing(), SendPing(), Close(4408, "missed pongs")] == actions


def test_pongs_keep_the_socket_open() -> None:
    """Answered pings never close the socket."""
    k = Keepalive(now=0, ping_s=30, missed_pongs=2, idle_s=1000)
    for t in range(30, 600, 30):
        k.data(t)
        assert SendPing() == k.tick(t)
        k.pong()


def test_idle_close_when_no_data_frames() -> None:
    """No data either way for idle_s closes with 1000, even if pongs arrive."""
    k = Keepalive(now=0, ping_s=30, missed_pongs=2, idle_s=120)
    actions = []
    for t in (30, 60, 90, 120):
        actions.append(k.tick(t))
        k.pong()
    assert [SendPing(), SendPing(), SendPing(), Close(1000, "idle")] == actions


def test_next_deadline_is_the_earliest_duty() -> None:
    """The glue sleeps until the next ping or idle deadline."""
    k = Keepalive(now=100, ping_s=30, missed_pongs=2, idle_s=10)
    assert 110 == k.next_deadline()


def test_a_shorter_ping_interval_brings_the_next_ping_forward() -> None:
    """Switching from 30 s to 10 s at t=5 pings at 15 and 25; a longer interval would not
    put off a ping already due sooner."""
    k = Keepalive(now=0, ping_s=30, missed_pongs=2, idle_s=1000)
    k.ping_every(10, now=5)
    due = [k.next_deadline()]
    actions = [k.tick(15)]
    k.pong()
    due.append(k.next_deadline())
    k.ping_every(60, now=16)
    due.append(k.next_deadline())
    assert ([15, 25, 25], [SendPing()]) == (due, actions)
