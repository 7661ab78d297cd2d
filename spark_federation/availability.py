"""Which nodes were up, per window and per hour, and when they were down (spec §10).

A node is *up in a window* when anything shows it running there: it wrote a
heartbeat record, a peer got a pong from it or saw its link come up, or it
published a beacon. Down means none of that; a node that lost every link and
exports no beacons writes nothing either, so without beacons it reads as down.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from spark_federation.schema import LINK_DOWN, LINK_UP, MISS, PONG
from spark_federation.timeline import hour_of, window_of


def node_evidence(hb: DataFrame, beacons: DataFrame | None, window_ms: int) -> DataFrame:
    """Per (node, window) with any sign of life: counts of each kind of evidence.

    Columns: ``nid, win, own, seen, misses, downs, beacons``. ``own`` counts the
    node's own records, ``seen`` pongs from it and link_ups to it recorded by
    peers, ``misses``/``downs`` its own failed pings and closed links.
    """
    own = hb.select(
        F.col("nid"),
        window_of(F.col("ts"), window_ms).alias("win"),
        F.lit(1).alias("own"),
        F.lit(0).alias("seen"),
        (F.col("kind") == MISS).cast("int").alias("misses"),
        (F.col("kind") == LINK_DOWN).cast("int").alias("downs"),
        F.lit(0).alias("beacons"),
    )
    seen = hb.where(F.col("kind").isin(PONG, LINK_UP)).select(
        F.col("pid").alias("nid"),
        window_of(F.col("ts"), window_ms).alias("win"),
        F.lit(0).alias("own"),
        F.lit(1).alias("seen"),
        F.lit(0).alias("misses"),
        F.lit(0).alias("downs"),
        F.lit(0).alias("beacons"),
    )
    parts = own.unionByName(seen)
    if beacons is not None:
        parts = parts.unionByName(
            beacons.select(
                F.col("nid"),
                window_of(F.col("ts"), window_ms).alias("win"),
                F.lit(0).alias("own"),
                F.lit(0).alias("seen"),
                F.lit(0).alias("misses"),
                F.lit(0).alias("downs"),
                F.lit(1).alias("beacons"),
            )
        )
    return (
        parts.groupBy("nid", "win")
        .agg(*[F.sum(c).alias(c) for c in ("own", "seen", "misses", "downs", "beacons")])
        .select("nid", "win", "own", "seen", "misses", "downs", "beacons")
    )


def node_availability(
    evidence: DataFrame,
    hb: DataFrame,
    nodes: DataFrame,
    windows: DataFrame,
) -> DataFrame:
    """Per node and hour: windows up out of windows analysed, and pongs answered.

    Args:
        evidence: :func:`node_evidence`.
        hb: deduplicated heartbeat observations.
        nodes: ``nid`` of every node.
        windows: ``win, hour`` of every analysed (whole) window.

    Returns:
        ``nid, hour_ms, windows, windows_up, availability, pings, pongs, pong_ratio,
        records, beacons``; ``pong_ratio`` is the share of peers' pings to the node
        that it answered (null when nobody pinged it that hour).
    """
    per_hour = windows.groupBy("hour").agg(F.count(F.lit(1)).alias("windows"))
    grid = nodes.select("nid").crossJoin(per_hour.select("hour", "windows"))
    up = (
        evidence.join(windows, on="win", how="inner")
        .groupBy("nid", "hour")
        .agg(
            F.count(F.lit(1)).alias("windows_up"),
            F.sum("own").alias("records"),
            F.sum("beacons").alias("beacons"),
        )
    )
    asked = (
        hb.where(F.col("kind").isin(PONG, MISS))
        .select(
            F.col("pid").alias("nid"),
            hour_of(F.col("ts")).alias("hour"),
            (F.col("kind") == PONG).cast("long").alias("pong"),
        )
        .groupBy("nid", "hour")
        .agg(F.count(F.lit(1)).alias("pings"), F.sum("pong").alias("pongs"))
    )
    return (
        grid.join(up, on=["nid", "hour"], how="left")
        .join(asked, on=["nid", "hour"], how="left")
        .select(
            F.col("nid"),
            F.col("hour").alias("hour_ms"),
            F.col("windows"),
            F.coalesce(F.col("windows_up"), F.lit(0)).alias("windows_up"),
            (F.coalesce(F.col("windows_up"), F.lit(0)) / F.col("windows")).alias("availability"),
            F.coalesce(F.col("pings"), F.lit(0)).alias("pings"),
            F.coalesce(F.col("pongs"), F.lit(0)).alias("pongs"),
            (F.col("pongs") / F.col("pings")).alias("pong_ratio"),
            F.coalesce(F.col("records"), F.lit(0)).alias("records"),
            F.coalesce(F.col("beacons"), F.lit(0)).alias("beacons"),
        )
    )


def outages(
    evidence: DataFrame, nodes: DataFrame, first_win: int, last_win: int, window_ms: int
) -> DataFrame:
    """Runs of analysed windows in which a node was not up: ``nid, start_ms, end_ms, windows``.

    Computed from the gaps between a node's up windows (plus the gaps before its
    first and after its last), so the cost follows the evidence, not nodes × windows.
    """
    span_end = last_win + window_ms
    up = evidence.where(F.col("win").between(first_win, last_win)).select("nid", "win")
    ordered = Window.partitionBy("nid").orderBy("win")
    with_prev = up.select(
        "nid", "win", F.lag("win", 1).over(ordered.rowsBetween(-1, -1)).alias("prev")
    )
    inner = with_prev.where(
        F.col("prev").isNotNull() & (F.col("win") - F.col("prev") > F.lit(window_ms))
    ).select("nid", (F.col("prev") + F.lit(window_ms)).alias("start_ms"), F.col("win").alias("end_ms"))
    bounds = up.groupBy("nid").agg(F.min("win").alias("first"), F.max("win").alias("last"))
    every = nodes.select("nid").join(bounds, on="nid", how="left")
    leading = every.where(F.col("first").isNull() | (F.col("first") > F.lit(first_win))).select(
        "nid",
        F.lit(first_win).alias("start_ms"),
        F.coalesce(F.col("first"), F.lit(span_end)).alias("end_ms"),
    )
    trailing = every.where(F.col("last") < F.lit(last_win)).select(
        "nid", (F.col("last") + F.lit(window_ms)).alias("start_ms"), F.lit(span_end).alias("end_ms")
    )
    return (
        inner.unionByName(leading)
        .unionByName(trailing)
        .select(
            "nid",
            "start_ms",
            "end_ms",
            ((F.col("end_ms") - F.col("start_ms")) / F.lit(window_ms)).cast("long").alias("windows"),
        )
    )
