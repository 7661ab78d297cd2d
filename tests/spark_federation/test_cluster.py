"""The job on a standalone cluster (master + worker on 127.0.0.1) gives local mode's answers."""

from __future__ import annotations

import copy
import json
import os
import queue
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from tests.spark_federation.conftest import JobRun

pytestmark = [pytest.mark.spark, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
START_DEADLINE_S = 90.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Daemon:
    """A Spark master or worker JVM started with pyspark's spark-class; stopped by PID."""

    def __init__(self, spark_home: Path, cls: str, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [str(spark_home / "bin" / "spark-class"), cls, *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)

    def wait_for(self, pattern: str, deadline_s: float) -> str:
        """Block until a log line matches (the daemon says it is ready), or fail at the deadline."""
        regex = re.compile(pattern)
        while True:
            try:
                line = self.lines.get(timeout=deadline_s)
            except queue.Empty:
                raise AssertionError(f"no log line matching {pattern!r} in {deadline_s}s") from None
            if regex.search(line):
                return line

    def stop(self) -> None:
        """Terminate this daemon by its PID, killing it if it does not exit in time."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        self.reader.join(timeout=20)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A standalone master and one worker (2 cores, 1 GiB) bound to 127.0.0.1 on free ports."""
    spark_home = Path(pyspark.__file__).parent
    env = dict(
        os.environ,
        SPARK_HOME=str(spark_home),
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        SPARK_LOG_DIR=str(tmp_path_factory.mktemp("spark-logs")),
    )
    port, ui = _free_port(), _free_port()
    url = f"spark://127.0.0.1:{port}"
    daemons: list[_Daemon] = []
    try:
        master = _Daemon(
            spark_home,
            "org.apache.spark.deploy.master.Master",
            ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)],
            env,
        )
        daemons.append(master)
        master.wait_for(r"I have been elected leader", START_DEADLINE_S)
        worker = _Daemon(
            spark_home,
            "org.apache.spark.deploy.worker.Worker",
            [
                "--host",
                "127.0.0.1",
                "--cores",
                "2",
                "--memory",
                "1g",
                "--webui-port",
                str(_free_port()),
                "--work-dir",
                str(tmp_path_factory.mktemp("spark-work")),
                url,
            ],
            env,
        )
        daemons.append(worker)
        worker.wait_for(r"Successfully registered with master", START_DEADLINE_S)
        yield url, env
    finally:
        for d in reversed(daemons):
            d.stop()


def test_spark_submit_matches_local_mode(
    standalone: tuple[str, dict[str, str]], synth_run: JobRun, tmp_path: Path
) -> None:
    """spark-submit --master spark://... of mesh_health.py writes the same summary as local mode."""
    url, env = standalone
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    out = tmp_path / "cluster"
    done = subprocess.run(
        [
            str(submit),
            "--master",
            url,
            "--driver-memory",
            "1g",
            "--executor-memory",
            "1g",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            "spark.sql.shuffle.partitions=4",
            str(REPO / "spark_federation" / "mesh_health.py"),
            "--input",
            str(synth_run.input_dir),
            "--out",
            str(out),
            "--no-report",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # spark-submit passes the Python driver's stderr (our progress lines) to its stdout
    assert "components round" in done.stdout
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
