"""Link quality per (node, peer) and hour, and which links flap (spec §10).

Loss is the share of pings without a pong. A *flap* is a ``link_up`` that
follows a ``link_down`` on the same directed link (down→up). A single missed
pong never closes a link (three do, spec §7.5), so it never makes a flap.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from spark_federation.params import HOUR_MS
from spark_federation.schema import LINK_DOWN, LINK_UP, MISS, PONG
from spark_federation.timeline import hour_of


def flap_events(hb: DataFrame) -> DataFrame:
    """Every down→up transition: ``nid, pid, ts`` of the ``link_up`` that ended a down."""
    events = hb.where(F.col("kind").isin(LINK_UP, LINK_DOWN)).select("nid", "pid", "ts", "kind")
    ordered = Window.partitionBy("nid", "pid").orderBy("ts", "kind").rowsBetween(-1, -1)
    return (
        events.select("nid", "pid", "ts", "kind", F.lag("kind", 1).over(ordered).alias("prev"))
        .where((F.col("kind") == LINK_UP) & (F.col("prev") == LINK_DOWN))
        .select("nid", "pid", "ts")
    )


def link_health(hb: DataFrame, flaps: DataFrame) -> DataFrame:
    """Per directed link and hour: pings, pongs, loss %, RTT p50/p95/p99, flaps, relay share.

    Returns:
        ``nid, pid, hour_ms, pings, pongs, misses, loss_pct, rtt_p50_ms, rtt_p95_ms,
        rtt_p99_ms, flaps, relayed_share``.
    """
    pings = (
        hb.where(F.col("kind").isin(PONG, MISS))
        .select(
            "nid",
            "pid",
            hour_of(F.col("ts")).alias("hour_ms"),
            (F.col("kind") == PONG).cast("long").alias("pong"),
            F.when(F.col("kind") == PONG, F.col("rtt_ms")).alias("rtt"),
            F.coalesce(F.col("relay"), F.lit(False)).cast("long").alias("relayed"),
        )
        .groupBy("nid", "pid", "hour_ms")
        .agg(
            F.count(F.lit(1)).alias("pings"),
            F.sum("pong").alias("pongs"),
            F.percentile_approx("rtt", [0.5, 0.95, 0.99], 1000).alias("q"),
            F.avg("relayed").alias("relayed_share"),
        )
    )
    hourly_flaps = (
        flaps.select("nid", "pid", hour_of(F.col("ts")).alias("hour_ms"))
        .groupBy("nid", "pid", "hour_ms")
        .agg(F.count(F.lit(1)).alias("flaps"))
    )
    return pings.join(hourly_flaps, on=["nid", "pid", "hour_ms"], how="full").select(
        "nid",
        "pid",
        "hour_ms",
        F.coalesce(F.col("pings"), F.lit(0)).alias("pings"),
        F.coalesce(F.col("pongs"), F.lit(0)).alias("pongs"),
        (F.coalesce(F.col("pings"), F.lit(0)) - F.coalesce(F.col("pongs"), F.lit(0))).alias(
            "misses"
        ),
        (F.lit(100.0) * (F.col("pings") - F.col("pongs")) / F.col("pings")).alias("loss_pct"),
        F.col("q")[0].alias("rtt_p50_ms"),
        F.col("q")[1].alias("rtt_p95_ms"),
        F.col("q")[2].alias("rtt_p99_ms"),
        F.coalesce(F.col("flaps"), F.lit(0)).alias("flaps"),
        F.col("relayed_share"),
    )


def flapping_links(flaps: DataFrame, threshold: int) -> DataFrame:
    """Undirected links with at least ``threshold`` flaps within some hour (sliding).

    Both ends record each flap, so a link's count is the larger of its two
    directions (one end's export may be missing). Returns ``a, b, flaps,
    max_per_hour`` with ``a < b`` as ids; the summary orders them as NodeIDs.
    """
    per_hour = Window.partitionBy("nid", "pid").orderBy("ts").rangeBetween(-(HOUR_MS - 1), 0)
    directed = (
        flaps.select("nid", "pid", F.count(F.lit(1)).over(per_hour).alias("in_hour"))
        .groupBy("nid", "pid")
        .agg(F.count(F.lit(1)).alias("flaps"), F.max("in_hour").alias("max_per_hour"))
    )
    return (
        directed.select(
            F.least("nid", "pid").alias("a"),
            F.greatest("nid", "pid").alias("b"),
            "flaps",
            "max_per_hour",
        )
        .groupBy("a", "b")
        .agg(F.max("flaps").alias("flaps"), F.max("max_per_hour").alias("max_per_hour"))
        .where(F.col("max_per_hour") >= F.lit(threshold))
        .select("a", "b", "flaps", "max_per_hour")
    )


def link_rtt_distribution(hb: DataFrame) -> DataFrame:
    """Per undirected link over the whole span: RTT p5/p25/p50/p75/p95/p99 and pongs (charts)."""
    return (
        hb.where(F.col("kind") == PONG)
        .select(
            F.least("nid", "pid").alias("a"), F.greatest("nid", "pid").alias("b"), "rtt_ms"
        )
        .groupBy("a", "b")
        .agg(
            F.percentile_approx("rtt_ms", [0.05, 0.25, 0.5, 0.75, 0.95, 0.99], 1000).alias("q"),
            F.count(F.lit(1)).alias("pongs"),
        )
        .select("a", "b", "q", "pongs")
    )
