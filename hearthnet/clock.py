"""Wall-clock milliseconds, the time unit on the wire (spec §1.1)."""

from __future__ import annotations

import time


def now_ms() -> int:
    """Current Unix time in integer milliseconds."""
    return time.time_ns() // 1_000_000
