"""Which nodes were up, per window and per hour, and when they were down (spec §10).

A node is *up in a window* when anything shows it running there: it wrote a
heartbeat record, a peer got a pong from it or saw its link come up, or it
published a beacon. Down means none of that; a node that lost every link and
exports no beacons writes nothing either, so without beacons it reads as down.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as sf

from spark_federation.params import HOUR_MS, window_start_ms
from spark_federation.timeline import hour_of, window_of


def node_evidence(lw: DataFrame, beacons: DataFrame | None, window_ms: int) -> DataFrame:
    """Per (node, window) with any sign of life: counts of each kind of evidence.

    Args:
        lw: per-link window counts (:func:`spark_federation.links.link_windows`).
        beacons: deduplicated beacons (``nid, ts``), if exported.
        window_ms: window width.

    Returns:
        ``nid, win, own, seen, misses, downs, beacons, linked``: ``own`` counts the node's
        own records, ``seen`` pongs from it and link_ups to it recorded by peers,
        ``misses``/``downs`` its own failed pings and closed links, ``linked`` its own
        pongs and link_ups (with ``seen``: whether a link of it worked in the window).
    """
    zero = sf.lit(0).cast("long")
    working = (sf.col("pongs") + sf.col("ups")).cast("long")
    own = lw.select(
        "nid",
        "win",
        sf.col("records").cast("long").alias("own"),
        zero.alias("seen"),
        sf.col("misses").cast("long").alias("misses"),
        sf.col("downs").cast("long").alias("downs"),
        zero.alias("beacons"),
        working.alias("linked"),
    )
    seen = lw.where(working > 0).select(
        sf.col("pid").alias("nid"),
        "win",
        zero.alias("own"),
        working.alias("seen"),
        zero.alias("misses"),
        zero.alias("downs"),
        zero.alias("beacons"),
        zero.alias("linked"),
    )
    parts = own.unionByName(seen)
    if beacons is not None:
        parts = parts.unionByName(
            beacons.select(
                "nid",
                window_of(sf.col("ts"), window_ms).alias("win"),
                zero.alias("own"),
                zero.alias("seen"),
                zero.alias("misses"),
                zero.alias("downs"),
                sf.lit(1).cast("long").alias("beacons"),
                zero.alias("linked"),
            )
        )
    counts = ("own", "seen", "misses", "downs", "beacons", "linked")
    return (
        parts.groupBy("nid", "win")
        .agg(*[sf.sum(c).alias(c) for c in counts])
        .select("nid", "win", *counts)
    )


def node_availability(
    evidence: DataFrame,
    lw: DataFrame,
    nodes: DataFrame,
    *,
    first_win: int,
    last_win: int,
    window_ms: int,
) -> DataFrame:
    """Per node and hour: windows up out of windows analysed, and pongs answered.

    Args:
        evidence: :func:`node_evidence`.
        lw: per-link window counts.
        nodes: ``nid`` of every node.
        first_win: start of the first analysed (whole) window.
        last_win: start of the last one.
        window_ms: window width.

    Returns:
        ``nid, hour_ms, windows, windows_up, availability, pings, pongs, pong_ratio,
        records, beacons``; ``pong_ratio`` is the share of peers' pings to the node
        that it answered (null when nobody pinged it that hour).
    """
    # the analysed windows are a range: a filter and the hour arithmetic select them,
    # and the windows per hour (a few dozen rows) are counted here, not in a join
    per_hour: dict[int, int] = {}
    for win in range(first_win, last_win + window_ms, window_ms):
        hour = window_start_ms(win, HOUR_MS)
        per_hour[hour] = per_hour.get(hour, 0) + 1
    hours = nodes.sparkSession.createDataFrame(
        sorted(per_hour.items()), "hour long, windows long not null"
    )
    grid = nodes.select("nid").crossJoin(hours)
    in_span = sf.col("win").between(first_win, last_win)
    up = (
        evidence.where(in_span)
        .groupBy("nid", hour_of(sf.col("win")).alias("hour"))
        .agg(
            sf.count(sf.lit(1)).alias("windows_up"),
            sf.sum("own").alias("records"),
            sf.sum("beacons").alias("beacons"),
        )
    )
    asked = (
        lw.where(in_span)
        .select(sf.col("pid").alias("nid"), hour_of(sf.col("win")).alias("hour"), "pongs", "misses")
        .groupBy("nid", "hour")
        .agg(
            (sf.sum("pongs") + sf.sum("misses")).alias("pings"),
            sf.sum("pongs").alias("pongs"),
        )
    )
    return (
        grid.join(up, on=["nid", "hour"], how="left")
        .join(asked, on=["nid", "hour"], how="left")
        .select(
            sf.col("nid"),
            sf.col("hour").alias("hour_ms"),
            sf.col("windows"),
            sf.coalesce(sf.col("windows_up"), sf.lit(0)).alias("windows_up"),
            sf.try_divide(sf.coalesce(sf.col("windows_up"), sf.lit(0)), sf.col("windows")).alias(
                "availability"
            ),
            sf.coalesce(sf.col("pings"), sf.lit(0)).alias("pings"),
            sf.coalesce(sf.col("pongs"), sf.lit(0)).alias("pongs"),
            sf.try_divide(sf.col("pongs"), sf.col("pings")).alias("pong_ratio"),
            sf.coalesce(sf.col("records"), sf.lit(0)).alias("records"),
            sf.coalesce(sf.col("beacons"), sf.lit(0)).alias("beacons"),
        )
    )


def outages(
    evidence: DataFrame, nodes: DataFrame, first_win: int, last_win: int, window_ms: int
) -> DataFrame:
    """Runs of analysed windows in which a node was not up: ``nid, start_ms, end_ms, windows``.

    Computed from the gaps between a node's up windows (plus the gaps before its
    first and after its last), so the cost follows the evidence, not nodes x windows.
    """
    span_end = last_win + window_ms
    up = evidence.where(sf.col("win").between(first_win, last_win)).select("nid", "win")
    ordered = Window.partitionBy("nid").orderBy("win")
    with_prev = up.select(
        "nid", "win", sf.lag("win", 1).over(ordered.rowsBetween(-1, -1)).alias("prev")
    )
    inner = with_prev.where(
        sf.col("prev").isNotNull() & (sf.col("win") - sf.col("prev") > sf.lit(window_ms))
    ).select(
        "nid", (sf.col("prev") + sf.lit(window_ms)).alias("start_ms"), sf.col("win").alias("end_ms")
    )
    bounds = up.groupBy("nid").agg(sf.min("win").alias("first"), sf.max("win").alias("last"))
    every = nodes.select("nid").join(bounds, on="nid", how="left")
    leading = every.where(sf.col("first").isNull() | (sf.col("first") > sf.lit(first_win))).select(
        "nid",
        sf.lit(first_win).alias("start_ms"),
        sf.coalesce(sf.col("first"), sf.lit(span_end)).alias("end_ms"),
    )
    trailing = every.where(sf.col("last") < sf.lit(last_win)).select(
        "nid",
        (sf.col("last") + sf.lit(window_ms)).alias("start_ms"),
        sf.lit(span_end).alias("end_ms"),
    )
    return (
        inner.unionByName(leading)
        .unionByName(trailing)
        .select(
            "nid",
            "start_ms",
            "end_ms",
            ((sf.col("end_ms") - sf.col("start_ms")) / sf.lit(window_ms))
            .cast("long")
            .alias("windows"),
        )
    )
