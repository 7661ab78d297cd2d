"""Publish→receive delay per hop count, from message-trace records (spec §10).

A trace record is written by the receiving node (``ts`` on its clock) and
carries ``published_ms`` (on the origin's clock). Both clocks are corrected by
the offsets :mod:`spark_federation.clock` estimated, so a skewed node does not
show up as seconds of delay; the uncorrected median is kept beside it.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def propagation(traces: DataFrame, skew: DataFrame) -> DataFrame:
    """Per hop count: ``hops, messages, p50_ms, p95_ms, p99_ms, max_ms, raw_p50_ms``."""
    offsets = skew.select("nid", "skew_ms")
    at_receiver = offsets.select(F.col("nid").alias("r_nid"), F.col("skew_ms").alias("r_skew"))
    at_origin = offsets.select(F.col("nid").alias("o_nid"), F.col("skew_ms").alias("o_skew"))
    delays = (
        traces.join(F.broadcast(at_receiver), F.col("nid") == F.col("r_nid"), how="left")
        .join(F.broadcast(at_origin), F.col("oid") == F.col("o_nid"), how="left")
        .select(
            "hops",
            (F.col("ts") - F.col("published_ms")).cast("double").alias("raw"),
            (
                (F.col("ts") - F.coalesce(F.col("r_skew"), F.lit(0.0)))
                - (F.col("published_ms") - F.coalesce(F.col("o_skew"), F.lit(0.0)))
            ).alias("delay"),
        )
    )
    return (
        delays.groupBy("hops")
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.percentile_approx("delay", [0.5, 0.95, 0.99], 10_000).alias("q"),
            F.max("delay").alias("max_ms"),
            F.percentile_approx("raw", 0.5, 10_000).alias("raw_p50_ms"),
        )
        .select(
            "hops",
            "messages",
            F.col("q")[0].alias("p50_ms"),
            F.col("q")[1].alias("p95_ms"),
            F.col("q")[2].alias("p99_ms"),
            "max_ms",
            "raw_p50_ms",
        )
    )
