"""One pass over the heartbeat records: the aggregates every table derives from (spec §10).

The records are read once and never cached. One hash aggregate with three grouping
sets (Spark feeds each record to all three) reduces them to:

- the *link windows*: per record status, (node, peer, relay, file) and window, the
  count of each kind, the relayed pings, the first and last ``ts`` (the rows of
  malformed and out-of-range records fold into one group per status: their counts).
  A ``link_up`` or ``link_down`` keeps its ``ts`` and kind in the key, so the *link
  events* are the rows that have them (a few per link and day): they need no grouping
  set of their own;
- the *RTT histogram*: pongs per (node, peer), hour and RTT bucket;
- the *offset histogram*: pongs per (node, peer) and clock-offset millisecond.

Availability, graph edges, relay dependence, loss and flaps derive from the first; RTT
quantiles from the second, clock skew from the third. On the benchmark's input of
10 M records they hold about 840,000, 483,000 and 3,400 rows, and every later step
reads them instead of the records. One histogram of (hour, RTT bucket, offset) had
1.4 million rows, which the steps after the pass summed per bucket; the two small
ones cost a record one more row into the aggregate, into a map of a few thousand
entries (docs/benchmarks-log.md). Link windows and link hours as sets of their own (the
file and relay out of their key) cost the pass more than they saved after it.

NodeIDs stay strings in the pass and are hashed to ids (:func:`spark_federation.exports.node_key`)
on the aggregate's rows: the grouping hashes each record's key anyway, and the
node dictionary (and which nodes came in more than one export) is then read from the
few hundred distinct (node, peer, relay, file) combinations of the first table
instead of from a pass of its own. The file's path stays a string in the key: hashing
its directory to a long in every record cost the pass more than the string does
(docs/benchmarks-log.md).

A node's records are in its own exports only (spec §7.5), so copies of one
observation can come only from a node read from two export dirs. When there is such
a node, its rows of every set are computed again from its deduplicated
records (one more pass over those records only); everyone else's stand.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as sf

from spark_federation.clock import OffsetHistogram
from spark_federation.exports import MALFORMED, OK, OUT_OF_RANGE, classify_heartbeats, node_key
from spark_federation.links import WINDOW_COUNTS, RttHistogram, columns
from spark_federation.quantiles import log_bucket
from spark_federation.schema import LINK_DOWN, LINK_UP, MISS, PONG
from spark_federation.timeline import hour_of, window_of

_KEYS = (
    "status", "node", "peer", "via", "file", "win", "ev_ts", "ev_kind",
    "hour", "bucket", "offset_ms",
)  # fmt: skip
_SETS = (
    ("status", "node", "peer", "via", "file", "win", "ev_ts", "ev_kind"),
    ("node", "peer", "hour", "bucket"),
    ("node", "peer", "offset_ms"),
)


def _grouping_id(kept: tuple[str, ...]) -> int:
    """Spark's ``grouping_id()`` of a grouping set: a bit per key column, set when the
    column is not in the set (the first column is the highest bit)."""
    n = len(_KEYS)
    return sum(1 << (n - 1 - i) for i, c in enumerate(_KEYS) if c not in kept)


LINKS, RTT, OFFSETS = (_grouping_id(s) for s in _SETS)


@dataclass(frozen=True, slots=True)
class Observations:
    """The aggregates of :func:`observe`, NodeIDs as ids.

    Attributes:
        lw: the columns of :func:`spark_federation.links.link_windows`; a link window
            can be several rows, which sum to its row there.
        rtt: pongs per link, hour and RTT bucket, the columns of
            :func:`spark_federation.links.rtt_histogram`.
        offsets: pongs per link and clock-offset millisecond: ``nid, pid, offset_ms, n``
            (what :func:`spark_federation.clock.clock_skew` reads).
        hists: the rows of ``rtt`` (``offset_ms`` null) and of ``offsets`` (``hour_ms``
            and ``bucket`` null) in one frame: ``nid, pid, hour_ms, bucket, offset_ms, n``.
        events: ``nid, pid, ts, kind`` of each link_up/link_down (an event recorded
            twice in one export may repeat).
        counts: ``records``, ``duplicates``, ``skipped``, ``out_of_range``
            (:func:`spark_federation.exports.record_counts`).
        ids: id → NodeID of every NodeID in the usable records.
    """

    lw: DataFrame
    rtt: DataFrame
    offsets: DataFrame
    hists: DataFrame
    events: DataFrame
    counts: dict[str, int]
    ids: dict[int, str]


def _count(kind: int) -> Column:
    return sf.sum((sf.col("kind") == kind).cast("long"))


# below this magnitude a double's fraction is exact and x.5 is a double
_EXACT_FRACTION = float(1 << 52)


def round_to_long(x: Column) -> Column:
    """``round(x)`` (half up, i.e. away from zero) as a long, the same as
    ``sf.round(x).cast("long")`` without its decimal conversion of every value.

    Spark rounds a double through its decimal string (``BigDecimal.valueOf``); below
    2^52 the fraction ``|x| - floor(|x|)`` is exact and that string is on the same
    side of each ``k + 0.5`` as the double itself, so comparing the fraction with 0.5
    gives the same whole number. Larger values, infinities and NaN go to ``sf.round``.
    """
    a = sf.abs(x)
    whole = sf.floor(a)
    up = whole + ((a - whole) >= sf.lit(0.5)).cast("long")
    quick = sf.when(x < sf.lit(0.0), -up).otherwise(up)
    return sf.when(a < sf.lit(_EXACT_FRACTION), quick).otherwise(sf.round(x).cast("long"))


def _aggregate(classified: DataFrame, window_ms: int) -> DataFrame:
    """The two grouping sets over classified records with ``copies`` (a column per key
    of :data:`_KEYS`, ``g`` = the set, and the sums)."""
    kind = sf.col("kind")
    pong = kind == PONG
    event = kind.isin(LINK_UP, LINK_DOWN)
    rows = classified.select(
        "status",
        "node",
        "peer",
        "via",
        "file",
        window_of(sf.col("ts"), window_ms).alias("win"),
        sf.when(event, sf.col("ts")).alias("ev_ts"),
        sf.when(event, kind).alias("ev_kind"),
        sf.when(pong, hour_of(sf.col("ts"))).alias("hour"),
        sf.when(pong, log_bucket(sf.col("rtt_ms"))).alias("bucket"),
        sf.when(pong, round_to_long(sf.col("clock_offset_ms"))).alias("offset_ms"),
        "kind",
        "ts",
        "copies",
        (sf.coalesce(sf.col("relay"), sf.lit(False)) & kind.isin(PONG, MISS)).alias("relayed"),
    )
    return rows.groupingSets([list(s) for s in _SETS], *_KEYS).agg(
        sf.grouping_id().alias("g"),
        sf.count(sf.lit(1)).alias("records"),
        sf.sum("copies").alias("copies"),
        _count(PONG).alias("pongs"),
        _count(MISS).alias("misses"),
        _count(LINK_UP).alias("ups"),
        _count(LINK_DOWN).alias("downs"),
        sf.sum(sf.col("relayed").cast("long")).alias("relayed"),
        sf.min("ts").alias("lo_ts"),
        sf.max("ts").alias("hi_ts"),
    )


def _deduplicated(classified: DataFrame, nodes: list[str]) -> DataFrame:
    """The ok records of ``nodes``, one row per observation (node, peer, kind, seq, ts) with
    the number of copies read, for :func:`_aggregate`."""
    return (
        classified.where((sf.col("status") == sf.lit(OK)) & sf.col("node").isin(nodes))
        .groupBy("status", "node", "peer", "kind", "seq", "ts")
        .agg(
            sf.first("rtt_ms", ignorenulls=True).alias("rtt_ms"),
            sf.first("relay", ignorenulls=True).alias("relay"),
            sf.first("via", ignorenulls=True).alias("via"),
            sf.first("clock_offset_ms", ignorenulls=True).alias("clock_offset_ms"),
            sf.count(sf.lit(1)).alias("copies"),
        )
        .select("*", sf.lit(None).cast("string").alias("file"))
    )


def observe(
    raw: DataFrame,
    window_ms: int,
    since_ms: int | None,
    until_ms: int | None,
) -> Observations:
    """Reduce the raw heartbeat rows (read with their ``file``) to :class:`Observations`.

    Args:
        raw: :func:`spark_federation.exports.read_raw` of the heartbeats, ``with_file``.
        window_ms: window width.
        since_ms: records before are out of range.
        until_ms: records from then on are out of range.
    """
    classified = classify_heartbeats(raw, since_ms, until_ms)
    # a checkpoint, not a cache: every frame derived from it reads the stored aggregate,
    # and none carries the records' plan (file metadata, grouping sets) that a cache
    # lookup would have to match
    first = _aggregate(
        classified.select("*", sf.lit(1).cast("long").alias("copies")), window_ms
    ).localCheckpoint(eager=False)
    # one small collect: the record counts per status, and the distinct (node, peer, relay,
    # file) of the usable records with their ids (the dictionary, and who has two exports)
    combos = (
        first.where(sf.col("g") == LINKS)
        .groupBy("status", "node", "peer", "via", "file")
        .agg(sf.sum("records").alias("rows"), sf.sum("copies").alias("copies"))
        .select("*", _nid("node"), _nid("peer", "pid"), _nid("via", "vid"))
        .collect()
    )
    ids: dict[int, str] = {}
    exports_of: dict[str, set[str]] = {}
    by_status: dict[int, tuple[int, int]] = {}
    for r in combos:
        rows, copies = by_status.get(r["status"], (0, 0))
        by_status[r["status"]] = (rows + r["rows"], copies + r["copies"])
        if r["status"] == OK:
            exports_of.setdefault(r["node"], set()).add(str(r["file"]).rsplit("/", 2)[0])
            for i, n in (("nid", "node"), ("pid", "peer"), ("vid", "via")):
                if r[n] is not None:
                    ids[int(r[i])] = str(r[n])
    multi = sorted(n for n, dirs in exports_of.items() if len(dirs) > 1)
    agg = first
    if multi:
        others = sf.coalesce(~sf.col("node").isin(multi), sf.lit(True))
        agg = (
            first.where(others)
            .unionByName(_aggregate(_deduplicated(classified, multi), window_ms))
            .localCheckpoint(eager=False)
        )
        by_status = {
            int(r["status"]): (int(r["rows"]), int(r["copies"]))
            for r in agg.where(sf.col("g") == LINKS)
            .groupBy("status")
            .agg(sf.sum("records").alias("rows"), sf.sum("copies").alias("copies"))
            .collect()
        }
    # both histograms in one frame: the driver collects them together (one read of the
    # aggregate), an RTT row with its bucket, an offset row with its offset
    hists = agg.where(
        ((sf.col("g") == RTT) & sf.col("bucket").isNotNull())
        | ((sf.col("g") == OFFSETS) & sf.col("offset_ms").isNotNull())
    ).select(
        _nid("node"),
        _nid("peer", "pid"),
        sf.col("hour").alias("hour_ms"),
        "bucket",
        "offset_ms",
        sf.col("records").alias("n"),
    )
    return Observations(
        lw=_link_windows(agg),
        rtt=hists.where(sf.col("bucket").isNotNull()).select(
            "nid", "pid", "hour_ms", "bucket", "n"
        ),
        offsets=hists.where(sf.col("offset_ms").isNotNull()).select("nid", "pid", "offset_ms", "n"),
        hists=hists,
        # an event read from two files of one export (or with two relays) is two rows
        # here: flaps (down, then up, in (ts, kind) order) are the same with or without
        # such exact repeats
        events=agg.where((sf.col("g") == LINKS) & sf.col("ev_ts").isNotNull()).select(
            _nid("node"),
            _nid("peer", "pid"),
            sf.col("ev_ts").alias("ts"),
            sf.col("ev_kind").alias("kind"),
        ),
        counts=_counts(by_status),
        ids=ids,
    )


def _nid(c: str, alias: str = "nid") -> Column:
    return node_key(sf.col(c)).alias(alias)


def _link_windows(agg: DataFrame) -> DataFrame:
    """The link windows by id, as the pass left them: one link and window can be several
    rows (its records in two files, via two relays, or a link event with its ``ts`` in
    the key). Every step that reads them sums per node, link or window, so they are not
    merged here: merging 840,000 rows at 10 M records cost a shuffle and an aggregate
    for the few windows that are split."""
    return agg.where((sf.col("g") == LINKS) & (sf.col("status") == sf.lit(OK))).select(
        _nid("node"),
        _nid("peer", "pid"),
        "win",
        *WINDOW_COUNTS,
        node_key(sf.col("via")).alias("vid"),
        "lo_ts",
        "hi_ts",
    )


def _counts(by_status: dict[int, tuple[int, int]]) -> dict[str, int]:
    """summary.json's record counts from (rows, copies) per status."""
    rows, copies = by_status.get(OK, (0, 0))
    return {
        "records": rows,
        "duplicates": copies - rows,
        "skipped": by_status.get(MALFORMED, (0, 0))[1],
        "out_of_range": by_status.get(OUT_OF_RANGE, (0, 0))[1],
    }


def collect_histograms(hists: DataFrame) -> tuple[RttHistogram, OffsetHistogram]:
    """:attr:`Observations.hists` in one collect (as Arrow), split on the driver."""
    t = hists.toArrow()
    rtt = t.filter(pc.is_valid(t.column("bucket")))
    offsets = t.filter(pc.is_valid(t.column("offset_ms")))
    return RttHistogram.from_arrow(rtt), OffsetHistogram(
        *columns(offsets, "nid", "pid", "offset_ms", "n")
    )
