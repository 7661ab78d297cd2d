"""Cutting time into windows and merging runs of windows into events.

Windows are aligned to the Unix epoch (``ts - pmod(ts, window)``), the same rule
as :func:`spark_federation.params.window_start_ms`, so a window means the same
span on every node, in every run, in local mode and on a cluster.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as sf

from spark_federation.params import HOUR_MS


def window_of(ts: Column, window_ms: int) -> Column:
    """The start of the window holding ``ts`` (Unix ms)."""
    return ts - sf.pmod(ts, sf.lit(window_ms))


def hour_of(ts: Column) -> Column:
    """The start of the UTC hour holding ``ts`` (Unix ms)."""
    return window_of(ts, HOUR_MS)


def runs(windows: DataFrame, keys: list[str], window_ms: int) -> DataFrame:
    """Merge consecutive windows into runs: ``keys..., start_ms, end_ms, windows``.

    Args:
        windows: one row per (keys..., ``win``), no duplicates.
        keys: columns that identify whose windows they are (may be empty).
        window_ms: window width; windows ``window_ms`` apart belong to one run.

    Returns:
        One row per run; ``end_ms`` is the end of its last window (exclusive).
    """
    part = [sf.col(k) for k in keys] or [sf.lit(0)]
    ordered = Window.partitionBy(*part).orderBy("win")
    prev = sf.lag("win", 1).over(ordered.rowsBetween(-1, -1))
    starts = windows.select(
        *keys,
        "win",
        sf.when(prev.isNull() | (sf.col("win") - prev > sf.lit(window_ms)), 1)
        .otherwise(0)
        .alias("starts_run"),
    )
    numbered = starts.select(
        *keys,
        "win",
        sf.sum("starts_run")
        .over(ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow))
        .alias("run"),
    )
    return (
        numbered.groupBy(*keys, "run")
        .agg(
            sf.min("win").alias("start_ms"),
            (sf.max("win") + sf.lit(window_ms)).alias("end_ms"),
            sf.count(sf.lit(1)).alias("windows"),
        )
        .select(*keys, "start_ms", "end_ms", "windows")
    )
