"""Fixtures for chaos tests: labs of hosts in network namespaces (see ``netns.py``).

Every test here skips, with the reason, where labs cannot run (not root, no iproute2,
namespaces refused), so the suite stays green on a laptop without sudo.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any

import pytest

from tests.chaos.nat_lab import NatLab, nat_unavailable_reason
from tests.chaos.netns import Lab, NamespaceLab, sweep_stale, unavailable_reason

MakeLab = Callable[..., Lab]
MakeNatLab = Callable[..., NatLab]


@pytest.fixture(scope="session")
def lab_support() -> Iterator[None]:
    """Skip when labs cannot run; sweep leftovers of crashed runs; clean up on SIGTERM.

    A run stopped by SIGTERM (a CI timeout, say) would skip fixture finalisers and
    atexit hooks; turning SIGTERM into KeyboardInterrupt lets pytest tear down first.
    """
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    sweep_stale()

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        if previous is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture
def make_lab(lab_support: None) -> Iterator[MakeLab]:
    """Build started labs (``make_lab(4)``); all are closed after the test, pass or fail."""
    labs: list[Lab] = []

    def make(n_hosts: int = 3, **kwargs: str) -> Lab:
        lab = Lab(n_hosts, **kwargs)
        labs.append(lab)
        lab.start()
        return lab

    yield make
    _close_all(labs)


def _close_all(labs: Sequence[NamespaceLab]) -> None:
    errors = []
    for lab in labs:
        try:
            lab.close()
        except Exception as exc:  # every lab gets its chance to clean up
            errors.append(exc)
    if errors:
        raise errors[0]


@pytest.fixture(scope="session")
def nat_lab_support(lab_support: None) -> None:
    """Skip NAT labs where ``nft`` is missing or the kernel has no nftables NAT."""
    reason = nat_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)


@pytest.fixture
def make_nat_lab(nat_lab_support: None) -> Iterator[MakeNatLab]:
    """Build started NAT labs (``make_nat_lab(["plain", "fully-random"])``); all are
    closed after the test, pass or fail."""
    labs: list[NatLab] = []

    def make(*args: Any, **kwargs: Any) -> NatLab:
        lab = NatLab(*args, **kwargs)
        labs.append(lab)
        lab.start()
        return lab

    yield make
    _close_all(labs)
