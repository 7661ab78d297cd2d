"""Single steps on hand-made DataFrames with known answers."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as sf

from spark_federation import exports, propagation
from spark_federation.availability import outages
from spark_federation.errors import MeshHealthError
from spark_federation.links import (
    RttHistogram,
    flap_events,
    flapping_links,
    link_health,
    link_hour_sums,
    link_hours,
    link_windows,
    pong_histogram,
    rtt_histogram,
)
from spark_federation.quantiles import histogram_quantiles, log_bucket, log_bucket_value
from spark_federation.schema import LINK_DOWN, LINK_UP, MISS
from spark_federation.tables import Tables

pytestmark = pytest.mark.spark

W = 60_000


def quantiles(hist: DataFrame, keys: list[str], qs: list[float]) -> DataFrame:
    """The nearest-rank quantiles in Spark (a window over the histogram): the definition
    :func:`histogram_quantiles` is checked against. ``keys..., q`` (array of buckets).

    Args:
        hist: ``keys..., bucket, n`` with ``n`` rows in each bucket; no duplicate buckets.
        keys: the grouping columns.
        qs: quantiles in [0, 1].

    Returns:
        ``keys..., q``: for each quantile the smallest bucket whose cumulative count
        reaches ``q * total`` (the nearest-rank definition).
    """
    group = Window.partitionBy(*keys)
    ordered = group.orderBy("bucket").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    whole = group.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    cum = hist.select(
        *keys,
        "bucket",
        sf.sum("n").over(ordered).alias("cum"),
        sf.sum("n").over(whole).alias("total"),
    )
    return (
        cum.groupBy(*keys)
        .agg(
            *[
                sf.min(
                    sf.when(sf.col("cum") >= sf.ceil(sf.lit(q) * sf.col("total")), sf.col("bucket"))
                ).alias(f"q{i}")
                for i, q in enumerate(qs)
            ]
        )
        .select(*keys, sf.array(*[sf.col(f"q{i}") for i in range(len(qs))]).alias("q"))
    )


def test_flaps_count_down_then_up_only(spark: Any) -> None:
    """up, down, up, miss, down, up gives two flaps; an up after an up is not one."""
    kinds = [LINK_UP, LINK_DOWN, LINK_UP, MISS, LINK_DOWN, LINK_UP, LINK_UP]
    rows = [(1, 2, k, 1000 * i) for i, k in enumerate(kinds)]
    hb = spark.createDataFrame(rows, "nid long, pid long, kind byte, ts long")
    assert sorted(r["ts"] for r in flap_events(hb).collect()) == [2000, 5000]


def test_flapping_needs_threshold_within_an_hour(spark: Any) -> None:
    """Three flaps within an hour flag a link; three spread over three hours do not."""
    hour = 3_600_000
    rows = [(1, 2, t) for t in (0, 600_000, 1_200_000)] + [(3, 4, t) for t in (0, hour, 2 * hour)]
    flaps = spark.createDataFrame(rows, "nid long, pid long, ts long")
    got = [(r["a"], r["b"], r["flaps"]) for r in flapping_links(flaps, 3).collect()]
    assert got == [(1, 2, 3)]


def test_outages_from_gaps(spark: Any) -> None:
    """Gaps inside, before and after up windows are outages; a silent node is always down."""
    up = [(1, w * W) for w in (0, 1, 4, 5)] + [(2, w * W) for w in (2, 3, 4, 5, 6, 7)]
    ev = spark.createDataFrame(up, "nid long, win long")
    nodes = spark.createDataFrame([(1,), (2,), (3,)], "nid long")
    got = sorted(tuple(r) for r in outages(ev, nodes, 0, 7 * W, W).collect())
    expected = [(1, 2 * W, 4 * W, 2), (1, 6 * W, 8 * W, 2), (2, 0, 2 * W, 2), (3, 0, 8 * W, 8)]
    assert expected == got


def test_malformed_lines_are_counted_not_fatal(spark: Any, tmp_path: Any) -> None:
    """Cut-off, non-JSON, mistyped, unknown-kind and bad-id lines are skipped; good lines count."""
    node, peer = "ed25519:" + "A" * 43, "ed25519:" + "B" * 43
    good = (
        f'{{"ts": 1000, "node": "{node}", "peer": "{peer}", "kind": "pong", "seq": 1,'
        f' "rtt_ms": 2.5}}'
    )
    bad = [
        '{"ts": 1000, "node": "' + node,
        "not json",
        f'{{"ts": "soon", "node": "{node}", "peer": "{peer}", "kind": "pong", "seq": 2}}',
        f'{{"ts": 1000, "node": "{node}", "peer": "{peer}", "kind": "ping", "seq": 3}}',
        f'{{"ts": 1000, "node": "bob", "peer": "{peer}", "kind": "pong", "seq": 4}}',
        f'{{"ts": 1000, "node": "{node}", "peer": "{peer}", "kind": "pong", "rtt_ms": "x"}}',
        f'{{"ts": 1000, "node": "{node}", "peer": "{node}", "kind": "pong", "seq": 5}}',
    ]
    d = tmp_path / "e1" / "heartbeats"
    d.mkdir(parents=True)
    (d / "a.jsonl").write_text("\n".join([good, good, *bad]))
    files = exports.discover(spark, str(tmp_path))
    raw = exports.read_raw(spark, files, "heartbeats")
    assert raw is not None
    counts = exports.record_counts(exports.dedup_heartbeats(exports.clean_heartbeats(raw)))
    assert {"records": 1, "duplicates": 1, "skipped": len(bad), "out_of_range": 0} == counts


def test_missing_input_is_a_clear_error(spark: Any, tmp_path: Any) -> None:
    """An input without heartbeat files raises MeshHealthError naming the layout."""
    with pytest.raises(MeshHealthError, match="no heartbeat files"):
        exports.discover(spark, str(tmp_path))
    with pytest.raises(MeshHealthError, match="does not exist"):
        exports.discover(spark, str(tmp_path / "nope"))


def test_since_until_leave_records_out_of_range(spark: Any, tmp_path: Any) -> None:
    """Records before --since or from --until on are counted out of range, not analysed."""
    node, peer = "ed25519:" + "A" * 43, "ed25519:" + "B" * 43
    lines = [
        f'{{"ts": {ts}, "node": "{node}", "peer": "{peer}", "kind": "pong", "seq": {i},'
        f' "rtt_ms": 1.0}}'
        for i, ts in enumerate((1_000, 2_000, 3_000, 4_000))
    ]
    d = tmp_path / "e1" / "heartbeats"
    d.mkdir(parents=True)
    (d / "a.jsonl").write_text("\n".join(lines) + "\n")
    raw = exports.read_raw(spark, exports.discover(spark, str(tmp_path)), "heartbeats")
    assert raw is not None
    clean = exports.clean_heartbeats(raw, since_ms=2_000, until_ms=4_000)
    counts = exports.record_counts(exports.dedup_heartbeats(clean))
    assert counts == {"records": 2, "duplicates": 0, "skipped": 0, "out_of_range": 2}


def test_single_export_input_is_read_once_with_the_same_rows(spark: Any, tmp_path: Any) -> None:
    """With every node in one export, the one-scan path gives the rows and counts of the
    full deduplication: ok rows with one copy each, malformed and out-of-range counted."""
    a, b = "ed25519:" + "A" * 43, "ed25519:" + "B" * 43
    lines = [
        f'{{"ts": {ts}, "node": "{n}", "peer": "{p}", "kind": "pong", "seq": {i}, "rtt_ms": 1.5}}'
        for i, (ts, n, p) in enumerate(
            ((1_000, a, b), (2_000, a, b), (2_000, b, a), (9_000, b, a), (3_000, a, a))
        )
    ]
    for export, part in (("ea", lines[:2] + lines[4:]), ("eb", [*lines[2:4], "not json"])):
        d = tmp_path / export / "heartbeats"
        d.mkdir(parents=True)
        (d / "x.jsonl").write_text("\n".join(part) + "\n")
    files = exports.discover(spark, str(tmp_path))
    raws = {k: exports.read_raw(spark, files, k) for k in exports.KINDS}
    raw = raws["heartbeats"]
    assert raw is not None
    clean = exports.clean_heartbeats(raw, until_ms=5_000)
    once, full = exports.dedup_heartbeats(clean, []), exports.dedup_heartbeats(clean, None)

    def rows(df: Any) -> list[tuple[Any, ...]]:
        return sorted(tuple(r) for r in exports.ok_rows(df).collect())

    assert (
        [],
        {"records": 3, "duplicates": 0, "skipped": 2, "out_of_range": 1},
        rows(full),
        exports.record_counts(full),
    ) == (
        exports.node_names(raws).multi_export,
        exports.record_counts(once),
        rows(once),
        exports.record_counts(once),
    )


def test_link_hour_without_pings_has_no_loss(spark: Any) -> None:
    """An hour in which a link only came up has null loss, not a division error (ANSI mode)."""
    rows = [(1, 2, LINK_UP, None, 1_000, None, False, None, None)]
    hb = spark.createDataFrame(
        rows,
        "nid long, pid long, kind byte, seq long, ts long, rtt_ms double, relay boolean,"
        " vid long, clock_offset_ms double",
    )
    rtt = link_hours(spark, RttHistogram.from_arrow(rtt_histogram(pong_histogram(hb)).toArrow()))
    health = link_health(link_hour_sums(link_windows(hb, W)), rtt, flap_events(hb)).collect()
    assert [(r["pings"], r["loss_pct"], r["rtt_p50_ms"]) for r in health] == [(0, None, None)]


def test_histogram_quantiles_are_nearest_rank(spark: Any) -> None:
    """Buckets 1..10 with one row each: p10 is bucket 1, the median 5, p90 9, p100 10."""
    hist = spark.createDataFrame([(1, b, 1) for b in range(1, 11)], "g long, bucket long, n long")
    got = quantiles(hist, ["g"], [0.1, 0.5, 0.9, 1.0]).collect()
    assert [(r["g"], list(r["q"])) for r in got] == [(1, [1, 5, 9, 10])]


def test_histogram_quantiles_on_the_driver_equal_sparks(spark: Any) -> None:
    """Random histograms of two-column groups (single buckets, ties at a quantile's rank,
    large counts): the driver's nearest-rank buckets and totals are Spark's."""
    rnd = random.Random(7)
    rows = [
        (g, h, b, rnd.choice([1, 1, 2, 7, 10**9]))
        for g in range(-3, 4)
        for h in range(rnd.randint(1, 3))
        for b in rnd.sample(range(-40, 300), rnd.randint(1, 30))
    ]
    qs = [0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0]
    hist = spark.createDataFrame(rows, "g long, h long, bucket long, n long")
    want = {(r["g"], r["h"]): list(r["q"]) for r in quantiles(hist, ["g", "h"], qs).collect()}
    cols = [np.array([r[i] for r in rows], dtype=np.int64) for i in range(4)]
    keys, at, total = histogram_quantiles(cols[:2], cols[2], cols[3], qs)
    got = {(int(g), int(h)): [int(b) for b in q] for g, h, q in zip(*keys, at, strict=True)}
    sums: dict[tuple[int, int], int] = {}
    for g, h, _, n in rows:
        sums[(g, h)] = sums.get((g, h), 0) + n
    assert (want, sums) == (got, dict(zip(got, map(int, total), strict=True)))
    assert sorted(got) == list(got)  # groups come out in key order


def test_log_buckets_hold_rtt_within_tolerance(spark: Any) -> None:
    """A bucket's middle is within 2.2 % of every RTT that falls into it."""
    values = [0.3, 1.0, 3.4, 17.0, 250.0, 4000.0]
    df = spark.createDataFrame([(v,) for v in values], "v double")
    mids = [r["m"] for r in df.select(log_bucket_value(log_bucket(df["v"])).alias("m")).collect()]
    assert [True] * len(values) == [
        abs(m - v) / v <= 0.022 for m, v in zip(mids, values, strict=True)
    ]


def test_records_without_the_catch_up_field_are_classified_by_the_receivers_links(
    spark: Any,
) -> None:
    """An unmarked receive is live when the receiver wrote heartbeats within 6 s before and
    after the publish (it was linked throughout), catch-up otherwise; a marked one keeps
    its mark."""
    hb = spark.createDataFrame(
        [(1, t) for t in range(0, 60_001, 5_000)]
        + [(1, t) for t in range(300_000, 400_001, 5_000)],
        "nid long, ts long",
    )
    traces = spark.createDataFrame(
        [
            (1, 2, 30_000, 1, 30_004, None),  # linked at the publish: live
            (1, 2, 120_000, 1, 302_000, None),  # no heartbeat 60 s..300 s: catch-up
            (1, 2, 61_000, 1, 310_000, None),  # 1 s after its last heartbeat, none after
            (1, 2, 58_000, 1, 58_002, None),  # between two heartbeats 5 s apart: live
            (1, 2, 330_000, 1, 330_003, True),  # marked by the node: kept
        ],
        "nid long, oid long, published_ms long, hops long, ts long, catch_up boolean",
    )
    skew = spark.createDataFrame([(1, 0.0), (2, 0.0)], "nid long, skew_ms double")
    got = sorted(
        (r["delay"], r["catch_up"], r["inferred"])
        for r in propagation.delays(traces, skew, hb).collect()
    )
    assert [
        (2.0, False, True),
        (3.0, True, False),
        (4.0, False, True),
        (182_000.0, True, True),
        (249_000.0, True, True),
    ] == got
    counts = propagation.split_counts(propagation.delays(traces, skew, hb)).first()
    assert counts is not None
    assert (5, 2, 3, 4) == (
        counts["records"],
        counts["live"],
        counts["catch_up"],
        counts["inferred"],
    )


def test_table_rows_read_back_equal_a_collect(spark: Any, tmp_path: Any) -> None:
    """A table's rows read back from its file on the driver equal those collected by Spark,
    also for an empty table."""
    df = spark.createDataFrame(
        [(2, [3, 1], None, 0.25), (1, [], "b", None)],
        "n long, sizes array<long>, s string, x double",
    )
    local = Tables((tmp_path / "a").as_uri(), {}, [], tmp_path / "a")
    elsewhere = Tables((tmp_path / "b").as_uri(), {}, [])
    read_back = local.write(df, "t", "n") + local.write(df.where("n > 2"), "empty")
    collected = elsewhere.write(df, "t", "n") + elsewhere.write(df.where("n > 2"), "empty")
    assert (
        [
            {"n": 1, "sizes": [], "s": "b", "x": None},
            {"n": 2, "sizes": [3, 1], "s": None, "x": 0.25},
        ]
        == read_back
        == collected
    )
