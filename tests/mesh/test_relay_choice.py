"""Which relays a member stays attached to (spec §8): RTT first, backoff with jitter."""

from __future__ import annotations

import random

from hearthnet.mesh.relay_choice import (
    AttachRelay,
    DetachRelay,
    RelayChoice,
    RelayChoiceConfig,
    backoff,
)

R, R2 = "relay-1", "relay-2"
ADDR_A = "203.0.113.1:4000"


def test_the_lowest_rtt_relay_is_chosen() -> None:
    """Of two relays with known RTT, the closer one is attached first."""
    choice = RelayChoice([R, R2], RelayChoiceConfig(), random.Random(0))
    choice.rtt_sample(R, 0.080)
    choice.rtt_sample(R2, 0.010)
    assert [AttachRelay(R2)] == choice.tick(0.0)


def test_the_primary_is_the_closest_attached_relay() -> None:
    """With two relays attached, new paths go through the lower RTT one."""
    choice = RelayChoice([R, R2], RelayChoiceConfig(attach_target=2), random.Random(0))
    choice.attached(R, ADDR_A, 0.050, 0.0)
    choice.attached(R2, ADDR_A, 0.020, 0.0)
    assert R2 == choice.primary


def test_the_attached_relays_are_ranked_by_rtt_and_a_lost_one_leaves() -> None:
    """Three relays attached, the closest first; one lost is no longer among them."""
    choice = RelayChoice([R, R2], RelayChoiceConfig(attach_target=3), random.Random(0))
    choice.attached(R, ADDR_A, 0.050, 0.0)
    choice.attached(R2, ADDR_A, 0.020, 0.0)
    choice.attached("relay-3", ADDR_A, 0.030, 0.0)
    ranked = choice.attached_relays
    choice.lost(R2, 1.0)
    assert ((R2, "relay-3", R), ("relay-3", R)) == (ranked, choice.attached_relays)


def test_reattaching_backs_off_with_bounded_jitter() -> None:
    """Each loss doubles the wait from 0.5 s up to 30 s, within ±20 %."""
    choice = RelayChoice([R], RelayChoiceConfig(), random.Random(7))
    waits = []
    for _ in range(9):
        choice.tick(0.0)
        choice.lost(R, 0.0)
        waits.append(choice._relays[R].retry_at)
    nominal = [0.5, 1, 2, 4, 8, 16, 30, 30, 30]
    assert [True] * 9 == [0.8 * n <= w <= 1.2 * n for w, n in zip(waits, nominal, strict=True)]


def test_no_reattach_before_the_backoff_ends() -> None:
    """After a loss the relay is asked again only once its retry time has come."""
    choice = RelayChoice([R], RelayChoiceConfig(jitter=0.0), random.Random(0))
    choice.tick(0.0)
    choice.attached(R, ADDR_A, 0.01, 0.0)
    choice.lost(R, 1.0)
    assert ([], [AttachRelay(R)]) == (choice.tick(1.4), choice.tick(1.5))


def test_an_attach_without_answer_times_out_and_is_retried() -> None:
    """No attached within 10 s counts as a failure; the next try follows the backoff."""
    choice = RelayChoice([R], RelayChoiceConfig(jitter=0.0), random.Random(0))
    first = choice.tick(0.0)
    assert ([AttachRelay(R)], [], [AttachRelay(R)]) == (first, choice.tick(10.5), choice.tick(11.0))


def test_a_much_closer_relay_replaces_the_attached_one() -> None:
    """A relay at under half the RTT is attached, then the slower one is detached."""
    choice = RelayChoice([R, R2], RelayChoiceConfig(), random.Random(0))
    choice.tick(0.0)
    choice.attached(R, ADDR_A, 0.100, 0.0)
    choice.rtt_sample(R2, 0.010)
    first = choice.tick(1.0)
    choice.attached(R2, ADDR_A, 0.010, 1.1)
    assert ([AttachRelay(R2)], [DetachRelay(R)]) == (first, choice.tick(2.0))


def test_backoff_is_bounded() -> None:
    """backoff never exceeds the ceiling times 1 + jitter, whatever the failure count."""
    rng = random.Random(3)
    assert [True] * 50 == [backoff(n, 0.5, 30.0, 0.2, rng) <= 36.0 for n in range(1, 1000, 20)]
