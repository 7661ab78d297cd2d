"""Cutting time into windows.

Windows are aligned to the Unix epoch (``ts - pmod(ts, window)``), the same rule
as :func:`spark_federation.params.window_start_ms`, so a window means the same
span on every node, in every run, in local mode and on a cluster.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as sf

from spark_federation.params import HOUR_MS


def window_of(ts: Column, window_ms: int) -> Column:
    """The start of the window holding ``ts`` (Unix ms)."""
    return ts - sf.pmod(ts, sf.lit(window_ms))


def hour_of(ts: Column) -> Column:
    """The start of the UTC hour holding ``ts`` (Unix ms)."""
    return window_of(ts, HOUR_MS)
