"""The job finds every injected event, with the right nodes and times, and nothing else."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from spark_federation.mesh_health import run
from spark_federation.params import JobConfig
from spark_federation.session import _diagnostic_command, quick_jit, scoped_conf
from spark_federation.synth import SynthConfig, generate
from tests.spark_federation.conftest import SYNTH, WINDOW_MS, JobRun
from tests.spark_federation.verdicts import expected_flaps, match_outage, within_window

pytestmark = pytest.mark.spark


def test_counts_match_generator(synth_run: JobRun) -> None:
    """Unique records, malformed (skipped) and duplicate counts equal what was written."""
    s, g = synth_run.summary, synth_run.synth
    expected = {
        "records": g.records,
        "skipped": g.malformed,
        "duplicates": g.duplicates,
        "nodes": len(g.nodes),
        "links": len(g.links),
        "window_s": 60,
    }
    assert expected == {k: s[k] for k in expected}
    assert (SYNTH.malformed, SYNTH.duplicates) == (g.malformed, g.duplicates)


def test_outages_are_the_injected_node_downs(synth_run: JobRun) -> None:
    """Each stopped node has one outage at the right times (±1 window), and no node has another."""
    downs = synth_run.synth.of_kind("node_down")
    outages = synth_run.summary["outages"]
    assert len(downs) == len(outages)
    assert [True] * len(downs) == [match_outage(e, outages, WINDOW_MS) for e in downs]


def test_availability_reflects_outages(synth_run: JobRun) -> None:
    """Nodes never stopped are up in every window; a stopped node is down for its outage."""
    s, g = synth_run.summary, synth_run.synth
    span = s["span"]["end_ms"] - s["span"]["start_ms"]
    down = {e.nodes[0]: (e.end_ms or 0) - (e.start_ms or 0) for e in g.of_kind("node_down")}
    for node in g.nodes:
        expected = 1.0 - down.get(node, 0) / span
        assert abs(expected - s["availability"][node]) <= 2 * WINDOW_MS / span, node


def test_partition_found_with_groups_and_times(synth_run: JobRun, spark: object) -> None:
    """The injected partition is the only one: 2 components of the injected sizes and members."""
    s, g = synth_run.summary, synth_run.synth
    injected = g.of_kind("partition")
    assert len(injected) == 1 == len(s["partitions"])
    found, truth = s["partitions"][0], injected[0]
    assert truth.start_ms is not None
    assert truth.end_ms is not None
    assert (2, sorted((len(x) for x in truth.groups), reverse=True)) == (
        found["components"],
        found["sizes"],
    )
    assert within_window(found["start_ms"], truth.start_ms, WINDOW_MS)
    assert within_window(found["end_ms"], truth.end_ms, WINDOW_MS)
    comps = pq.read_table(synth_run.out_dir / "tables" / "partition_components").to_pylist()
    groups = {frozenset(c["nodes"]) for c in comps}
    assert {frozenset(x) for x in truth.groups} == groups


def test_flapping_links_are_the_injected_ones(synth_run: JobRun) -> None:
    """Only the injected flapping link is reported, with every down→up cycle counted."""
    g = synth_run.synth
    expected = [
        {"node": min(e.nodes), "peer": max(e.nodes), "flaps": expected_flaps(g, *e.nodes)}
        for e in g.of_kind("flapping_link")
    ]
    assert expected == synth_run.summary["flapping_links"]


def test_relay_only_nodes(synth_run: JobRun) -> None:
    """The NAT nodes are the relay-only ones, and the relay they used is the only relay."""
    g = synth_run.synth
    assert (
        sorted(e.nodes[0] for e in g.of_kind("relay_only")) == synth_run.summary["relay_only_nodes"]
    )
    assert [g.nodes[0]] == synth_run.summary["relays"]


def test_clock_skew(synth_run: JobRun) -> None:
    """The skewed node is the only one reported, with its offset estimated within 50 ms."""
    s, g = synth_run.summary, synth_run.synth
    skewed = g.of_kind("clock_skew")
    assert sorted(e.nodes[0] for e in skewed) == s["skewed_nodes"]
    for e in skewed:
        assert abs((e.value or 0.0) - s["clock_skew_ms"][e.nodes[0]]) < 50.0
    others = [n for n in g.nodes if n not in s["skewed_nodes"]]
    assert [True] * len(others) == [abs(s["clock_skew_ms"][n]) < 20.0 for n in others]


def written_traces(synth_run: JobRun) -> list[dict[str, Any]]:
    """Every trace record the generator wrote."""
    return [
        json.loads(line)
        for path in synth_run.input_dir.rglob("traces/*.jsonl")
        for line in path.read_text().splitlines()
    ]


def test_propagation_counts_live_receives_per_hop(synth_run: JobRun) -> None:
    """Propagation counts the live receives per hop count, takes milliseconds on the
    generator's links, and grows with hops: catch-up copies are not in it."""
    written = Counter(t["hops"] for t in written_traces(synth_run) if not t["catch_up"])
    rows = synth_run.summary["propagation"]
    assert dict(written) == {r["hops"]: r["messages"] for r in rows}
    medians = [r["p50_ms"] for r in rows]
    assert medians == sorted(medians)
    assert [True] * len(rows) == [r["p99_ms"] < 1_000 for r in rows]


def test_catch_up_is_measured_apart(synth_run: JobRun) -> None:
    """The node that was down gets every message published meanwhile as catch-up: the
    count, the receiving node and the median delay (clock-corrected) are the generator's."""
    late = [t for t in written_traces(synth_run) if t["catch_up"]]
    got = synth_run.summary["catch_up"]
    raw = sorted(t["ts"] - t["published_ms"] for t in late)
    [down] = synth_run.synth.of_kind("node_down")
    assert (synth_run.synth.catch_up_traces, {down.nodes[0]: len(late)}, 0) == (
        got["messages"],
        got["nodes"],
        got["inferred"],
    )
    # the median is the nearest-rank one; skew correction moves a delay by at most the
    # injected skew (< 4 s), less than the 15 s between two publishes
    assert abs(raw[(len(raw) - 1) // 2] - got["p50_ms"]) < 5_000
    assert got["p50_ms"] > 60_000


def test_tables_readable_without_spark(synth_run: JobRun) -> None:
    """Every table listed in summary.json is Parquet that pyarrow reads, with NodeIDs as strings."""
    tables = Path(synth_run.out_dir, "tables")
    names = synth_run.summary["tables"]
    expected = {
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
    }
    assert expected == set(names)
    links = pq.read_table(tables / "link_health").to_pylist()
    nodes = set(synth_run.synth.nodes)
    assert {r["node"] for r in links} | {r["peer"] for r in links} == nodes
    written = json.loads((synth_run.out_dir / "summary.json").read_text())
    assert synth_run.summary == written


def test_no_partition_from_normal_jitter_or_outage(synth_run: JobRun) -> None:
    """Windows of the node outage and of the flapping link are single-component windows."""
    per_window = pq.read_table(synth_run.out_dir / "tables" / "partitions").to_pylist()
    split = sorted(r["window_start_ms"] for r in per_window if r["components"] > 1)
    p = synth_run.summary["partitions"][0]
    assert split == list(range(p["start_ms"], p["end_ms"], WINDOW_MS))


def test_scoped_settings_are_put_back(spark: Any) -> None:
    """The settings of the steps after the pass hold inside the block only: a setting
    the session had comes back, one it did not have is unset again, even on an error."""
    had, new = "spark.sql.shuffle.partitions", "spark.hearthnet.test.scoped"
    before = spark.conf.get(had)
    inside: list[tuple[str, str]] = []

    def steps() -> None:
        with scoped_conf(spark, {had: "7", new: "x"}):
            inside.append((spark.conf.get(had), spark.conf.get(new)))
            raise RuntimeError("step failed")

    with pytest.raises(RuntimeError, match="step failed"):
        steps()
    assert inside == [("7", "x")]
    assert (spark.conf.get(had), spark.conf.get(new, None)) == (before, None)


def test_quick_jit_directive_holds_inside_the_block_only(spark: Any) -> None:
    """The steps after the pass run with C2 excluded (a directive the driver JVM lists),
    and the JVM's directives are as before once the block ends, even on an error."""
    before = _diagnostic_command(spark, "compilerDirectivesPrint")
    inside: list[str] = []

    def steps() -> None:
        with quick_jit(spark):
            inside.append(_diagnostic_command(spark, "compilerDirectivesPrint"))
            raise RuntimeError("step failed")

    with pytest.raises(RuntimeError, match="step failed"):
        steps()
    c2 = inside[0].split("Directive:")[1].split("c2 directives:")[1]
    assert "Exclude:true" in c2.split("\n\n")[0]
    assert "Exclude:true" not in before
    assert _diagnostic_command(spark, "compilerDirectivesPrint") == before


@pytest.mark.spark
def test_two_communities_in_one_input_are_warned_about(spark: Any, tmp_path: Path) -> None:
    """Exports of two communities (nobody in one ever pings anybody in the other) read as
    a partition in every window; the job says so in a progress line that names the
    groups' sizes."""
    for name, nodes, seed in (("x", 3, 1), ("y", 2, 2)):
        one = SynthConfig(
            nodes=nodes, hours=0.1, seed=seed, traces=False,
            down=0, flapping=0, relay_only=0, skewed=0, partitions=(),
        )  # fmt: skip
        generate(one, tmp_path / "in" / name)
    said: list[str] = []
    got = run(
        spark, JobConfig(str(tmp_path / "in"), str(tmp_path / "out"), report=False), said.append
    )
    warned = [line for line in said if "warning:" in line]
    assert (1, "2 groups of nodes (3, 2)", 5) == (
        len(warned),
        warned[0].split("warning: ")[1][:24] if warned else None,
        got["nodes"],
    ), said
