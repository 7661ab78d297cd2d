"""Publish→receive delay per hop count, from message-trace records (spec §10).

A trace record is written by the receiving node (``ts`` on its clock) and
carries ``published_ms`` (on the origin's clock). Both clocks are corrected by
the offsets :mod:`spark_federation.clock` estimated, so a skewed node does not
show up as seconds of delay; the uncorrected median is kept beside it.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as sf


def propagation(traces: DataFrame, skew: DataFrame) -> DataFrame:
    """Per hop count: ``hops, messages, p50_ms, p95_ms, p99_ms, max_ms, raw_p50_ms``."""
    offsets = skew.select("nid", "skew_ms")
    at_receiver = offsets.select(sf.col("nid").alias("r_nid"), sf.col("skew_ms").alias("r_skew"))
    at_origin = offsets.select(sf.col("nid").alias("o_nid"), sf.col("skew_ms").alias("o_skew"))
    delays = (
        traces.join(sf.broadcast(at_receiver), sf.col("nid") == sf.col("r_nid"), how="left")
        .join(sf.broadcast(at_origin), sf.col("oid") == sf.col("o_nid"), how="left")
        .select(
            "hops",
            (sf.col("ts") - sf.col("published_ms")).cast("double").alias("raw"),
            (
                (sf.col("ts") - sf.coalesce(sf.col("r_skew"), sf.lit(0.0)))
                - (sf.col("published_ms") - sf.coalesce(sf.col("o_skew"), sf.lit(0.0)))
            ).alias("delay"),
        )
    )
    return (
        delays.groupBy("hops")
        .agg(
            sf.count(sf.lit(1)).alias("messages"),
            sf.percentile_approx("delay", [0.5, 0.95, 0.99], 10_000).alias("q"),
            sf.max("delay").alias("max_ms"),
            sf.percentile_approx("raw", 0.5, 10_000).alias("raw_p50_ms"),
        )
        .select(
            "hops",
            "messages",
            sf.col("q")[0].alias("p50_ms"),
            sf.col("q")[1].alias("p95_ms"),
            sf.col("q")[2].alias("p99_ms"),
            "max_ms",
            "raw_p50_ms",
        )
    )
