"""The mesh-health job on what real nodes write: a recorded 6-node export through the
``hearthnet mesh health`` command, and the node's own Parquet export read back clean.

``tests/fixtures/heartbeats_6node`` was recorded by ``python -m
scripts.record_heartbeat_fixture`` in a NAT lab: five node processes on public addresses
(node 0 also a relay), node 4 killed with SIGKILL and restarted later, and node 5 behind
NAT reaching nodes 1-4 only through the relay; ``events.json`` holds the times and roles.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hearthnet.clock import now_ms
from hearthnet.mesh.heartlog import export
from spark_federation import exports
from spark_federation.report import label
from tests.helpers import hearthnet_cmd
from tests.mesh.test_heartlog import KEYS, write_beacon, write_records
from tests.spark_federation.conftest import SHUFFLE_PARTITIONS
from tests.spark_federation.verdicts import within_window

pytestmark = pytest.mark.spark

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "heartbeats_6node"
WINDOW_MS = 60_000


@pytest.fixture(scope="module")
def real_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``hearthnet mesh health`` on the recorded export, as an admin runs it; its output."""
    pytest.importorskip("pyspark")
    out = tmp_path_factory.mktemp("real-mesh")
    done = subprocess.run(
        hearthnet_cmd(
            "mesh", "health", "--input", str(FIXTURE), "--out", str(out),
            "--master", "local[2]", "--driver-memory", "1g",
            "--shuffle-partitions", str(SHUFFLE_PARTITIONS), "--json",
        ),
        capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )  # fmt: skip
    assert 0 == done.returncode, done.stderr[-2000:]
    (out / "cli-stderr.txt").write_text(done.stderr)
    (out / "cli-stdout.txt").write_text(done.stdout)
    return out


def test_spark_logs_to_a_file_and_the_terminal_gets_progress(real_report: Path) -> None:
    """stderr holds only the job's progress lines; what Spark's JVM prints is in spark.log."""
    lines = (real_report / "cli-stderr.txt").read_text().splitlines()
    assert ([], True, True) == (
        [line for line in lines if not line.startswith("mesh health ")],
        any(line.startswith("mesh health done:") for line in lines),
        (real_report / "spark.log").stat().st_size > 0,
    )


def test_json_prints_where_the_report_is_and_the_summary(real_report: Path) -> None:
    """--json: one object on stdout, the report's place and summary.json unchanged."""
    printed = (real_report / "cli-stdout.txt").read_text()
    doc = json.loads(printed)
    assert (1, str(real_report.resolve()), True, doc["summary"]) == (
        len(printed.splitlines()),
        doc["out"],
        Path(doc["report"]).is_file(),
        json.loads((real_report / "summary.json").read_text()),
    )


@pytest.fixture(scope="module")
def real_summary(real_report: Path) -> dict[str, Any]:
    """The job's summary.json for the recorded export."""
    summary: dict[str, Any] = json.loads((real_report / "summary.json").read_text())
    return summary


def test_the_report_names_the_outage_and_shows_its_charts(real_report: Path) -> None:
    """report.html lists the killed node under outages by its beacon name and short id,
    and every chart it shows is a PNG written next to it."""
    page = (real_report / "report.html").read_text(encoding="utf-8")
    events = json.loads((FIXTURE / "events.json").read_text())
    victim = events["nodes"][events["victim"]]
    summary = json.loads((real_report / "summary.json").read_text())
    assert label(victim, summary["names"]) in page.split("<h2>Outages</h2>", 1)[1]
    charts = re.findall(r'<img src="([^"]+)"', page)
    # node 5 reached the others only through the relay: its chart is shown too
    assert {"availability.png", "rtt.png", "partitions.png", "relays.png"} <= set(charts)
    assert all((real_report / c).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for c in charts)


def test_every_record_of_real_nodes_is_read(real_summary: dict[str, Any]) -> None:
    """Heartbeats, beacons and traces the node wrote all fit the job's schemas."""
    inputs = real_summary["inputs"]
    assert (6, 0, 0, 0) == (
        real_summary["nodes"],
        real_summary["skipped"],
        inputs["beacons"]["skipped"],
        inputs["traces"]["skipped"],
    )
    assert real_summary["records"] > 500
    assert inputs["beacons"]["records"] > 0
    assert inputs["traces"]["records"] > 0


def test_the_killed_node_is_the_one_outage(real_summary: dict[str, Any]) -> None:
    """Node 4's SIGKILL shows as its only outage, within a window of the real times; the
    other four were up throughout; no partition, flapping or skew on one machine."""
    events = json.loads((FIXTURE / "events.json").read_text())
    victim = events["nodes"][events["victim"]]
    [outage] = real_summary["outages"]
    assert victim == outage["node"]
    assert within_window(outage["start_ms"], events["killed_ms"], WINDOW_MS)
    assert within_window(outage["end_ms"], events["restarted_ms"], WINDOW_MS)
    others = {n: a for n, a in real_summary["availability"].items() if n != victim}
    assert {n: 1.0 for n in events["nodes"] if n != victim} == others
    assert real_summary["availability"][victim] < 1.0
    assert ([], [], []) == (
        real_summary["partitions"],
        real_summary["flapping_links"],
        real_summary["skewed_nodes"],
    )


def test_the_node_behind_nat_depends_on_the_relay(
    real_summary: dict[str, Any], real_report: Path
) -> None:
    """Node 5's heartbeats went via node 0 to every node but node 0: it is the one
    relay-only node, node 0 the one relay, and nodes 1-4 each have one relayed link."""
    pq = pytest.importorskip("pyarrow.parquet")
    events = json.loads((FIXTURE / "events.json").read_text())
    nodes = events["nodes"]
    relay, relayed = nodes[events["relay"]], nodes[events["relayed"]]
    table = pq.read_table(real_report / "tables" / "relay_dependence")
    rows = {r["node"]: r for r in table.to_pylist()}
    others = [n for n in nodes if n not in (relay, relayed)]
    assert ([relay], [relayed], (5, 4, [relay]), {n: 1 for n in others}) == (
        real_summary["relays"],
        real_summary["relay_only_nodes"],
        (rows[relayed]["links"], rows[relayed]["relayed_links"], rows[relayed]["relays"]),
        {n: rows[n]["relayed_links"] for n in others},
    )


def test_propagation_from_real_traces(real_summary: dict[str, Any]) -> None:
    """Live copies arrive within a second on loopback; what the killed node got after its
    restart is catch-up, measured apart."""
    events = json.loads((FIXTURE / "events.json").read_text())
    victim = events["nodes"][events["victim"]]
    by_hops = {p["hops"]: p for p in real_summary["propagation"]}
    late = real_summary["catch_up"]
    assert (True, True, True, True) == (
        by_hops[1]["messages"] > 0 and by_hops[1]["p50_ms"] < 100,
        all(p["p99_ms"] < 1_000 for p in real_summary["propagation"]),
        late["nodes"].get(victim, 0) > 0,
        late["p50_ms"] > 10_000,
    )


async def test_node_parquet_export_reads_without_skips(spark: Any, tmp_path: Path) -> None:
    """``hearthnet heartbeat export --format parquet`` output matches the job's schemas."""
    ts = now_ms() - 60_000
    write_records(tmp_path / "node", ts)
    await write_beacon(tmp_path / "node", uptime_s=41.9)
    export(
        tmp_path / "node", tmp_path / "in" / "n0", node=KEYS.node_id, since_ms=ts - 1, fmt="parquet"
    )
    # the job's read step, without the analysis after it
    files = exports.discover(spark, str(tmp_path / "in"))
    raws = {k: exports.read_raw(spark, files, k) for k in exports.KINDS}
    assert raws["heartbeats"] is not None
    assert raws["beacons"] is not None
    assert raws["traces"] is not None
    heartbeats = exports.record_counts(
        exports.dedup_heartbeats(exports.clean_heartbeats(raws["heartbeats"]))
    )
    beacons = exports.record_counts(exports.clean_beacons(raws["beacons"]))
    traces = exports.record_counts(exports.clean_traces(raws["traces"]))
    assert (5, 0, 1, 0, 1, 0) == (
        heartbeats["records"],
        heartbeats["skipped"],
        beacons["records"],
        beacons["skipped"],
        traces["records"],
        traces["skipped"],
    )
