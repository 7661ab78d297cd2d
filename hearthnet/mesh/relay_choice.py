"""Which relays a member stays attached to (spec §8). Pure.

``attach_target`` relays (default 1) are kept attached, the lowest RTT first; a relay at
under half the RTT of the current one replaces it; a lost or refused attachment is retried
after 0.5 s doubling to 30 s (spec §7.2's redial backoff), each wait times 1 ± 20 %
jitter so members of a dead relay do not all come back at once.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RelayChoiceConfig:
    """Bounds and times of attaching to relays."""

    attach_target: int = 1  # relays kept attached
    attach_timeout_s: float = 10.0
    attach_backoff_s: float = 0.5  # spec §7.2: 0.5 s doubling to 30 s
    attach_backoff_max_s: float = 30.0
    better_rtt_ratio: float = 0.5  # move to a relay whose RTT is below this share
    jitter: float = 0.2  # every backoff is multiplied by 1 ± jitter
    rtt_weight: float = 0.25  # of a new sample in the smoothed RTT


@dataclass(frozen=True, slots=True)
class AttachRelay:
    """Open a peer link to ``relay`` (if none) and send ``attach``."""

    relay: str


@dataclass(frozen=True, slots=True)
class DetachRelay:
    """Send ``detach`` to ``relay``: nothing goes through it any more."""

    relay: str


def backoff(failures: int, base: float, ceiling: float, jitter: float, rng: random.Random) -> float:
    """``base`` doubled per failure after the first, at most ``ceiling``, times 1 ± jitter."""
    delay = min(ceiling, base * 2.0 ** min(64, max(0, failures - 1)))
    return delay * rng.uniform(1 - jitter, 1 + jitter)


@dataclass(slots=True)
class _Relay:
    relay: str
    order: int
    rtt: float | None = None
    attached: bool = False
    attaching_since: float | None = None
    failures: int = 0
    retry_at: float = 0.0
    observed_addr: str | None = None


class RelayChoice:
    """Which configured relays to stay attached to: ``attach_target`` of them, the lowest
    RTT first, re-attaching after a loss with backoff and jitter."""

    def __init__(
        self, relays: Sequence[str], config: RelayChoiceConfig, rng: random.Random
    ) -> None:
        self.config = config
        self.rng = rng
        self._relays = {r: _Relay(r, i) for i, r in enumerate(dict.fromkeys(relays))}

    def _rank(self, r: _Relay) -> tuple[float, int]:
        return (r.rtt if r.rtt is not None else float("inf"), r.order)

    @property
    def primary(self) -> str | None:
        """The attached relay with the lowest RTT (the one new paths go through)."""
        attached = [r for r in self._relays.values() if r.attached]
        return min(attached, key=self._rank).relay if attached else None

    @property
    def attached_relays(self) -> tuple[str, ...]:
        """The attached relays, the lowest RTT first (the primary first)."""
        attached = sorted((r for r in self._relays.values() if r.attached), key=self._rank)
        return tuple(r.relay for r in attached)

    def observed_addrs(self) -> tuple[str, ...]:
        """Our public addresses as the attached relays see them (punch candidates)."""
        addrs = [r.observed_addr for r in self._relays.values() if r.attached and r.observed_addr]
        return tuple(dict.fromkeys(addrs))

    def attached(self, relay: str, observed_addr: str | None, rtt: float, now: float) -> None:
        """``relay`` answered ``attached``; ``rtt`` measured by its ``ts_echo``."""
        r = self._relays.setdefault(relay, _Relay(relay, len(self._relays)))
        r.attached, r.attaching_since, r.failures = True, None, 0
        r.observed_addr = observed_addr
        self.rtt_sample(relay, rtt)

    def rtt_sample(self, relay: str, rtt: float) -> None:
        """A new RTT measurement (pong, attach echo) for ``relay``."""
        r = self._relays.get(relay)
        if r is not None:
            w = self.config.rtt_weight
            r.rtt = rtt if r.rtt is None else (1 - w) * r.rtt + w * rtt

    def lost(self, relay: str, now: float) -> None:
        """The attachment failed, was refused or ended: retry after a backoff."""
        r = self._relays.get(relay)
        if r is None:
            return
        r.attached, r.attaching_since = False, None
        r.failures += 1
        cfg = self.config
        wait = backoff(
            r.failures, cfg.attach_backoff_s, cfg.attach_backoff_max_s, cfg.jitter, self.rng
        )
        r.retry_at = now + wait

    def tick(self, now: float) -> list[AttachRelay | DetachRelay]:
        """Attach where fewer than the target are attached (or a much closer relay is
        known); detach the slowest beyond the target."""
        cfg = self.config
        for r in self._relays.values():
            if r.attaching_since is not None and now - r.attaching_since > cfg.attach_timeout_s:
                self.lost(r.relay, now)
        live = [r for r in self._relays.values() if r.attached or r.attaching_since is not None]
        free = sorted(
            (r for r in self._relays.values() if r not in live and r.retry_at <= now),
            key=self._rank,
        )
        out: list[AttachRelay | DetachRelay] = []
        want = cfg.attach_target - len(live)
        best = self.primary
        if want <= 0 and free and best is not None and free[0].rtt is not None:
            best_rtt = self._relays[best].rtt
            if best_rtt is not None and free[0].rtt < best_rtt * cfg.better_rtt_ratio:
                want = 1
        for r in free[: max(0, want)]:
            r.attaching_since = now
            out.append(AttachRelay(r.relay))
        attached = sorted((r for r in live if r.attached), key=self._rank)
        if len(live) <= cfg.attach_target:
            return out
        for r in attached[cfg.attach_target :]:
            r.attached = False
            r.retry_at = now + cfg.attach_backoff_max_s
            out.append(DetachRelay(r.relay))
        return out
