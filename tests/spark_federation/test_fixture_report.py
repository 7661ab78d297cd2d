"""The report: every chart is a real PNG, the page lists the verdicts, and they match the
injected events.

By default these read the synthetic community's run (the ``synth_run`` fixture, whose
known answers are the generator's), so the suite runs the job once for both. Point
``HEARTHNET_MESH_FIXTURE`` at an export directory (``tests/fixtures/heartbeats_synth``,
or the real 5-node mesh fixture) to run the job on it and check it the same way; an
``expected.json`` beside its exports (the format
:func:`spark_federation.synth.events_to_json` writes) adds the comparison of verdicts.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spark_federation.mesh_health import run
from spark_federation.params import JobConfig
from spark_federation.synth import InjectedEvent, events_to_json
from tests.spark_federation.conftest import JobRun
from tests.spark_federation.verdicts import match_outage, within_window

pytestmark = pytest.mark.spark

FIXTURE = os.environ.get("HEARTHNET_MESH_FIXTURE")
CHARTS = ("availability.png", "rtt.png", "partitions.png", "relays.png")
WINDOW_MS = 60_000


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


@dataclass(frozen=True)
class Report:
    """A job's output directory and the known answers of its input."""

    out: Path
    expected: dict[str, Any] | None


@pytest.fixture(scope="module")
def fixture_report(
    synth_run: JobRun, spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> Report:
    """The synthetic run's report, or the job with the report on ``HEARTHNET_MESH_FIXTURE``."""
    if FIXTURE is None:
        return Report(synth_run.out_dir, events_to_json(synth_run.synth))
    out = tmp_path_factory.mktemp("fixture-report")
    run(spark, JobConfig(FIXTURE, str(out), window_ms=WINDOW_MS), print)
    expected = Path(FIXTURE, "expected.json")
    return Report(out, json.loads(expected.read_text()) if expected.exists() else None)


def test_report_has_every_chart(fixture_report: Report) -> None:
    """report.html references the four charts, each a PNG of legible, screen-sized dimensions."""
    page = (fixture_report.out / "report.html").read_text()
    assert [True] * len(CHARTS) == [f'src="{c}"' in page for c in CHARTS]
    sizes = [_png_size(fixture_report.out / c) for c in CHARTS]
    assert [True] * len(CHARTS) == [400 <= w <= 1600 and 150 <= h <= 2000 for w, h in sizes]


def test_report_shows_verdicts(fixture_report: Report) -> None:
    """The page lists each partition, outage, flapping link and relay-only node of summary.json."""
    summary = json.loads((fixture_report.out / "summary.json").read_text())
    page = (fixture_report.out / "report.html").read_text()
    expected = {
        "Partitions": len(summary["partitions"]),
        "Outages": len(summary["outages"]),
        "Flapping links": len(summary["flapping_links"]),
        "Relay-only nodes": len(summary["relay_only_nodes"]),
        "Clock skew": len(summary["clock_skew_ms"]),
        "Availability": len(summary["availability"]),
    }
    shown = {}
    for section in page.split("<h2>")[1:]:
        title, _, body = section.partition("</h2>")
        rows = body.count("<tr>")
        shown[title] = rows - 1 if rows else 0  # one header row when there is a table
    assert expected == {title: shown.get(title) for title in expected}
    assert all(n > 0 for n in expected.values())  # the fixture injects one of each


def test_fixture_verdicts_match_expected(fixture_report: Report) -> None:
    """Counts and every event of the input's known answers are found, and nothing else."""
    if fixture_report.expected is None:
        pytest.skip("fixture has no expected.json")
    s = json.loads((fixture_report.out / "summary.json").read_text())
    e = fixture_report.expected
    assert (e["records"], e["malformed"], e["duplicates"], len(e["nodes"])) == (
        s["records"],
        s["skipped"],
        s["duplicates"],
        s["nodes"],
    )
    events = {
        k: [x for x in e["events"] if x["kind"] == k]
        for k in ("node_down", "partition", "flapping_link", "relay_only", "clock_skew")
    }
    assert len(events["node_down"]) == len(s["outages"])

    assert all(
        match_outage(
            InjectedEvent("node_down", tuple(x["nodes"]), x["start_ms"], x["end_ms"]),
            s["outages"],
            WINDOW_MS,
        )
        for x in events["node_down"]
    )
    assert len(events["partition"]) == len(s["partitions"])
    for want, got in zip(events["partition"], s["partitions"], strict=True):
        assert within_window(got["start_ms"], want["start_ms"], WINDOW_MS)
        assert within_window(got["end_ms"], want["end_ms"], WINDOW_MS)
    assert sorted(tuple(sorted(x["nodes"])) for x in events["flapping_link"]) == sorted(
        (f["node"], f["peer"]) for f in s["flapping_links"]
    )
    assert sorted(x["nodes"][0] for x in events["relay_only"]) == s["relay_only_nodes"]
    assert sorted(x["nodes"][0] for x in events["clock_skew"]) == s["skewed_nodes"]
