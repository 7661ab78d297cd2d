"""Shared Spark fixtures: one local SparkSession, one job run on synthetic known-answer data."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spark_federation.mesh_health import run
from spark_federation.params import JobConfig
from spark_federation.session import build_session
from spark_federation.synth import SynthConfig, SynthResult, generate

WINDOW_MS = 60_000

# The synthetic community every verdict test reads: 5 nodes, 1 hour, one event of
# each kind, overlapping re-exports and every kind of malformed line twice.
SYNTH = SynthConfig(nodes=5, hours=1.0, seed=11, duplicates=40, malformed=16)
# Shuffle partitions of every test run (in process, on the cluster, from the command
# line): more than one, so steps meet rows of one group split across tasks.
SHUFFLE_PARTITIONS = 2
# The committed fixture: an input the size of every test's, to size the session by.
SMALL_INPUT = Path(__file__).resolve().parents[1] / "fixtures" / "heartbeats_synth"


# Only loopback exists here; without this Spark binds the first interface it finds.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

# PySpark reads results from the JVM over a local socket that it leaves to the garbage
# collector (pyspark/serializers.py); with filterwarnings=error that close becomes a
# failure in whatever test runs next. Ignore exactly that, for tests in this directory.
_PYSPARK_SOCKET_WARNINGS = (
    "ignore:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning",
    "ignore:unclosed <socket.socket:ResourceWarning",
)


# The first test to read a shared job run (synth_run, the command-line run, the cluster
# run) also starts its JVM and runs the job: seconds on a quiet machine, minutes on a
# busy one. The bound per test here is therefore wider than the suite's.
SPARK_TEST_TIMEOUT_S = 900


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Apply the PySpark socket filters and the wider time bound to the tests of this
    directory."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            for spec in _PYSPARK_SOCKET_WARNINGS:
                item.add_marker(pytest.mark.filterwarnings(spec))
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(SPARK_TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[2] SparkSession with few shuffle partitions and no UI, shared by all Spark tests;
    sized for a tiny input as the job sizes its own (quick JIT, no adaptive re-planning,
    no generated code)."""
    pytest.importorskip("pyspark")

    session = build_session(
        "local[2]",
        driver_memory="1g",
        shuffle_partitions=SHUFFLE_PARTITIONS,
        input_uri=str(SMALL_INPUT),
    )
    yield session
    session.stop()


@dataclass(frozen=True)
class JobRun:
    """The generated input, what the generator injected, and the job's outputs."""

    input_dir: Path
    out_dir: Path
    synth: SynthResult
    summary: dict[str, Any]


@pytest.fixture(scope="session")
def synth_run(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> JobRun:
    """Generate the synthetic community and run the whole job on it once."""
    base = tmp_path_factory.mktemp("mesh")
    result = generate(SYNTH, base / "input")
    out = base / "out"
    summary = run(spark, JobConfig(str(base / "input"), str(out), window_ms=WINDOW_MS), print)
    return JobRun(base / "input", out, result, summary)
