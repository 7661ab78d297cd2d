"""Which nodes were up, per window and per hour, and when they were down (spec §10).

A node is *up in a window* when anything shows it running there: it wrote a
heartbeat record, a peer got a pong from it or saw its link come up, or it
published a beacon. Down means none of that; a node that lost every link and
exports no beacons writes nothing either, so without beacons it reads as down.
"""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Window
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
    # both rows of a link window (its node's own, and the peer seen when the link
    # worked) from one scan of the link windows: a second reference to a cached frame
    # in one query is not read from the cache, but computed again from its source
    own = sf.struct(
        sf.col("nid"),
        sf.col("win"),
        sf.col("records").cast("long").alias("own"),
        zero.alias("seen"),
        sf.col("misses").cast("long").alias("misses"),
        sf.col("downs").cast("long").alias("downs"),
        zero.alias("beacons"),
        working.alias("linked"),
        sf.lit(True).alias("kept"),
    )
    seen = sf.when(
        working > 0,
        sf.struct(
            sf.col("pid").alias("nid"),
            sf.col("win"),
            zero.alias("own"),
            working.alias("seen"),
            zero.alias("misses"),
            zero.alias("downs"),
            zero.alias("beacons"),
            zero.alias("linked"),
            sf.lit(True).alias("kept"),
        ),
    )
    # (a null struct is a row of nulls: dropped; no lambda, which Spark interprets)
    parts = (
        lw.select(sf.inline(sf.array(own, seen)))
        .where(sf.col("kept"))
        .select("nid", "win", "own", "seen", "misses", "downs", "beacons", "linked")
    )
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
    # from Arrow: a local relation, broadcast as it is (from a list: an RDD, and a job)
    hours = nodes.sparkSession.createDataFrame(
        pa.table(
            [pa.array(list(per_hour), pa.int64()), pa.array(list(per_hour.values()), pa.int64())],
            schema=pa.schema([("hour", pa.int64()), pa.field("windows", pa.int64(), False)]),
        )
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
    Each of ``nodes`` adds a marker row (no window, so first in its node's order) to its
    up windows, and one window over them finds every gap: after the marker up to the
    first up window (or to the end, for a node never up), between two up windows, and
    after the last (for a node with a marker). One scan of the evidence, no aggregate
    joined back (a broadcast join of one is a Spark job of its own).
    """
    span_end = last_win + window_ms
    w = sf.lit(window_ms)
    up = evidence.where(sf.col("win").between(first_win, last_win)).select("nid", "win")
    marked = up.unionByName(nodes.select("nid", sf.lit(None).cast("long").alias("win")))
    ordered = Window.partitionBy("nid").orderBy(sf.col("win").asc_nulls_first())
    around = marked.select(
        "nid",
        "win",
        sf.lag("win", 1).over(ordered.rowsBetween(-1, -1)).alias("prev"),
        sf.lead("win", 1).over(ordered.rowsBetween(1, 1)).alias("next"),
        sf.max(sf.col("win").isNull().cast("int")).over(Window.partitionBy("nid")).alias("listed"),
    )
    marker = sf.col("win").isNull()
    win, prev, nxt = sf.col("win"), sf.col("prev"), sf.col("next")
    listed = sf.col("listed") == 1  # a marker among the node's rows: one of ``nodes``

    def gap(start: Column, end: Column) -> Column:
        return sf.struct(start.cast("long").alias("start_ms"), end.cast("long").alias("end_ms"))

    gaps = sf.array(
        # before the first up window, or the whole span for a node never up
        sf.when(
            marker & (nxt.isNull() | (nxt > sf.lit(first_win))),
            gap(sf.lit(first_win), sf.coalesce(nxt, sf.lit(span_end))),
        ),
        # between two up windows
        sf.when(~marker & prev.isNotNull() & (win - prev > w), gap(prev + w, win)),
        # after the last up window
        sf.when(
            ~marker & nxt.isNull() & (win < sf.lit(last_win)) & listed,
            gap(win + w, sf.lit(span_end)),
        ),
    )
    # a null struct is a row of nulls, dropped (no lambda, which Spark interprets)
    found = around.select("nid", sf.inline(gaps)).where(sf.col("start_ms").isNotNull())
    return found.select(
        "nid",
        "start_ms",
        "end_ms",
        ((sf.col("end_ms") - sf.col("start_ms")) / w).cast("long").alias("windows"),
    )
