"""Link quality per (node, peer) and hour, and which links flap (spec §10).

Loss is the share of pings without a pong. A *flap* is a ``link_up`` that
follows a ``link_down`` on the same directed link (down→up). A single missed
pong never closes a link (three do, spec §7.5), so it never makes a flap.

:func:`link_windows`, :func:`pong_histogram` and :func:`flap_events` define, on
deduplicated records, the tables the rest derives from; the job computes them (the
link windows, the pong histogram as its RTT and offset halves, and the events) in one
pass over the records (:mod:`spark_federation.aggregate`,
checked against these definitions by the tests), and the steps below read only those.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as sf

from spark_federation.params import HOUR_MS
from spark_federation.quantiles import (
    bucket_value,
    histogram_quantiles,
    log_bucket,
    log_bucket_value,
)
from spark_federation.schema import LINK_DOWN, LINK_UP, MISS, PONG
from spark_federation.timeline import hour_of, window_of

RTT_QUANTILES = [0.05, 0.25, 0.5, 0.75, 0.95, 0.99]


def _count(kind: int) -> Column:
    return sf.sum((sf.col("kind") == kind).cast("int"))


# A link window's counts, in the order every table of link windows carries them.
WINDOW_COUNTS = ("records", "pongs", "misses", "ups", "downs", "relayed")


def link_windows(hb: DataFrame, window_ms: int) -> DataFrame:
    """Per directed link and window: counts of each kind, relayed pings, the relay, time bounds.

    Returns:
        ``nid, pid, win, records, pongs, misses, ups, downs, relayed, vid, lo_ts, hi_ts``;
        ``relayed`` counts pings (pongs and misses) that went via a relay.
    """
    return (
        hb.select(
            "nid",
            "pid",
            window_of(sf.col("ts"), window_ms).alias("win"),
            "kind",
            "ts",
            (sf.coalesce(sf.col("relay"), sf.lit(False)) & sf.col("kind").isin(PONG, MISS)).alias(
                "relayed"
            ),
            "vid",
        )
        .groupBy("nid", "pid", "win")
        .agg(
            sf.count(sf.lit(1)).alias("records"),
            _count(PONG).alias("pongs"),
            _count(MISS).alias("misses"),
            _count(LINK_UP).alias("ups"),
            _count(LINK_DOWN).alias("downs"),
            sf.sum(sf.col("relayed").cast("int")).alias("relayed"),
            sf.max("vid").alias("vid"),
            sf.min("ts").alias("lo_ts"),
            sf.max("ts").alias("hi_ts"),
        )
        .select("nid", "pid", "win", *WINDOW_COUNTS, "vid", "lo_ts", "hi_ts")
    )


def pong_histogram(hb: DataFrame) -> DataFrame:
    """Pongs per directed link, hour, RTT bucket and clock-offset millisecond.

    One pass serves both the RTT quantiles and the clock-skew estimate: within a
    link-hour RTT and offset each take a few dozen values, so the table stays small.

    Returns:
        ``nid, pid, hour_ms, bucket`` (log-spaced RTT), ``offset_ms`` (rounded), ``n``.
    """
    return (
        hb.where(sf.col("kind") == PONG)
        .select(
            "nid",
            "pid",
            hour_of(sf.col("ts")).alias("hour_ms"),
            log_bucket(sf.col("rtt_ms")).alias("bucket"),
            sf.round("clock_offset_ms").cast("long").alias("offset_ms"),
        )
        .groupBy("nid", "pid", "hour_ms", "bucket", "offset_ms")
        .agg(sf.count(sf.lit(1)).alias("n"))
        .select("nid", "pid", "hour_ms", "bucket", "offset_ms", "n")
    )


def rtt_histogram(pongs: DataFrame) -> DataFrame:
    """Pongs per directed link, hour and RTT bucket: ``nid, pid, hour_ms, bucket, n``."""
    return (
        pongs.where(sf.col("bucket").isNotNull())
        .groupBy("nid", "pid", "hour_ms", "bucket")
        .agg(sf.sum("n").alias("n"))
        .select("nid", "pid", "hour_ms", "bucket", "n")
    )


def _values(q: Column) -> Column:
    return sf.transform(q, log_bucket_value)


@dataclass(frozen=True, slots=True)
class RttHistogram:
    """The RTT histogram (:func:`rtt_histogram`'s rows) collected to the driver as arrays.

    Its rows are a few per link-hour (483,000 at 10 M records); quantiles from them
    on the driver cost a sort of the arrays, where Spark's window over them was a
    shuffle, a sort and a window per quantile table.
    """

    nid: npt.NDArray[np.int64]
    pid: npt.NDArray[np.int64]
    hour_ms: npt.NDArray[np.int64]
    bucket: npt.NDArray[np.int64]
    n: npt.NDArray[np.int64]

    @classmethod
    def from_arrow(cls, t: pa.Table) -> RttHistogram:
        """From a collected table with (at least) these columns, no nulls in them."""
        return cls(*columns(t, "nid", "pid", "hour_ms", "bucket", "n"))


def columns(t: pa.Table, *names: str) -> list[npt.NDArray[np.int64]]:
    """Whole-number columns of a collected Arrow table as int64 arrays."""
    return [np.asarray(t.column(c).to_numpy(), dtype=np.int64) for c in names]


def link_hours(spark: SparkSession, hist: RttHistogram) -> DataFrame:
    """Per directed link and hour: ``nid, pid, hour_ms, rtt_q`` (ms at :data:`RTT_QUANTILES`).

    The quantiles' buckets are found on the driver (:func:`histogram_quantiles`, the
    nearest rank) and handed to
    Spark as a local relation; the buckets' values are Spark's, as for every quantile.
    """
    keys, at, _ = histogram_quantiles(
        [hist.nid, hist.pid, hist.hour_ms], hist.bucket, hist.n, RTT_QUANTILES
    )
    q = pa.ListArray.from_arrays(
        pa.array(np.arange(0, at.size + 1, len(RTT_QUANTILES), dtype=np.int32)),
        pa.array(at.ravel().astype(np.int32)),
    )
    table = pa.table({"nid": keys[0], "pid": keys[1], "hour_ms": keys[2], "q": q})
    return spark.createDataFrame(table).select(
        "nid", "pid", "hour_ms", _values(sf.col("q")).alias("rtt_q")
    )


def flap_events(hb: DataFrame) -> DataFrame:
    """Every down→up transition: ``nid, pid, ts`` of the ``link_up`` that ended a down."""
    events = hb.where(sf.col("kind").isin(LINK_UP, LINK_DOWN)).select("nid", "pid", "ts", "kind")
    ordered = Window.partitionBy("nid", "pid").orderBy("ts", "kind").rowsBetween(-1, -1)
    return (
        events.select("nid", "pid", "ts", "kind", sf.lag("kind", 1).over(ordered).alias("prev"))
        .where((sf.col("kind") == LINK_UP) & (sf.col("prev") == LINK_DOWN))
        .select("nid", "pid", "ts")
    )


def link_hour_sums(lw: DataFrame) -> DataFrame:
    """Per directed link and hour, the link windows summed: ``nid, pid, hour_ms, pongs,
    misses, relayed, vid, lo_ts, hi_ts``.

    One aggregate over the link windows that link health, relay dependence and the
    job's span read (each a further sum over a few rows per link and hour) instead
    of each aggregating the link windows again.
    """
    return (
        lw.select(
            "nid",
            "pid",
            hour_of(sf.col("win")).alias("hour_ms"),
            "pongs",
            "misses",
            "relayed",
            "vid",
            "lo_ts",
            "hi_ts",
        )
        .groupBy("nid", "pid", "hour_ms")
        .agg(
            sf.sum("pongs").alias("pongs"),
            sf.sum("misses").alias("misses"),
            sf.sum("relayed").alias("relayed"),
            sf.max("vid").alias("vid"),
            sf.min("lo_ts").alias("lo_ts"),
            sf.max("hi_ts").alias("hi_ts"),
        )
    )


def link_health(sums: DataFrame, lh: DataFrame, flaps: DataFrame) -> DataFrame:
    """Per directed link and hour: pings, pongs, loss %, RTT p50/p95/p99, flaps, relay share.

    Args:
        sums: :func:`link_hour_sums`.
        lh: :func:`link_hours` (RTT quantiles).
        flaps: :func:`flap_events`.

    Returns:
        ``nid, pid, hour_ms, pings, pongs, misses, loss_pct, rtt_p50_ms, rtt_p95_ms,
        rtt_p99_ms, flaps, relayed_share``.
    """
    counts = sums.select("nid", "pid", "hour_ms", "pongs", "misses", "relayed")
    hourly_flaps = (
        flaps.select("nid", "pid", hour_of(sf.col("ts")).alias("hour_ms"))
        .groupBy("nid", "pid", "hour_ms")
        .agg(sf.count(sf.lit(1)).alias("flaps"))
    )
    pings = sf.col("pongs") + sf.col("misses")
    keys = ["nid", "pid", "hour_ms"]
    return (
        counts.join(lh, on=keys, how="left")
        # shuffled (hint), not broadcast: broadcasting an aggregate is a Spark job of its own
        .join(hourly_flaps.hint("shuffle_hash"), on=keys, how="left")
        .select(
            *keys,
            pings.alias("pings"),
            "pongs",
            "misses",
            sf.try_divide(sf.lit(100.0) * sf.col("misses"), pings).alias("loss_pct"),
            sf.col("rtt_q")[2].alias("rtt_p50_ms"),
            sf.col("rtt_q")[4].alias("rtt_p95_ms"),
            sf.col("rtt_q")[5].alias("rtt_p99_ms"),
            sf.coalesce(sf.col("flaps"), sf.lit(0)).alias("flaps"),
            sf.try_divide(sf.col("relayed"), pings).alias("relayed_share"),
        )
    )


def flapping_links(flaps: DataFrame, threshold: int) -> DataFrame:
    """Undirected links with at least ``threshold`` flaps within some hour (sliding).

    Both ends record each flap, so a link's count is the larger of its two
    directions (one end's export may be missing). Returns ``a, b, flaps,
    max_per_hour`` with ``a < b`` as ids; the summary orders them as NodeIDs.
    """
    per_hour = Window.partitionBy("nid", "pid").orderBy("ts").rangeBetween(-(HOUR_MS - 1), 0)
    directed = (
        flaps.select("nid", "pid", sf.count(sf.lit(1)).over(per_hour).alias("in_hour"))
        .groupBy("nid", "pid")
        .agg(sf.count(sf.lit(1)).alias("flaps"), sf.max("in_hour").alias("max_per_hour"))
    )
    return (
        directed.select(
            sf.least("nid", "pid").alias("a"),
            sf.greatest("nid", "pid").alias("b"),
            "flaps",
            "max_per_hour",
        )
        .groupBy("a", "b")
        .agg(sf.max("flaps").alias("flaps"), sf.max("max_per_hour").alias("max_per_hour"))
        .where(sf.col("max_per_hour") >= sf.lit(threshold))
        .select("a", "b", "flaps", "max_per_hour")
    )


def link_rtt_distribution(hist: RttHistogram) -> list[tuple[int, int, list[float], int]]:
    """Per undirected link over the whole span: ``(a, b, q, pongs)`` with ``a < b`` as
    ids, ``q`` the ms at :data:`RTT_QUANTILES`; both directions' pongs count (for the
    report's chart)."""
    a = np.minimum(hist.nid, hist.pid)
    b = np.maximum(hist.nid, hist.pid)
    # both directions and every hour into one histogram per link
    order = np.lexsort((hist.bucket, b, a))
    a, b, bucket, n = a[order], b[order], hist.bucket[order], hist.n[order]
    same = np.zeros(len(a), dtype=bool)
    same[1:] = (a[1:] == a[:-1]) & (b[1:] == b[:-1]) & (bucket[1:] == bucket[:-1])
    first = np.flatnonzero(~same)
    sums = np.add.reduceat(n, first) if len(first) else n[:0]
    keys, at, total = histogram_quantiles([a[first], b[first]], bucket[first], sums, RTT_QUANTILES)
    return [
        (int(x), int(y), [bucket_value(int(v)) for v in row], int(t))
        for x, y, row, t in zip(keys[0], keys[1], at, total, strict=True)
    ]
