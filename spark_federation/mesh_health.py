"""The mesh-health job (spec §10): exports in, Parquet tables + summary.json + report out.

Run it as ``hearthnet mesh health ...``, ``python -m spark_federation.mesh_health ...``
or ``spark-submit spark_federation/mesh_health.py ...`` (same arguments; see
:mod:`spark_federation.cli`). Only the driver runs Python: every step is
DataFrame code, so executors need no copy of this package.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

if __package__ in (None, ""):
    # spark-submit runs this file as a script: make the package importable.
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

from spark_federation import (
    aggregate,
    availability,
    cli,
    clock,
    exports,
    graphs,
    links,
    partitions,
    propagation,
    relays,
    session,
    summary,
)
from spark_federation.errors import MeshHealthError
from spark_federation.params import JobConfig, full_windows
from spark_federation.report import Charts, ReportData
from spark_federation.tables import Tables
from spark_federation.tables import rows as _rows

Progress = Callable[[str], None]


def run(spark: SparkSession, cfg: JobConfig, progress: Progress = print) -> dict[str, Any]:
    """Run the whole job; returns the summary (also written to ``out_dir/summary.json``).

    Raises:
        MeshHealthError: no input, no usable records, or components did not converge.
    """
    job = _Job(spark, cfg, progress)
    try:
        job.read()
        # every step from here reads the pass's small aggregates or the side records
        # (beacons, traces), not the heartbeat records (local mode: see session)
        with (
            session.scoped_conf(spark, session.AFTER_PASS_CONF if job.local else {}),
            session.quick_jit(spark) if job.local else contextlib.nullcontext(),
        ):
            job.steps()
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
        # the report's charts are drawn in a thread of their own as their rows come in
        self.charts = Charts(self.out) if cfg.report else None

    def _jobs_run(self) -> int:
        """Spark jobs this session has run so far (those Spark still keeps track of)."""
        return len(self.spark.sparkContext.statusTracker().getJobIdsForGroup())

    def say(self, msg: str) -> None:
        """A progress line: seconds into the job, in local mode the CPU seconds the JVM
        has used so far (with the machine shared, the measure of each phase's work), and
        the Spark jobs run so far (the fixed cost, whatever the load)."""
        cpu = _jvm_cpu_seconds(self.spark) if self.local else None
        used = f" cpu {cpu:6.1f}s" if cpu is not None else ""
        jobs = self._jobs_run() - self.jobs_before
        self.progress(f"[{time.monotonic() - self.started:6.1f}s{used} {jobs:4d} jobs] {msg}")

    def keep(self, df: DataFrame, level: StorageLevel = StorageLevel.MEMORY_AND_DISK) -> DataFrame:
        """Cache a frame that several steps read; released when the run ends."""
        self.cached.append(df.persist(level))
        return df

    def release(self) -> None:
        if self.charts is not None:
            self.charts.close()
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
        self.raws = raws
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

    def sides(self) -> None:
        """The beacons and traces: NodeIDs, deduplicated rows, counts, node names."""
        cfg, raws = self.cfg, self.raws
        self.ids = dict(self.obs.ids)
        if raws["beacons"] is not None or raws["traces"] is not None:
            self.ids.update(exports.node_names({k: raws[k] for k in ("beacons", "traces")}).ids)
        raw_hb = raws["heartbeats"]
        assert raw_hb is not None  # discover() guarantees heartbeat files
        # the records again, only where traces lacking their catch_up mark need them
        self.hb = exports.ok_rows(exports.clean_heartbeats(raw_hb, cfg.since_ms, cfg.until_ms))
        self.beacons: DataFrame | None = None
        self.traces: DataFrame | None = None
        self.side_counts: dict[str, dict[str, int] | None] = {"beacons": None, "traces": None}
        self.names: dict[int, str] = {}
        self.unmarked = 0
        if raws["beacons"] is not None:
            b = self.keep(exports.clean_beacons(raws["beacons"], cfg.since_ms, cfg.until_ms))
            # the counts and each node's latest name in one collect
            named = sf.when(sf.col("name").isNotNull(), sf.col("ts"))
            counts, per_node = exports.counts_and(b, "nid", name=sf.max_by("name", named))
            self.side_counts["beacons"] = counts
            self.names = {
                int(r["nid"]): str(r["name"])
                for r in per_node
                if r["status"] == exports.OK and r["name"] is not None
            }
            self.beacons = b.where(sf.col("status") == exports.OK).select("nid", "ts", "name")
        if raws["traces"] is not None:
            t = self.keep(exports.clean_traces(raws["traces"], cfg.since_ms, cfg.until_ms))
            # the counts, and whether any receive lacks its catch_up mark, in one collect
            unmarked = sf.sum(sf.col("catch_up").isNull().cast("long"))
            counts, per_status = exports.counts_and(t, unmarked=unmarked)
            self.side_counts["traces"] = counts
            self.unmarked = sum(int(r["unmarked"]) for r in per_status if r["status"] == exports.OK)
            self.traces = t.where(sf.col("status") == exports.OK).select(
                "nid", "oid", "published_ms", "hops", "ts", "catch_up"
            )
        # beacon names by NodeID, for summary.json and the report
        self.node_names = {self.ids[k]: v for k, v in self.names.items() if k in self.ids}
        uri = cfg.tables_uri or (self.out / "tables").resolve().as_uri()
        parsed = urlparse(uri)
        self.tables = Tables(
            uri,
            self.ids,
            self.cached,
            Path(url2pathname(parsed.path)) if self.local and parsed.scheme == "file" else None,
        )

    def steps(self) -> None:
        """Every table, from two driver threads: Spark runs the jobs of both at once.

        Alone, each step's jobs leave a core idle much of the time (the driver planning
        the next query, a stage of one task). The side records, the span and the
        histograms need nothing of each other and start together; the chain of windows
        (availability, partitions) and the chain of links (link health, relays, clock
        skew, propagation) then need the first two, the links also the histograms.
        """
        with ThreadPoolExecutor(max_workers=5, thread_name_prefix="mesh-health") as pool:
            sided = pool.submit(self.sides)
            spanned = pool.submit(self.span)
            histograms = pool.submit(self.histograms)

            def windows() -> None:
                sided.result()
                spanned.result()
                self.availability()
                self.draw("availability")
                self.partitions()
                self.draw("partitions")

            def per_link() -> None:
                sided.result()
                spanned.result()
                histograms.result()
                self.links()
                self.draw("rtt")
                self.nodes()
                self.draw("relays")

            chains = [pool.submit(windows), pool.submit(per_link)]
            for done in chains:
                done.result()

    def span(self) -> None:
        """The per-link aggregates, the analysed windows, the nodes and the number of links."""
        w = self.w
        self.lw = self.keep(self.obs.lw)
        # the link-hour sums (a few rows per link: 14,000 at 10 M records) in one collect:
        # the span, the nodes and the links are read off them here, and link health and
        # relay dependence read them back as a local relation (nothing cached, no job
        # computing them again)
        sums = links.link_hour_sums(self.lw).toArrow()
        self.sums = self.spark.createDataFrame(sums)
        nid, pid, lo_ts, hi_ts = links.columns(sums, "nid", "pid", "lo_ts", "hi_ts")
        self.first_win, self.last_win = full_windows(int(lo_ts.min()), int(hi_ts.max()), w)
        self.node_list = nodes = np.union1d(nid, pid).tolist()  # ascending
        # a local relation (made from Arrow; from a list it is a parallelized RDD, and a
        # join broadcasting it a job): joins take it as it is, with no job
        self.node_ids = self.spark.createDataFrame(pa.table({"nid": pa.array(nodes, pa.int64())}))
        self.n_nodes = len(nodes)
        ends = set(zip(np.minimum(nid, pid).tolist(), np.maximum(nid, pid).tolist(), strict=True))
        self.n_links = len(ends)
        self.say(
            f"{self.n_nodes} nodes, {self.n_links} links,"
            f" {(self.last_win - self.first_win) // w + 1} windows of {w // 1000}s"
            f" from {_iso(self.first_win)} to {_iso(self.last_win + w)}"
        )
        # nodes no record links, not even a missed ping: most likely exports of two
        # communities in one input, whose every window then reads as a partition
        groups = sorted((len(g) for g in graphs.components_of(nodes, ends)), reverse=True)
        if len(groups) > 1:
            self.say(
                f"warning: {len(groups)} groups of nodes ({', '.join(map(str, groups))})"
                " never pinged each other: exports of more than one community? Each window"
                " will read as a partition; give each community its own --input"
            )

    def availability(self) -> None:
        """node_availability and node_outages."""
        t = self.tables
        self.evidence = self.keep(availability.node_evidence(self.lw, self.beacons, self.w))
        self.hourly = t.write(
            availability.node_availability(
                self.evidence,
                self.lw,
                self.node_ids,
                first_win=self.first_win,
                last_win=self.last_win,
                window_ms=self.w,
            ).select(t.node(sf.col("nid")).alias("node"), *_AVAIL_COLS),
            "node_availability",
        )
        self.overall = summary.overall_availability(self.hourly)
        self.collected["outages"] = t.write(
            availability.outages(
                self.evidence, self.node_ids, self.first_win, self.last_win, self.w
            ).select(t.node(sf.col("nid")).alias("node"), "start_ms", "end_ms", "windows"),
            "node_outages",
            "start_ms",
            "node",
        )
        self.say("node_availability, node_outages written")

    def histograms(self) -> None:
        """The RTT and clock-offset histograms on the driver."""
        self.hist, self.offsets = aggregate.collect_histograms(self.obs.hists)

    def links(self) -> None:
        """link_health, flapping links and the RTT distribution for the report."""
        t = self.tables
        flaps = self.keep(links.flap_events(self.obs.events))
        t.write(
            links.link_health(self.sums, links.link_hours(self.spark, self.hist), flaps).select(
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
        ids = self.ids
        self.collected["rtt"] = [
            {"a": ids.get(a), "b": ids.get(b), "q": q, "pongs": pongs}
            for a, b, q, pongs in links.link_rtt_distribution(self.hist)
        ]
        self.say("link_health written")

    def partitions(self) -> None:
        """Connected components per window, partitions, partition_components, partition_events."""
        t, w = self.tables, self.w
        # the analysed windows: a range, so a filter rather than a join
        in_span = sf.col("win").between(self.first_win, self.last_win)
        working = partitions.working_links(self.lw).where(in_span).select("a", "b", "win")
        vertices = partitions.window_vertices(self.evidence).where(in_span).select("nid", "win")
        windows, graphs = partitions.window_components(vertices, working)
        per_window, members, events = partitions.partition_frames(self.spark, windows, w)
        self.collected["per_window"] = [
            {"win": r["window_start_ms"], "components": r["components"], "nodes_up": r["nodes_up"]}
            for r in t.write(per_window, "partitions", "window_start_ms")
        ]
        self.collected["components"] = t.write(
            members.select("window_start_ms", "size", t.nodes(sf.col("members")).alias("nodes")),
            "partition_components",
        )
        self.collected["events"] = t.write(events, "partition_events", "start_ms")
        self.say(f"partitions written ({graphs} distinct graphs)")

    def nodes(self) -> None:
        """relay_dependence, clock_skew and (with traces) propagation."""
        t = self.tables
        self.collected["relays"] = t.write(
            relays.relay_dependence(self.sums, self.node_ids).select(
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
        # in node id order, as the report lists nodes of equal share (the table's own
        # row order is the plan's)
        rank = {self.ids.get(n): i for i, n in enumerate(self.node_list)}
        self.collected["relays"].sort(key=lambda r: rank.get(r["node"], len(rank)))
        skew_ids = clock.clock_skew(self.spark, self.offsets, self.cfg.thresholds.skew_threshold_ms)
        self.collected["skew"] = t.write(
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
        self.collected["propagation"] = []
        self.collected["catch_up"] = []
        if self.traces is not None:
            self._propagation(skew_ids)
        self.say("relay_dependence, clock_skew, propagation written")

    def _propagation(self, skew_ids: DataFrame) -> None:
        """propagation (live receives) and catch_up (backlog), measured apart."""
        assert self.traces is not None
        t = self.tables
        timed = self.keep(
            propagation.delays(self.traces, skew_ids, self.hb if self.unmarked else None)
        )
        self.collected["propagation"] = t.write(
            propagation.propagation(timed), "propagation", "hops"
        )
        late = self.keep(propagation.catch_up(timed))
        self.collected["catch_up"] = t.write(
            late.where(sf.col("nid").isNotNull()).select(
                t.node(sf.col("nid")).alias("node"), "messages", "p50_ms", "p99_ms", "max_ms"
            ),
            "catch_up",
            "node",
        )
        self.collected["catch_up_all"] = _rows(late.where(sf.col("nid").isNull()))
        self.collected["trace_split"] = _rows(propagation.split_counts(timed))

    def _hours(self) -> list[dict[str, Any]]:
        return [{k: r[k] for k in ("node", "hour_ms", "availability")} for r in self.hourly]

    def _relay_rows(self) -> list[dict[str, Any]]:
        return [r for r in self.collected["relays"] if r["relayed_links"] > 0]

    def draw(self, name: str) -> None:
        """Hand chart ``name`` to the report's thread, its rows being in (no report: nothing)."""
        if self.charts is None:
            return
        c, names = self.collected, self.node_names
        if name == "availability":
            data = ReportData(
                {"names": names, "availability": summary.availability(self.overall)},
                availability=self._hours(),
            )
        elif name == "partitions":
            part = {
                "names": names,
                "availability": summary.availability(self.overall),
                "window_s": self.w // 1000,
                "span": {"start_ms": self.first_win, "end_ms": self.last_win + self.w},
                "partitions": summary.partitions(c["events"]),
                "outages": summary.outages(c["outages"]),
            }
            data = ReportData(part, components=c["components"], per_window=c["per_window"])
        elif name == "rtt":
            data = ReportData({"names": names}, rtt=c["rtt"])
        else:
            data = ReportData({"names": names}, relay_rows=self._relay_rows())
        self.charts.draw(name, data)

    def finish(self) -> dict[str, Any]:
        """summary.json and the report."""
        doc = summary.summary(
            self.cfg,
            counts=self.counts,
            side_counts=self.side_counts,
            files=self.files,
            sizes=(self.n_nodes, self.n_links),
            span=(self.first_win, self.last_win + self.w),
            overall=self.overall,
            collected=self.collected,
            names=self.node_names,
            # (a table missing from _TABLES fails here rather than going unlisted)
            tables=sorted(self.tables.written, key=_TABLES.index),
        )
        (self.out / "summary.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
        self.say(f"summary.json written to {self.out}")
        if self.charts is not None:
            c = self.collected
            self.charts.page(
                ReportData(
                    summary=doc,
                    availability=self._hours(),
                    rtt=c["rtt"],
                    components=c["components"],
                    per_window=c["per_window"],
                    relay_rows=self._relay_rows(),
                )
            )
            self.say(f"report.html written to {self.out}")
        cpu = _jvm_cpu_seconds(self.spark)
        if cpu is not None:
            # in local mode the driver JVM is all of Spark; on a cluster it is the driver only;
            # the number of Spark jobs measures the fixed cost, whatever the machine's load
            jobs = self._jobs_run() - self.jobs_before
            self.say(f"JVM CPU time {cpu:.1f}s, {jobs} Spark jobs")
        return doc


def _jvm_cpu_seconds(spark: SparkSession) -> float | None:
    """CPU time the driver JVM has used so far, if the JVM reports it.

    With the machine shared, this is the measure of the job's own work that other
    processes do not inflate (the benchmark reports it beside wall time).
    """
    jvm: Any = spark.sparkContext._jvm
    total = jvm.java.lang.ProcessHandle.current().info().totalCpuDuration()
    return float(total.get().toMillis()) / 1000 if total.isPresent() else None


# the tables in the order summary.json lists them (the steps write them concurrently)
_TABLES = (
    "node_availability",
    "node_outages",
    "link_health",
    "partitions",
    "partition_components",
    "partition_events",
    "relay_dependence",
    "clock_skew",
    "propagation",
    "catch_up",
)
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


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


if __name__ == "__main__":
    sys.exit(cli.main())
