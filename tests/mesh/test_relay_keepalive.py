"""A member's keepalive on its relays' links (spec §8 failover). Pure: a fake clock."""

from __future__ import annotations

from hearthnet.mesh.relay_keepalive import KeepaliveConfig, KeepaliveDue, RelayKeepalive

R, R2 = "relay-1", "relay-2"


def test_an_attached_relay_is_pinged_every_interval() -> None:
    """Pings go out once per interval while the relay answers."""
    k = RelayKeepalive(KeepaliveConfig(interval_s=1.0, silence_s=2.5))
    k.watch(R, 10, 0.0)
    dues = [k.tick(t / 4, {R: 10 + int(t)}) for t in range(1, 13)]
    assert [(R,), (R,), (R,)] == [d.ping for d in dues if d.ping]


def test_a_relay_silent_past_the_limit_is_lost_once() -> None:
    """No frame for silence_s: the relay is reported silent once and no longer watched."""
    k = RelayKeepalive(KeepaliveConfig(interval_s=1.0, silence_s=2.5))
    k.watch(R, 10, 0.0)
    k.watch(R2, 5, 0.0)
    seen = [(t / 4, k.tick(t / 4, {R: 10, R2: 5 + t})) for t in range(1, 16)]
    silent = [(when, due.silent) for when, due in seen if due.silent]
    assert ([(2.5, (R,))], frozenset({R2})) == (silent, k.watched)


def test_a_relay_without_a_link_is_forgotten_not_reported() -> None:
    """A relay whose link is gone (no count) is dropped quietly: link_down handles it."""
    k = RelayKeepalive()
    k.watch(R, 0, 0.0)
    assert (KeepaliveDue(), frozenset()) == (k.tick(5.0, {}), k.watched)


def test_a_stall_of_our_own_loop_is_not_the_relays_silence() -> None:
    """A tick 3 s late (our loop stood still, the pong unread) calls no relay silent; the
    relay silent for silence_s of our running time after that is lost."""
    k = RelayKeepalive(KeepaliveConfig(interval_s=1.0, silence_s=2.5))
    k.watch(R, 10, 0.0)
    k.tick(0.0, {R: 10})
    after_stall = k.tick(3.0, {R: 10})
    seen = [(t / 4, k.tick(3.0 + t / 4, {R: 10})) for t in range(1, 12)]
    silent = [when for when, due in seen if due.silent]
    assert ((), [2.5], 1) == (after_stall.silent, silent, k.stalls)
