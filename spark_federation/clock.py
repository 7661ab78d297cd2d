"""Whose clock is off (spec §10).

Each pong carries ``clock_offset_ms``: the observer's estimate of the peer's
clock minus its own. For a node X, every pong *about* X is a sample of
"X minus that observer", and every pong *by* X, negated, is a sample of "X minus
that peer". The median of all of them estimates X's offset from the mesh: it
stays right while fewer than half of X's peers are skewed themselves. Samples
are counted in 1 ms buckets (:mod:`spark_federation.quantiles`), so the median
is exact to the millisecond.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as sf

from spark_federation.quantiles import quantiles


def offset_histogram(pongs: DataFrame) -> DataFrame:
    """Pongs per directed link and clock-offset millisecond, from
    :func:`spark_federation.links.pong_histogram`: ``nid, pid, offset_ms, n`` (pongs
    without an offset left out)."""
    return (
        pongs.where(sf.col("offset_ms").isNotNull())
        .groupBy("nid", "pid", "offset_ms")
        .agg(sf.sum("n").alias("n"))
        .select("nid", "pid", "offset_ms", "n")
    )


def clock_skew(pongs: DataFrame, threshold_ms: float) -> DataFrame:
    """Per node: ``nid, skew_ms, p10_ms, p90_ms, samples, skewed`` (|skew| > threshold).

    Args:
        pongs: pong counts per link and offset millisecond (:func:`offset_histogram`,
            or :func:`spark_federation.links.pong_histogram`, whose other columns it sums).
        threshold_ms: |offset| above which a node is skewed.
    """
    known = pongs.where(sf.col("offset_ms").isNotNull())
    about = known.select(sf.col("pid").alias("nid"), sf.col("offset_ms").alias("bucket"), "n")
    by = known.select("nid", (-sf.col("offset_ms")).alias("bucket"), "n")
    hist = (
        about.unionByName(by)
        .groupBy("nid", "bucket")
        .agg(sf.sum("n").alias("n"))
        .select("nid", "bucket", "n")
    )
    counts = hist.groupBy("nid").agg(sf.sum("n").alias("samples"))
    return (
        quantiles(hist, ["nid"], [0.1, 0.5, 0.9])
        .join(counts, on="nid", how="inner")
        .select(
            "nid",
            sf.col("q")[1].cast("double").alias("skew_ms"),
            sf.col("q")[0].cast("double").alias("p10_ms"),
            sf.col("q")[2].cast("double").alias("p90_ms"),
            "samples",
            (sf.abs(sf.col("q")[1]) > sf.lit(threshold_ms)).alias("skewed"),
        )
    )
