"""The mesh-health job (spec §10): exports in, Parquet tables + summary.json + report out.

Run it as ``hearthnet mesh health ...``, ``python -m spark_federation.mesh_health ...``
or ``spark-submit spark_federation/mesh_health.py ...`` (same arguments; see
:mod:`spark_federation.cli`). Only the driver runs Python: every step is
DataFrame code, so executors need no copy of this package.
"""

from __future__ import annotations

import json
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
from pyspark.sql import functions as sf

from spark_federation import (
    aggregate,
    availability,
    cli,
    clock,
    exports,
    links,
    partitions,
    propagation,
    relays,
)
from spark_federation.errors import MeshHealthError
from spark_federation.params import JobConfig, full_windows
from spark_federation.report import ReportData, render
from spark_federation.timeline import hour_of

Progress = Callable[[str], None]


@dataclass(slots=True)
class _Tables:
    """Where tables go, and the id→NodeID map used to write them readable."""

    uri: str
    names: dict[int, str]
    cached: list[DataFrame]
    written: list[str] = field(default_factory=list)

    def _map(self) -> Column:
        # one array literal per side, not one expression per node: the plan stays
        # small for thousands of nodes
        keys = sf.lit(list(self.names)).cast("array<bigint>")
        return sf.map_from_arrays(keys, sf.lit(list(self.names.values())).cast("array<string>"))

    def node(self, c: Column) -> Column:
        """The NodeID for an id column."""
        return sf.try_element_at(self._map(), c)

    def nodes(self, c: Column) -> Column:
        """NodeIDs for an array-of-ids column."""
        return sf.transform(c, lambda x: sf.try_element_at(self._map(), x))

    def write(self, df: DataFrame, name: str) -> DataFrame:
        """Write one small aggregated table as a single Parquet file; returns it cached.

        The table is computed once, in parallel, into the cache; the write
        coalesces that to one file, and later collects read the cache.
        """
        path = f"{self.uri.rstrip('/')}/{name}"
        kept = df.persist()
        self.cached.append(kept)
        kept.coalesce(1).write.mode("overwrite").parquet(path)
        self.written.append(name)
        return kept


def run(spark: SparkSession, cfg: JobConfig, progress: Progress = print) -> dict[str, Any]:
    """Run the whole job; returns the summary (also written to ``out_dir/summary.json``).

    Raises:
        MeshHealthError: no input, no usable records, or components did not converge.
    """
    job = _Job(spark, cfg, progress)
    try:
        job.read()
        job.availability()
        job.links()
        job.partitions()
        job.nodes()
        return job.finish()
    finally:
        job.release()


class _Job:
    """One run: the phases of :func:`run` and the frames they hand each other."""

    def __init__(self, spark: SparkSession, cfg: JobConfig, progress: Progress) -> None:
        self.spark = spark
        self.cfg = cfg
        self.progress = progress
        self.started = time.monotonic()
        self.local = str(spark.sparkContext.master).startswith("local")
        self.out = Path(cfg.out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.w = cfg.window_ms
        self.cached: list[DataFrame] = []
        self.collected: dict[str, list[dict[str, Any]]] = {}
        self.jobs_before = self._jobs_run()

    def _jobs_run(self) -> int:
        """Spark jobs this session has run so far (those Spark still keeps track of)."""
        return len(self.spark.sparkContext.statusTracker().getJobIdsForGroup())

    def say(self, msg: str) -> None:
        """A progress line: seconds into the job and, in local mode, the CPU seconds the
        JVM has used so far (with the machine shared, the measure of each phase's work)."""
        cpu = _jvm_cpu_seconds(self.spark) if self.local else None
        used = f" cpu {cpu:6.1f}s" if cpu is not None else ""
        self.progress(f"[{time.monotonic() - self.started:6.1f}s{used}] {msg}")

    def keep(self, df: DataFrame, level: StorageLevel = StorageLevel.MEMORY_AND_DISK) -> DataFrame:
        """Cache a frame that several steps read; released when the run ends."""
        self.cached.append(df.persist(level))
        return df

    def release(self) -> None:
        for df in self.cached:
            df.unpersist()

    def read(self) -> None:
        """Find and read the exports, count bad and duplicate records, map ids to NodeIDs."""
        cfg = self.cfg
        self.files = exports.discover(self.spark, cfg.input_uri)
        self.say(
            f"found {len(self.files.exports)} exports: {self.files.count('heartbeats')} heartbeat,"
            f" {self.files.count('beacons')} beacon, {self.files.count('traces')} trace files"
        )
        raws = {
            k: exports.read_raw(self.spark, self.files, k, with_file=False) for k in exports.KINDS
        }
        # one pass over the heartbeat records (read with their files) reduces them to the
        # aggregates every later step reads; the records themselves are never cached
        with_files = exports.read_raw(self.spark, self.files, "heartbeats")
        assert with_files is not None  # discover() guarantees heartbeat files
        obs = aggregate.observe(
            with_files,
            self.w,
            cfg.since_ms,
            cfg.until_ms,
        )
        self.obs = obs
        self.ids = dict(obs.ids)
        if raws["beacons"] is not None or raws["traces"] is not None:
            self.ids.update(exports.node_names({k: raws[k] for k in ("beacons", "traces")}).ids)
        self.counts = c = obs.counts
        self.say(
            f"heartbeats: {c['records']} records, {c['skipped']} skipped (malformed),"
            f" {c['duplicates']} duplicates, {c['out_of_range']} outside --since/--until"
        )
        if c["records"] == 0:
            raise MeshHealthError(
                f"no usable heartbeat records in {cfg.input_uri}"
                f" ({c['skipped']} malformed, {c['out_of_range']} out of range)"
            )
        raw_hb = raws["heartbeats"]
        assert raw_hb is not None  # discover() guarantees heartbeat files
        # the records again, only where traces lacking their catch_up mark need them
        self.hb = exports.ok_rows(exports.clean_heartbeats(raw_hb, cfg.since_ms, cfg.until_ms))
        self.beacons: DataFrame | None = None
        self.traces: DataFrame | None = None
        self.side_counts: dict[str, dict[str, int] | None] = {"beacons": None, "traces": None}
        if raws["beacons"] is not None:
            b = self.keep(exports.clean_beacons(raws["beacons"], cfg.since_ms, cfg.until_ms))
            self.side_counts["beacons"] = exports.record_counts(b)
            self.beacons = b.where(sf.col("status") == exports.OK).select("nid", "ts", "name")
        if raws["traces"] is not None:
            t = self.keep(exports.clean_traces(raws["traces"], cfg.since_ms, cfg.until_ms))
            self.side_counts["traces"] = exports.record_counts(t)
            self.traces = t.where(sf.col("status") == exports.OK).select(
                "nid", "oid", "published_ms", "hops", "ts", "catch_up"
            )
        self.names: dict[int, str] = {}
        if self.beacons is not None:
            latest = (
                self.beacons.where(sf.col("name").isNotNull())
                .groupBy("nid")
                .agg(sf.max_by("name", "ts").alias("name"))
            )
            self.names = {int(r["nid"]): str(r["name"]) for r in latest.collect()}
        self.tables = _Tables(
            cfg.tables_uri or (self.out / "tables").resolve().as_uri(),
            self.ids,
            self.cached,
        )
        self._span()

    def _span(self) -> None:
        """The per-link aggregates, the analysed windows, the nodes and the number of links."""
        w = self.w
        self.lw = self.keep(self.obs.lw)
        self.pongs = self.keep(self.obs.pongs)
        self.rtt_hist = self.keep(links.rtt_histogram(self.pongs))
        # one small collect (a row per directed link) gives the span, the nodes and the
        # links, instead of an action for each
        per_link = self.lw.groupBy("nid", "pid").agg(
            sf.min("lo_ts").alias("lo"), sf.max("hi_ts").alias("hi")
        )
        directed = [(int(r["nid"]), int(r["pid"]), r["lo"], r["hi"]) for r in per_link.collect()]
        lo = min(d[2] for d in directed)
        hi = max(d[3] for d in directed)
        self.first_win, self.last_win = full_windows(int(lo), int(hi), w)
        self.windows = self.spark.range(self.first_win, self.last_win + w, w).select(
            sf.col("id").alias("win"), hour_of(sf.col("id")).alias("hour")
        )
        nodes = sorted({d[0] for d in directed} | {d[1] for d in directed})
        self.node_ids = self.keep(self.spark.createDataFrame([(n,) for n in nodes], "nid long"))
        self.n_nodes = len(nodes)
        self.n_links = len({(min(d[0], d[1]), max(d[0], d[1])) for d in directed})
        self.say(
            f"{self.n_nodes} nodes, {self.n_links} links,"
            f" {(self.last_win - self.first_win) // w + 1} windows of {w // 1000}s"
            f" from {_iso(self.first_win)} to {_iso(self.last_win + w)}"
        )

    def availability(self) -> None:
        """node_availability and node_outages."""
        t = self.tables
        self.evidence = self.keep(availability.node_evidence(self.lw, self.beacons, self.w))
        self.avail = t.write(
            availability.node_availability(
                self.evidence, self.lw, self.node_ids, self.windows
            ).select(t.node(sf.col("nid")).alias("node"), *_AVAIL_COLS),
            "node_availability",
        )
        downs = t.write(
            availability.outages(
                self.evidence, self.node_ids, self.first_win, self.last_win, self.w
            ).select(t.node(sf.col("nid")).alias("node"), "start_ms", "end_ms", "windows"),
            "node_outages",
        )
        self.collected["outages"] = _rows(downs, "start_ms", "node")
        self.say("node_availability, node_outages written")

    def links(self) -> None:
        """link_health, flapping links and the RTT distribution for the report."""
        t = self.tables
        flaps = self.keep(links.flap_events(self.obs.events))
        t.write(
            links.link_health(self.lw, links.link_hours(self.rtt_hist), flaps).select(
                t.node(sf.col("nid")).alias("node"),
                t.node(sf.col("pid")).alias("peer"),
                *_LINK_COLS,
            ),
            "link_health",
        )
        flapping = links.flapping_links(flaps, self.cfg.thresholds.flap_threshold)
        self.collected["flapping"] = _rows(
            flapping.select(t.node(sf.col("a")).alias("a"), t.node(sf.col("b")).alias("b"), "flaps")
        )
        self.collected["rtt"] = _rows(
            links.link_rtt_distribution(self.rtt_hist).select(
                t.node(sf.col("a")).alias("a"), t.node(sf.col("b")).alias("b"), "q", "pongs"
            )
        )
        self.say("link_health written")

    def partitions(self) -> None:
        """Connected components per window, partitions, partition_components, partition_events."""
        t, w = self.tables, self.w
        in_span = self.windows.select("win")
        edges = (
            partitions.window_edges(self.lw)
            .join(in_span, on="win", how="inner")
            .select("a", "b", "win")
            .localCheckpoint(eager=False)
        )
        vertices = (
            partitions.window_vertices(edges, self.evidence)
            .join(in_span, on="win", how="inner")
            .select("nid", "win")
            .localCheckpoint(eager=False)
        )
        labels, rounds, graphs = partitions.window_components(
            vertices.select("nid", "win"),
            edges.select("a", "b", "win"),
            self.cfg.thresholds.max_iterations,
            on_round=lambda i, n: self.say(f"components round {i}: {n} labels changed"),
        )
        comps = self.keep(partitions.components(labels))
        per_window = self.keep(partitions.window_partitions(comps))
        t.write(
            per_window.select(
                sf.col("win").alias("window_start_ms"), "components", "sizes", "nodes_up"
            ),
            "partitions",
        )
        split = per_window.where(sf.col("components") > 1).select("win")
        split_comps = t.write(
            comps.join(split, on="win", how="inner").select(
                sf.col("win").alias("window_start_ms"),
                "size",
                t.nodes(sf.col("members")).alias("nodes"),
            ),
            "partition_components",
        )
        events = t.write(partitions.partition_events(per_window, w), "partition_events")
        self.collected["events"] = _rows(events, "start_ms")
        self.collected["components"] = _rows(split_comps)
        self.collected["per_window"] = _rows(
            per_window.select("win", "components", "nodes_up"), "win"
        )
        self.say(f"partitions written ({graphs} distinct graphs, {rounds} component rounds)")

    def nodes(self) -> None:
        """relay_dependence, clock_skew and (with traces) propagation."""
        t = self.tables
        relay_tab = t.write(
            relays.relay_dependence(self.lw, self.node_ids).select(
                t.node(sf.col("nid")).alias("node"),
                "links",
                "relayed_links",
                "link_share",
                "pings",
                "relayed_pings",
                "traffic_share",
                t.nodes(sf.col("relays")).alias("relays"),
                "is_relay",
                "relay_only",
            ),
            "relay_dependence",
        )
        self.collected["relays"] = _rows(relay_tab)
        skew_ids = self.keep(clock.clock_skew(self.pongs, self.cfg.thresholds.skew_threshold_ms))
        skew_tab = t.write(
            skew_ids.select(
                t.node(sf.col("nid")).alias("node"),
                "skew_ms",
                "p10_ms",
                "p90_ms",
                "samples",
                "skewed",
            ),
            "clock_skew",
        )
        self.collected["skew"] = _rows(skew_tab)
        self.collected["propagation"] = []
        self.collected["catch_up"] = []
        if self.traces is not None:
            self._propagation(skew_ids)
        self.say("relay_dependence, clock_skew, propagation written")

    def _propagation(self, skew_ids: DataFrame) -> None:
        """propagation (live receives) and catch_up (backlog), measured apart."""
        assert self.traces is not None
        t = self.tables
        unmarked = self.traces.where(sf.col("catch_up").isNull()).limit(1).count()
        timed = self.keep(propagation.delays(self.traces, skew_ids, self.hb if unmarked else None))
        prop = t.write(propagation.propagation(timed), "propagation")
        self.collected["propagation"] = _rows(prop, "hops")
        late = self.keep(propagation.catch_up(timed))
        per_node = t.write(
            late.where(sf.col("nid").isNotNull()).select(
                t.node(sf.col("nid")).alias("node"), "messages", "p50_ms", "p99_ms", "max_ms"
            ),
            "catch_up",
        )
        self.collected["catch_up"] = _rows(per_node, "node")
        self.collected["catch_up_all"] = _rows(late.where(sf.col("nid").isNull()))
        self.collected["trace_split"] = _rows(propagation.split_counts(timed))

    def finish(self) -> dict[str, Any]:
        """summary.json and the report."""
        # a row per node and hour: one collect serves the overall figures and the chart
        hourly = _rows(
            self.avail.select("node", "hour_ms", "availability", "windows_up", "windows")
        )
        overall = _overall_availability(hourly)
        summary = _summary(
            self.cfg,
            counts=self.counts,
            side_counts=self.side_counts,
            files=self.files,
            sizes=(self.n_nodes, self.n_links),
            span=(self.first_win, self.last_win + self.w),
            overall=overall,
            collected=self.collected,
            names={self.ids[k]: v for k, v in self.names.items() if k in self.ids},
            tables=self.tables.written,
        )
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        self.say(f"summary.json written to {self.out}")
        if self.cfg.report:
            c = self.collected
            render(
                self.out,
                ReportData(
                    summary=summary,
                    availability=[
                        {k: r[k] for k in ("node", "hour_ms", "availability")} for r in hourly
                    ],
                    rtt=c["rtt"],
                    components=c["components"],
                    per_window=c["per_window"],
                    relay_rows=[r for r in c["relays"] if r["relayed_links"] > 0],
                ),
            )
            self.say(f"report.html written to {self.out}")
        cpu = _jvm_cpu_seconds(self.spark)
        if cpu is not None:
            # in local mode the driver JVM is all of Spark; on a cluster it is the driver only;
            # the number of Spark jobs measures the fixed cost, whatever the machine's load
            jobs = self._jobs_run() - self.jobs_before
            self.say(f"JVM CPU time {cpu:.1f}s, {jobs} Spark jobs")
        return summary


def _overall_availability(hourly: list[dict[str, Any]]) -> dict[str, float]:
    """Per node, windows up over windows analysed across all its hours (nodes without an
    analysed window are left out)."""
    up: dict[str, int] = {}
    total: dict[str, int] = {}
    for r in hourly:
        up[r["node"]] = up.get(r["node"], 0) + int(r["windows_up"] or 0)
        total[r["node"]] = total.get(r["node"], 0) + int(r["windows"] or 0)
    return {n: up[n] / total[n] for n in total if total[n]}


def _jvm_cpu_seconds(spark: SparkSession) -> float | None:
    """CPU time the driver JVM has used so far, if the JVM reports it.

    With the machine shared, this is the measure of the job's own work that other
    processes do not inflate (the benchmark reports it beside wall time).
    """
    jvm: Any = spark.sparkContext._jvm
    total = jvm.java.lang.ProcessHandle.current().info().totalCpuDuration()
    return float(total.get().toMillis()) / 1000 if total.isPresent() else None


def _rows(df: DataFrame, *order: str) -> list[dict[str, Any]]:
    """Collect a small result as plain dicts, sorted by ``order`` (nulls first, as Spark
    sorts) on the driver: a Spark ``orderBy`` would add a sampling job and a sort stage."""
    rows = [r.asDict() for r in df.collect()]
    if order:
        rows.sort(key=lambda r: tuple((r[k] is not None, r[k]) for k in order))
    return rows


_AVAIL_COLS = (
    "hour_ms",
    "windows",
    "windows_up",
    "availability",
    "pings",
    "pongs",
    "pong_ratio",
    "records",
    "beacons",
)
_LINK_COLS = (
    "hour_ms",
    "pings",
    "pongs",
    "misses",
    "loss_pct",
    "rtt_p50_ms",
    "rtt_p95_ms",
    "rtt_p99_ms",
    "flaps",
    "relayed_share",
)


def _catch_up_summary(collected: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """summary.json ``catch_up``: backlog receives, apart from live propagation (None
    without traces)."""
    split = collected.get("trace_split")
    if not split:
        return None
    [counts] = split
    [total] = collected.get("catch_up_all") or [{"p50_ms": None, "p99_ms": None, "max_ms": None}]

    def ms(v: Any) -> float | None:
        return None if v is None else round(float(v), 1)

    return {
        "messages": counts["catch_up"],
        "p50_ms": ms(total["p50_ms"]),
        "p99_ms": ms(total["p99_ms"]),
        "max_ms": ms(total["max_ms"]),
        "nodes": {r["node"]: r["messages"] for r in collected["catch_up"]},
        "live_messages": counts["live"],
        "inferred": counts["inferred"],
    }


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def _summary(
    cfg: JobConfig,
    *,
    counts: dict[str, int],
    side_counts: dict[str, dict[str, int] | None],
    files: exports.ExportFiles,
    sizes: tuple[int, int],
    span: tuple[int, int],
    overall: dict[str, float],
    collected: dict[str, list[dict[str, Any]]],
    names: dict[str, str],
    tables: list[str],
) -> dict[str, Any]:
    """summary.json (spec §10 fields first, then what this job adds); see docs/mesh-health.md."""
    return {
        "records": counts["records"],
        "skipped": counts["skipped"],
        "duplicates": counts["duplicates"],
        "out_of_range": counts["out_of_range"],
        "nodes": sizes[0],
        "links": sizes[1],
        "window_s": cfg.window_ms // 1000,
        "span": {"start_ms": span[0], "end_ms": span[1]},
        "availability": {k: round(v, 4) for k, v in sorted(overall.items())},
        "outages": [
            {"node": d["node"], "start_ms": d["start_ms"], "end_ms": d["end_ms"]}
            for d in collected["outages"]
        ],
        "partitions": [
            {
                "start_ms": e["start_ms"],
                "end_ms": e["end_ms"],
                "components": e["components"],
                "sizes": list(e["sizes"]),
            }
            for e in collected["events"]
        ],
        "flapping_links": sorted(
            (
                {"node": min(f["a"], f["b"]), "peer": max(f["a"], f["b"]), "flaps": f["flaps"]}
                for f in collected["flapping"]
            ),
            key=lambda f: (f["node"], f["peer"]),
        ),
        "relays": sorted(r["node"] for r in collected["relays"] if r["is_relay"]),
        "relay_only_nodes": sorted(r["node"] for r in collected["relays"] if r["relay_only"]),
        "clock_skew_ms": {
            r["node"]: round(float(r["skew_ms"]), 1)
            for r in sorted(collected["skew"], key=lambda r: r["node"])
        },
        "skewed_nodes": sorted(r["node"] for r in collected["skew"] if r["skewed"]),
        "propagation": [
            {
                "hops": p["hops"],
                "messages": p["messages"],
                "p50_ms": round(float(p["p50_ms"]), 1),
                "p99_ms": round(float(p["p99_ms"]), 1),
            }
            for p in collected["propagation"]
        ],
        "catch_up": _catch_up_summary(collected),
        "inputs": {
            "exports": len(files.exports),
            "files": {k: files.count(k) for k in exports.KINDS},
            "beacons": side_counts["beacons"],
            "traces": side_counts["traces"],
        },
        "names": dict(sorted(names.items())),
        "tables": tables,
        "thresholds": {
            "flap_per_hour": cfg.thresholds.flap_threshold,
            "skew_ms": cfg.thresholds.skew_threshold_ms,
        },
    }


if __name__ == "__main__":
    sys.exit(cli.main())
