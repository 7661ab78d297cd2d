"""The job on a standalone cluster (master, worker and executor on 127.0.0.1) gives local
mode's answers."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pyspark
import pytest

from spark_federation.session import QUICK_JIT, SMALL_INPUT_JVM, TINY_INPUT_CONF
from tests.spark_federation.conftest import SHUFFLE_PARTITIONS, JobRun

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
# A standalone master and one worker (2 cores, 1 GiB) inside spark-submit's driver JVM,
# the executor a JVM of its own: the job's tasks run in another process than its driver,
# as on a real cluster, without starting the master and worker daemons.
CLUSTER = "local-cluster[1,2,1024]"


@pytest.fixture(scope="module")
def cluster_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment spark-submit and the executor it starts run in (loopback only).

    SPARK_HOME is a directory of links to pyspark's: the in-process worker keeps its
    executors' work directories under SPARK_HOME/work, which must not be the installed
    package.
    """
    installed = Path(pyspark.__file__).parent
    home = tmp_path_factory.mktemp("spark-home")
    for entry in installed.iterdir():
        if entry.name != "work":
            (home / entry.name).symlink_to(entry)
    return dict(
        os.environ,
        SPARK_HOME=str(home),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOG_DIR=str(tmp_path_factory.mktemp("spark-logs")),
    )


def test_spark_submit_matches_local_mode(
    cluster_env: dict[str, str], synth_run: JobRun, tmp_path: Path
) -> None:
    """spark-submit of mesh_health.py to a standalone master, tasks in an executor JVM,
    writes the same summary as local mode."""
    submit = Path(cluster_env["SPARK_HOME"]) / "bin" / "spark-submit"
    out = tmp_path / "cluster"
    done = subprocess.run(
        [
            str(submit),
            "--master",
            CLUSTER,
            "--driver-memory",
            "1g",
            "--executor-memory",
            "1g",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            f"spark.sql.shuffle.partitions={SHUFFLE_PARTITIONS}",
            # the quick JIT, classes loaded unverified and the settings local mode uses for
            # tiny inputs (no adaptive re-planning, no generated code): the answers do
            # not depend on them
            "--conf",
            f"spark.driver.extraJavaOptions={QUICK_JIT} {SMALL_INPUT_JVM}",
            "--conf",
            f"spark.executor.extraJavaOptions={QUICK_JIT} {SMALL_INPUT_JVM}",
            *(
                arg
                for key, value in TINY_INPUT_CONF.items()
                for arg in ("--conf", f"{key}={value}")
            ),
            str(REPO / "spark_federation" / "mesh_health.py"),
            "--input",
            str(synth_run.input_dir),
            "--out",
            str(out),
            "--no-report",
        ],
        env=cluster_env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # spark-submit passes the Python driver's stderr (our progress lines) to its stdout
    assert "partitions written" in done.stdout
    cluster = json.loads((out / "summary.json").read_text())
    # a deep copy: the summary is the session's shared fixture, which other tests read
    local = copy.deepcopy(synth_run.summary)
    # percentile sketches merge in partition order, which differs between the two
    # runs: medians agree to a millisecond, everything else exactly
    for key in ("clock_skew_ms",):
        assert local.pop(key).keys() == cluster[key].keys()
        assert all(abs(v - cluster[key][n]) < 1.0 for n, v in synth_run.summary[key].items())
        cluster.pop(key)
    for row_l, row_c in zip(local.pop("propagation"), cluster.pop("propagation"), strict=True):
        assert (row_l["hops"], row_l["messages"]) == (row_c["hops"], row_c["messages"])
        assert abs(row_l["p50_ms"] - row_c["p50_ms"]) < 1.0
    late_l, late_c = local.pop("catch_up"), cluster.pop("catch_up")
    for key in ("p50_ms", "p99_ms"):
        assert abs(late_l.pop(key) - late_c.pop(key)) < 1.0
    assert late_l == late_c
    assert local == cluster
