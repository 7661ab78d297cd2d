"""Invariants of the synthetic generator (pure; no Spark)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_federation.synth import SynthConfig, generate, main


def _records(root: Path) -> list[dict[str, object]]:
    rows = []
    for path in sorted(root.rglob("heartbeats/*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines()]
    return rows


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(seed=st.integers(0, 10_000), nodes=st.integers(3, 12))
def test_generator_invariants(tmp_path_factory: object, seed: int, nodes: int) -> None:
    """Counts match the files, events lie in the span, and only real breaks close links."""
    out = tmp_path_factory.mktemp("synth")  # type: ignore[attr-defined]
    result = generate(
        SynthConfig(nodes=nodes, hours=1.0, seed=seed, traces=False, beacons="none"), out
    )
    rows = _records(out)
    assert result.records == len(rows)
    for e in result.events:
        if e.start_ms is not None:
            assert result.start_ms <= e.start_ms < (e.end_ms or 0) <= result.end_ms + 120_000
    # spec §7.5: a link closes after three misses in a row, never after fewer
    streak: dict[tuple[object, object], int] = defaultdict(int)
    for r in sorted(rows, key=lambda r: (r["node"], r["peer"], r["ts"])):
        key = (r["node"], r["peer"])
        if r["kind"] == "miss":
            streak[key] += 1
        elif r["kind"] == "link_down":
            assert streak[key] >= 3 or _peer_closed(rows, r), r
            streak[key] = 0
        else:
            streak[key] = 0


def _peer_closed(rows: list[dict[str, object]], r: dict[str, object]) -> bool:
    """The other end closed the link within 50 ms (it saw the three misses)."""
    return any(
        o["kind"] == "link_down"
        and o["node"] == r["peer"]
        and o["peer"] == r["node"]
        and abs(int(o["ts"]) - int(r["ts"])) < 5_000  # type: ignore[call-overload]
        for o in rows
    )


def test_same_seed_same_exports(tmp_path: Path) -> None:
    """Two runs with one seed write byte-identical exports."""
    cfg = SynthConfig(nodes=4, hours=0.5, seed=5)
    generate(cfg, tmp_path / "a")
    generate(cfg, tmp_path / "b")
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.jsonl"))
    assert files == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*.jsonl"))
    assert [True] * len(files) == [
        (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files
    ]


def test_cli_writes_expected_json(tmp_path: Path) -> None:
    """The module's CLI writes exports and the known answers as JSON."""
    code = main(
        [
            "--nodes",
            "4",
            "--hours",
            "0.5",
            "--out",
            str(tmp_path / "x"),
            "--partition-at",
            "10m+5m",
            "--expected",
            str(tmp_path / "e.json"),
        ]
    )
    answers = json.loads((tmp_path / "e.json").read_text())
    kinds = sorted(e["kind"] for e in answers["events"])
    assert (code, kinds) == (
        0,
        ["clock_skew", "flapping_link", "node_down", "partition", "relay_only"],
    )
    partition = next(e for e in answers["events"] if e["kind"] == "partition")
    assert answers["start_ms"] + 600_000 == partition["start_ms"]
