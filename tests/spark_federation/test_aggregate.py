"""The one pass over the records gives what the record-wise definitions give."""

from __future__ import annotations

import json
from functools import reduce
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as sf

from spark_federation import aggregate, exports
from spark_federation.clock import offset_histogram
from spark_federation.links import flap_events, link_windows, pong_histogram, rtt_histogram

pytestmark = pytest.mark.spark

W = 60_000
A, B, C = ("ed25519:" + ch * 43 for ch in "ABC")


def _line(ts: int, node: str, peer: str, kind: str, seq: int, **more: Any) -> str:
    return json.dumps({"ts": ts, "node": node, "peer": peer, "kind": kind, "seq": seq, **more})


def _write(root: Path, export: str, lines: list[str]) -> None:
    d = root / export / "heartbeats"
    d.mkdir(parents=True)
    (d / "h.jsonl").write_text("\n".join(lines) + "\n")


def test_one_pass_equals_the_record_wise_tables(spark: Any, tmp_path: Path) -> None:
    """Link windows, RTT and clock-offset histograms, link events, counts and NodeIDs of
    the aggregate equal those of the deduplicated records: A read from two exports
    (copies), relayed and RTT-less pongs, an up and a down in one millisecond, malformed
    and late lines."""
    a = [
        _line(1_000, A, B, "pong", 1, rtt_ms=2.0, clock_offset_ms=3.4),
        _line(6_000, A, B, "pong", 2, rtt_ms=2.6, path="relay", via=C),
        _line(11_000, A, B, "miss", 3, path="relay", via=C),
        _line(61_000, A, B, "link_down", 4),
        _line(61_000, A, B, "link_up", 5),
        _line(66_000, A, B, "pong", 6, clock_offset_ms=-1.0),
    ]
    b = [
        _line(2_000, B, A, "pong", 1, rtt_ms=2.1, clock_offset_ms=-3.0),
        _line(62_000, B, A, "link_down", 2),
        _line(64_000, B, A, "link_up", 3),
        _line(900_000, B, A, "pong", 4, rtt_ms=1.0),  # after --until
        "not json",
        _line(3_000, B, B, "pong", 5),  # a node pinging itself
    ]
    _write(tmp_path, "ea", a)
    _write(tmp_path, "ea2", [*a[1:4], _line(70_000, A, B, "pong", 7, rtt_ms=9.0)])
    _write(tmp_path, "eb", b)
    files = exports.discover(spark, str(tmp_path))
    with_files = exports.read_raw(spark, files, "heartbeats")
    assert with_files is not None
    obs = aggregate.observe(with_files, W, None, 600_000)
    records = exports.ok_rows(exports.clean_heartbeats(with_files, None, 600_000)).dropDuplicates(
        ["nid", "pid", "kind", "seq", "ts"]
    )
    # a link window can be split over rows (a file, a relay, an event each): their sums count
    merged = obs.lw.groupBy("nid", "pid", "win").agg(
        *[sf.sum(c).alias(c) for c in ("records", "pongs", "misses", "ups", "downs", "relayed")],
        sf.max("vid").alias("vid"),
        sf.min("lo_ts").alias("lo_ts"),
        sf.max("hi_ts").alias("hi_ts"),
    )
    tables = {
        "lw": (link_windows(records, W), merged),
        "rtt": (rtt_histogram(pong_histogram(records)), obs.rtt),
        "offsets": (offset_histogram(pong_histogram(records)), obs.offsets),
        "flaps": (flap_events(records), flap_events(obs.events)),
    }
    # every table of both sides in one collect: each Spark job costs more than these rows
    got: dict[tuple[str, int], list[str]] = {(t, side): [] for t in tables for side in (0, 1)}
    parts = [
        df.select(
            sf.lit(t).alias("t"),
            sf.lit(side).alias("side"),
            sf.to_json(sf.struct("*")).alias("row"),
        )
        for t, pair in tables.items()
        for side, df in enumerate(pair)
    ]
    for r in reduce(DataFrame.unionByName, parts).collect():
        got[(r["t"], r["side"])].append(r["row"])
    assert (
        {t: sorted(got[(t, 0)]) for t in tables},
        {"records": 10, "duplicates": 3, "skipped": 2, "out_of_range": 1},
        [A, B, C],
    ) == (
        {t: sorted(got[(t, 1)]) for t in tables},
        obs.counts,
        sorted(obs.ids.values()),
    )
    assert [True] * 4 == [len(got[(t, 0)]) > 0 for t in tables]
