"""Whose clock is off (spec §10).

Each pong carries ``clock_offset_ms``: the observer's estimate of the peer's
clock minus its own. For a node X, every pong *about* X is a sample of
"X minus that observer", and every pong *by* X, negated, is a sample of "X minus
that peer". The median of all of them estimates X's offset from the mesh: it
stays right while fewer than half of a node's peers are skewed themselves.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_federation.schema import PONG


def clock_skew(hb: DataFrame, threshold_ms: float) -> DataFrame:
    """Per node: ``nid, skew_ms, p10_ms, p90_ms, samples, skewed`` (|skew| > threshold)."""
    pongs = hb.where((F.col("kind") == PONG) & F.col("clock_offset_ms").isNotNull())
    samples = pongs.select(F.col("pid").alias("nid"), F.col("clock_offset_ms").alias("o")).unionByName(
        pongs.select(F.col("nid"), (-F.col("clock_offset_ms")).alias("o"))
    )
    return (
        samples.groupBy("nid")
        .agg(
            F.percentile_approx("o", [0.1, 0.5, 0.9], 10_000).alias("q"),
            F.count(F.lit(1)).alias("samples"),
        )
        .select(
            "nid",
            F.col("q")[1].alias("skew_ms"),
            F.col("q")[0].alias("p10_ms"),
            F.col("q")[2].alias("p90_ms"),
            "samples",
            (F.abs(F.col("q")[1]) > F.lit(threshold_ms)).alias("skewed"),
        )
    )
