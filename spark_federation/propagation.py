"""Publish→receive delay of live deliveries per hop count, and catch-up apart (spec §10).

A trace record is written by the receiving node (``ts`` on its clock) and
carries ``published_ms`` (on the origin's clock). Both clocks are corrected by
the offsets :mod:`spark_federation.clock` estimated, so a skewed node does not
show up as seconds of delay; the uncorrected median is kept beside it.

A receive is *live* when the copy travelled the gossip of a new publish, and
*catch-up* when the receiver got backlog: anti-entropy repair after it was down,
partitioned or joined late, or a forward by a node that was catching up itself.
Catch-up delays measure how long a node was away, not how fast the mesh is, so
they are kept out of ``propagation`` and reported as ``catch_up``.

What marks a receive as catch-up:

- records with ``catch_up`` (nodes since 0.3.0): the node's own verdict, true
  when a peer had advertised holding the message (``ihave``) before it arrived;
- older records without it: whether the receiver was linked across the publish
  time, i.e. wrote heartbeat records within :data:`LINKED_SLACK_MS` before it
  and within it after (a linked node writes one per link every 5 s; a node that
  was down, or not yet in the mesh, writes none). A node that stayed linked but
  was cut off from the origin (a partition) is not detected this way;
  ``inferred`` counts these records in the summary.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as sf

from spark_federation.params import HEARTBEAT_MS

LINKED_SLACK_MS = HEARTBEAT_MS + 1_000  # one heartbeat interval plus the flush delay
_S = 1_000


def delays(traces: DataFrame, skew: DataFrame, hb: DataFrame | None) -> DataFrame:
    """Per trace record: ``nid, hops, raw, delay, catch_up, inferred``.

    Args:
        traces: ``nid, oid, published_ms, hops, ts, catch_up`` (``catch_up`` may be null).
        skew: per-node clock estimate ``nid, skew_ms``.
        hb: heartbeat records ``nid, ts``, read for records without ``catch_up``; None
            when every record has it (the records are then not read again).
    """
    offsets = skew.select("nid", "skew_ms")
    at_receiver = offsets.select(sf.col("nid").alias("r_nid"), sf.col("skew_ms").alias("r_skew"))
    at_origin = offsets.select(sf.col("nid").alias("o_nid"), sf.col("skew_ms").alias("o_skew"))
    timed = (
        traces.join(sf.broadcast(at_receiver), sf.col("nid") == sf.col("r_nid"), how="left")
        .join(sf.broadcast(at_origin), sf.col("oid") == sf.col("o_nid"), how="left")
        .select(
            "nid",
            "hops",
            "catch_up",
            (sf.col("ts") - sf.col("published_ms")).cast("double").alias("raw"),
            (
                (sf.col("ts") - sf.coalesce(sf.col("r_skew"), sf.lit(0.0)))
                - (sf.col("published_ms") - sf.coalesce(sf.col("o_skew"), sf.lit(0.0)))
            ).alias("delay"),
            # the publish time on the receiver's clock, where its heartbeat records are
            (
                sf.col("published_ms")
                - sf.coalesce(sf.col("o_skew"), sf.lit(0.0))
                + sf.coalesce(sf.col("r_skew"), sf.lit(0.0))
            )
            .cast("long")
            .alias("at"),
        )
    )
    if hb is None:
        return timed.select(
            "nid", "hops", "raw", "delay", "catch_up", sf.col("catch_up").isNull().alias("inferred")
        )
    return _infer_unmarked(timed, hb).select("nid", "hops", "raw", "delay", "catch_up", "inferred")


def _infer_unmarked(timed: DataFrame, hb: DataFrame) -> DataFrame:
    """Fill ``catch_up`` where the record lacks it: live when the receiver wrote heartbeat
    records both in the LINKED_SLACK_MS before the publish and in the LINKED_SLACK_MS
    after it (it had a link then and kept it), catch-up otherwise.

    Only the seconds around unmarked records are looked up: they form a small broadcast
    set that one pass over the heartbeats is semi-joined with.
    """
    unmarked = timed.where(sf.col("catch_up").isNull())
    slack = LINKED_SLACK_MS // _S + 1
    second = sf.floor(sf.col("at") / _S)
    wanted = unmarked.select(
        "nid", sf.explode(sf.sequence(second - slack, second + slack)).alias("sec")
    ).distinct()
    linked_secs = (
        hb.select("nid", sf.floor(sf.col("ts") / _S).alias("sec"))
        .join(sf.broadcast(wanted), on=["nid", "sec"], how="left_semi")
        .distinct()
    )
    lag = sf.col("sec") * _S - sf.col("at")  # heartbeat second minus publish time
    near = (
        unmarked.select("nid", "at")
        .distinct()
        .join(linked_secs, on="nid", how="inner")
        .groupBy("nid", "at")
        .agg(
            (
                sf.max(((lag >= -LINKED_SLACK_MS) & (lag <= 0)).cast("int"))
                + sf.max(((lag > -_S) & (lag <= LINKED_SLACK_MS)).cast("int"))
                == 2  # a record on each side
            ).alias("linked")
        )
    )
    return timed.join(near, on=["nid", "at"], how="left").select(
        "nid",
        "hops",
        "raw",
        "delay",
        sf.coalesce(sf.col("catch_up"), ~sf.coalesce(sf.col("linked"), sf.lit(False))).alias(
            "catch_up"
        ),
        sf.col("catch_up").isNull().alias("inferred"),
    )


def propagation(timed: DataFrame) -> DataFrame:
    """Live receives per hop count: ``hops, messages, p50_ms, p95_ms, p99_ms, max_ms,
    raw_p50_ms``."""
    return (
        timed.where(~sf.col("catch_up"))
        .groupBy("hops")
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


def catch_up(timed: DataFrame) -> DataFrame:
    """Catch-up receives per receiving node, ``nid, messages, p50_ms, p99_ms, max_ms``, and
    one row with ``nid`` null for all receivers together (a rollup: one pass)."""
    return (
        timed.where(sf.col("catch_up"))
        .rollup("nid")
        .agg(
            sf.count(sf.lit(1)).alias("messages"),
            sf.percentile_approx("delay", [0.5, 0.99], 10_000).alias("q"),
            sf.max("delay").alias("max_ms"),
        )
        .select(
            "nid",
            "messages",
            sf.col("q")[0].alias("p50_ms"),
            sf.col("q")[1].alias("p99_ms"),
            "max_ms",
        )
    )


def split_counts(timed: DataFrame) -> DataFrame:
    """One row: ``records``, ``live``, ``catch_up``, and ``inferred`` (records without the
    ``catch_up`` field, classified from the receiver's heartbeats)."""
    return timed.agg(
        sf.count(sf.lit(1)).alias("records"),
        sf.count_if(~sf.col("catch_up")).alias("live"),
        sf.count_if(sf.col("catch_up")).alias("catch_up"),
        sf.count_if(sf.col("inferred")).alias("inferred"),
    )
