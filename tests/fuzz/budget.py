"""How much each fuzz test runs: seeded, bounded, reproducible.

``HEARTHNET_FUZZ_SCALE`` multiplies every test's example count (default 1: the CI budget
of about three minutes on two cores); ``HEARTHNET_FUZZ_SHRINK=1`` lets hypothesis shrink
a failure to a minimal input (each shrink step may restart the node, so CI leaves it off
and reports the failing input as generated).
"""

from __future__ import annotations

import os
from datetime import timedelta

from hypothesis import HealthCheck, Phase, settings

SCALE = float(os.environ.get("HEARTHNET_FUZZ_SCALE", "1"))
SHRINK = os.environ.get("HEARTHNET_FUZZ_SHRINK", "") == "1"


def budget(examples: int) -> settings:
    """Settings for one fuzz test: ``examples`` inputs (times the scale), derandomized
    (the same inputs on every run), no example database, a per-input deadline."""
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if SHRINK else [])
    return settings(
        max_examples=max(1, int(examples * SCALE)),
        deadline=timedelta(seconds=20),
        derandomize=True,
        database=None,
        phases=phases,
        print_blob=True,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )
