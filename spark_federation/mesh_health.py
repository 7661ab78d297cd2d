"""The mesh-health job (spec §10): exports in, Parquet tables + summary.json + report out.

Run it as ``hearthnet mesh health ...``, ``python -m spark_federation.mesh_health ...``
or ``spark-submit spark_federation/mesh_health.py ...`` (same arguments; see
:mod:`spark_federation.cli`). Only the driver runs Python: every step is
DataFrame code, so executors need no copy of this package.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    # spark-submit runs this file as a script: make the package importable.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_federation import availability, clock, exports, links, partitions, propagation, relays
from spark_federation.errors import MeshHealthError
from spark_federation.params import JobConfig, full_windows
from spark_federation.report import ReportData, render
from spark_federation.timeline import hour_of

Progress = Callable[[str], None]


def build_session(
    master: str | None, *, driver_memory: str = "2g", shuffle_partitions: int | None = None,
    ui: bool = False,
) -> SparkSession:
    """The SparkSession for one run.

    Under spark-submit the master and resources come from spark-submit and are
    left alone. Otherwise ``master`` (default ``local[*]``) is used, and local
    mode gets a small shuffle-partition count: the default 200 costs more in
    task overhead than the data needs on a laptop.
    """
    builder = SparkSession.builder.appName("hearthnet-mesh-health")
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ and master is None
    if not under_submit:
        chosen = master or "local[*]"
        builder = builder.master(chosen).config("spark.driver.memory", driver_memory)
        if chosen.startswith("local"):
            cores = os.cpu_count() or 2
            builder = builder.config(
                "spark.sql.shuffle.partitions", str(shuffle_partitions or max(4, 2 * cores))
            )
        elif shuffle_partitions:
            builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        builder = builder.config("spark.ui.enabled", "true" if ui else "false")
    builder = builder.config("spark.sql.session.timeZone", "UTC")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


@dataclass(slots=True)
class _Tables:
    """Where tables go, and the id→NodeID map used to write them readable."""

    spark: SparkSession
    uri: str
    names: dict[int, str]
    written: list[str] = field(default_factory=list)

    def _map(self) -> Column:
        # one array literal per side, not one expression per node: the plan stays
        # small for thousands of nodes
        keys = F.lit(list(self.names)).cast("array<bigint>")
        return F.map_from_arrays(keys, F.lit(list(self.names.values())).cast("array<string>"))

    def node(self, c: Column) -> Column:
        """The NodeID for an id column."""
        return F.try_element_at(self._map(), c)

    def nodes(self, c: Column) -> Column:
        """NodeIDs for an array-of-ids column."""
        return F.transform(c, lambda x: F.try_element_at(self._map(), x))

    def write(self, df: DataFrame, name: str) -> DataFrame:
        """Write one small aggregated table as a single Parquet file and read it back."""
        path = f"{self.uri.rstrip('/')}/{name}"
        df.coalesce(1).write.mode("overwrite").parquet(path)
        self.written.append(name)
        return self.spark.read.parquet(path)


def run(spark: SparkSession, cfg: JobConfig, progress: Progress = print) -> dict[str, Any]:
    """Run the whole job; returns the summary (also written to ``out_dir/summary.json``).

    Raises:
        MeshHealthError: no input, no usable records, or components did not converge.
    """
    started = time.monotonic()

    def say(msg: str) -> None:
        progress(f"[{time.monotonic() - started:6.1f}s] {msg}")

    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tables_uri = cfg.tables_uri or (out / "tables").resolve().as_uri()
    w = cfg.window_ms

    files = exports.discover(spark, cfg.input_uri)
    say(
        f"found {len(files.exports)} exports: {files.count('heartbeats')} heartbeat,"
        f" {files.count('beacons')} beacon, {files.count('traces')} trace files"
    )
    raw_hb = exports.read_raw(spark, files, "heartbeats")
    raw_beacons = exports.read_raw(spark, files, "beacons")
    raw_traces = exports.read_raw(spark, files, "traces")
    assert raw_hb is not None  # discover() guarantees heartbeat files

    dedup = exports.dedup_heartbeats(
        exports.clean_heartbeats(raw_hb, cfg.since_ms, cfg.until_ms)
    ).persist(StorageLevel.MEMORY_AND_DISK)
    counts = exports.record_counts(dedup)
    say(
        f"heartbeats: {counts['records']} records, {counts['skipped']} skipped (malformed),"
        f" {counts['duplicates']} duplicates, {counts['out_of_range']} outside --since/--until"
    )
    if counts["records"] == 0:
        raise MeshHealthError(
            f"no usable heartbeat records in {cfg.input_uri}"
            f" ({counts['skipped']} malformed, {counts['out_of_range']} out of range)"
        )
    hb = exports.ok_rows(dedup)

    beacons = None
    beacon_counts: dict[str, int] | None = None
    if raw_beacons is not None:
        cleaned = exports.clean_beacons(raw_beacons, cfg.since_ms, cfg.until_ms).persist()
        beacon_counts = exports.record_counts(cleaned)
        beacons = cleaned.where(F.col("status") == exports.OK).select("nid", "ts", "name")
    traces = None
    trace_counts: dict[str, int] | None = None
    if raw_traces is not None:
        cleaned_t = exports.clean_traces(raw_traces, cfg.since_ms, cfg.until_ms).persist()
        trace_counts = exports.record_counts(cleaned_t)
        traces = cleaned_t.where(F.col("status") == exports.OK).select(
            "nid", "oid", "published_ms", "hops", "ts"
        )

    ids = {
        int(r["id"]): str(r["node"])
        for r in exports.node_dictionary(
            [r for r in (raw_hb, raw_beacons, raw_traces) if r is not None]
        ).collect()
    }
    bounds = hb.agg(F.min("ts").alias("lo"), F.max("ts").alias("hi")).first()
    assert bounds is not None
    first_win, last_win = full_windows(int(bounds["lo"]), int(bounds["hi"]), w)
    windows = spark.range(first_win, last_win + w, w).select(
        F.col("id").alias("win"), hour_of(F.col("id")).alias("hour")
    )
    node_ids = (
        hb.select(F.col("nid"))
        .unionByName(hb.select(F.col("pid").alias("nid")))
        .distinct()
        .persist()
    )
    n_nodes = node_ids.count()
    n_links = hb.select(F.least("nid", "pid"), F.greatest("nid", "pid")).distinct().count()
    names: dict[int, str] = {}
    if beacons is not None:
        names = {
            int(r["nid"]): str(r["name"])
            for r in beacons.where(F.col("name").isNotNull())
            .groupBy("nid")
            .agg(F.max_by("name", "ts").alias("name"))
            .collect()
        }
    say(
        f"{n_nodes} nodes, {n_links} links, {(last_win - first_win) // w + 1} windows of"
        f" {w // 1000}s from {_iso(first_win)} to {_iso(last_win + w)}"
    )
    t = _Tables(spark, tables_uri, ids)

    evidence = availability.node_evidence(hb, beacons, w).persist()
    avail = t.write(
        availability.node_availability(evidence, hb, node_ids, windows).select(
            t.node(F.col("nid")).alias("node"), *[c for c in _AVAIL_COLS]
        ),
        "node_availability",
    )
    downs = t.write(
        availability.outages(evidence, node_ids, first_win, last_win, w).select(
            t.node(F.col("nid")).alias("node"), "start_ms", "end_ms", "windows"
        ),
        "node_outages",
    )
    say("node_availability, node_outages written")

    flaps = links.flap_events(hb).persist()
    t.write(
        links.link_health(hb, flaps).select(
            t.node(F.col("nid")).alias("node"), t.node(F.col("pid")).alias("peer"),
            *[c for c in _LINK_COLS],
        ),
        "link_health",
    )
    flapping = links.flapping_links(flaps, cfg.thresholds.flap_threshold).select(
        t.node(F.col("a")).alias("a"), t.node(F.col("b")).alias("b"), "flaps", "max_per_hour"
    )
    rtt = links.link_rtt_distribution(hb).select(
        t.node(F.col("a")).alias("a"), t.node(F.col("b")).alias("b"), "q", "pongs"
    )
    say("link_health written")

    in_span = windows.select("win")
    edges = partitions.window_edges(hb, w).join(in_span, on="win", how="inner").select(
        "a", "b", "win"
    )
    vertices = partitions.window_vertices(edges, evidence).join(in_span, on="win", how="inner")
    labels, rounds = partitions.connected_components(
        vertices.select("nid", "win"),
        edges,
        cfg.thresholds.max_iterations,
        on_round=lambda i, n: say(f"components round {i}: {n} labels changed"),
    )
    comps = partitions.components(labels).persist()
    per_window = partitions.window_partitions(comps).persist()
    t.write(
        per_window.select(F.col("win").alias("window_start_ms"), "components", "sizes", "nodes_up"),
        "partitions",
    )
    split_comps = t.write(
        comps.join(per_window.where(F.col("components") > 1).select("win"), on="win", how="inner")
        .select(
            F.col("win").alias("window_start_ms"),
            "size",
            t.nodes(F.col("members")).alias("nodes"),
        ),
        "partition_components",
    )
    events = t.write(partitions.partition_events(per_window, w), "partition_events")
    say(f"partitions written ({rounds} component rounds)")

    relay_tab = t.write(
        relays.relay_dependence(hb, node_ids).select(
            t.node(F.col("nid")).alias("node"),
            "links", "relayed_links", "link_share", "pings", "relayed_pings", "traffic_share",
            t.nodes(F.col("relays")).alias("relays"), "is_relay", "relay_only",
        ),
        "relay_dependence",
    )
    skew_ids = clock.clock_skew(hb, cfg.thresholds.skew_threshold_ms).persist()
    skew_tab = t.write(
        skew_ids.select(
            t.node(F.col("nid")).alias("node"), "skew_ms", "p10_ms", "p90_ms", "samples", "skewed"
        ),
        "clock_skew",
    )
    prop_rows: list[dict[str, Any]] = []
    if traces is not None:
        prop = t.write(propagation.propagation(traces, skew_ids), "propagation")
        prop_rows = [r.asDict() for r in prop.orderBy("hops").collect()]
    say("relay_dependence, clock_skew" + (", propagation" if traces is not None else "") + " written")

    overall = {
        r["node"]: r["availability"]
        for r in avail.groupBy("node")
        .agg((F.sum("windows_up") / F.sum("windows")).alias("availability"))
        .collect()
    }
    summary = _summary(
        cfg, counts, beacon_counts, trace_counts, files, n_nodes, n_links,
        (first_win, last_win + w), overall,
        downs=[r.asDict() for r in downs.orderBy("start_ms", "node").collect()],
        events=[r.asDict() for r in events.orderBy("start_ms").collect()],
        flapping=[r.asDict() for r in flapping.collect()],
        relay_rows=[r.asDict() for r in relay_tab.collect()],
        skew_rows=[r.asDict() for r in skew_tab.collect()],
        prop_rows=prop_rows,
        names={ids[k]: v for k, v in names.items() if k in ids},
        tables=t.written,
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    say(f"summary.json written to {out}")

    if cfg.report:
        data = ReportData(
            summary=summary,
            availability=[
                r.asDict() for r in avail.select("node", "hour_ms", "availability").collect()
            ],
            rtt=[r.asDict() for r in rtt.collect()],
            components=[r.asDict() for r in split_comps.collect()],
            per_window=[
                r.asDict()
                for r in per_window.select("win", "components", "nodes_up").orderBy("win").collect()
            ],
            relay_rows=summary_relays(relay_tab),
        )
        render(out, data)
        say(f"report.html written to {out}")
    for df in (dedup, evidence, flaps, comps, per_window, node_ids, skew_ids):
        df.unpersist()
    return summary


_AVAIL_COLS = (
    "hour_ms", "windows", "windows_up", "availability", "pings", "pongs", "pong_ratio",
    "records", "beacons",
)
_LINK_COLS = (
    "hour_ms", "pings", "pongs", "misses", "loss_pct", "rtt_p50_ms", "rtt_p95_ms", "rtt_p99_ms",
    "flaps", "relayed_share",
)


def summary_relays(relay_tab: DataFrame) -> list[dict[str, Any]]:
    """Relay-dependence rows of nodes that use relays at all, for the report."""
    return [r.asDict() for r in relay_tab.where(F.col("relayed_links") > 0).collect()]


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def _summary(
    cfg: JobConfig,
    counts: dict[str, int],
    beacon_counts: dict[str, int] | None,
    trace_counts: dict[str, int] | None,
    files: exports.ExportFiles,
    n_nodes: int,
    n_links: int,
    span: tuple[int, int],
    overall: dict[str, float],
    *,
    downs: list[dict[str, Any]],
    events: list[dict[str, Any]],
    flapping: list[dict[str, Any]],
    relay_rows: list[dict[str, Any]],
    skew_rows: list[dict[str, Any]],
    prop_rows: list[dict[str, Any]],
    names: dict[str, str],
    tables: list[str],
) -> dict[str, Any]:
    """summary.json (spec §10 fields first, then what this job adds); see docs/mesh-health.md."""
    return {
        "records": counts["records"],
        "skipped": counts["skipped"],
        "duplicates": counts["duplicates"],
        "out_of_range": counts["out_of_range"],
        "nodes": n_nodes,
        "links": n_links,
        "window_s": cfg.window_ms // 1000,
        "span": {"start_ms": span[0], "end_ms": span[1]},
        "availability": {k: round(v, 4) for k, v in sorted(overall.items())},
        "outages": [
            {"node": d["node"], "start_ms": d["start_ms"], "end_ms": d["end_ms"]} for d in downs
        ],
        "partitions": [
            {
                "start_ms": e["start_ms"],
                "end_ms": e["end_ms"],
                "components": e["components"],
                "sizes": list(e["sizes"]),
            }
            for e in events
        ],
        "flapping_links": sorted(
            (
                {"node": min(f["a"], f["b"]), "peer": max(f["a"], f["b"]), "flaps": f["flaps"]}
                for f in flapping
            ),
            key=lambda f: (f["node"], f["peer"]),
        ),
        "relays": sorted(r["node"] for r in relay_rows if r["is_relay"]),
        "relay_only_nodes": sorted(r["node"] for r in relay_rows if r["relay_only"]),
        "clock_skew_ms": {
            r["node"]: round(float(r["skew_ms"]), 1) for r in sorted(skew_rows, key=lambda r: r["node"])
        },
        "skewed_nodes": sorted(r["node"] for r in skew_rows if r["skewed"]),
        "propagation": [
            {
                "hops": p["hops"],
                "messages": p["messages"],
                "p50_ms": round(float(p["p50_ms"]), 1),
                "p99_ms": round(float(p["p99_ms"]), 1),
            }
            for p in prop_rows
        ],
        "inputs": {
            "exports": len(files.exports),
            "files": {k: files.count(k) for k in exports.KINDS},
            "beacons": beacon_counts,
            "traces": trace_counts,
        },
        "names": dict(sorted(names.items())),
        "tables": tables,
        "thresholds": {
            "flap_per_hour": cfg.thresholds.flap_threshold,
            "skew_ms": cfg.thresholds.skew_threshold_ms,
        },
    }


if __name__ == "__main__":
    from spark_federation.cli import main

    sys.exit(main())
