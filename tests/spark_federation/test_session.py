"""The local session's processes and its class-data archive: defaults, fallbacks, tidying."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spark_federation import session

ROOT = Path(__file__).resolve().parents[2]
SMALL_INPUT = ROOT / "tests" / "fixtures" / "heartbeats_6node"


def test_python_workers_run_this_interpreter(spark: Any) -> None:
    """A local session's Python workers are the driver's interpreter, not whatever
    ``python3`` is first on the PATH."""
    ran = spark.sparkContext.parallelize([0], 1).map(lambda _: sys.executable).collect()
    assert [os.path.realpath(os.environ["PYSPARK_PYTHON"])] == [os.path.realpath(p) for p in ran]


def test_process_defaults_leave_the_callers_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """PYSPARK_PYTHON and SPARK_LAUNCHER_OPTS are set only where the caller set none."""
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.setenv("SPARK_LAUNCHER_OPTS", "-Xmx64m")
    session.local_processes()
    assert (os.environ["PYSPARK_PYTHON"], os.environ["SPARK_LAUNCHER_OPTS"]) == (
        sys.executable,
        "-Xmx64m",
    )


def test_no_archive_where_the_cache_cannot_be(tmp_path: Path) -> None:
    """A cache directory that cannot be made (a file is in its way) means no archive
    options, not a failed run."""
    (tmp_path / "file").write_text("")
    assert [] == session.class_archive_options(tmp_path / "file" / "hearthnet")


def test_stale_archives_are_removed(tmp_path: Path) -> None:
    """Archives of other builds and half-written ones of runs that are gone go; the
    current archive and one still being written by a live run stay."""
    current = session.class_archive(tmp_path)
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    names = [
        current.name,
        "spark-classes-0123456789abcdef.jsa",
        f"{current.name}.{int(gone.stdout)}",
        f"{current.name}.{os.getpid()}",
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    session._remove_stale_archives(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([names[0], names[3]])


def test_a_damaged_archive_is_dropped_and_the_run_goes_on(tmp_path: Path) -> None:
    """A truncated class-data archive crashes Java 17 as it maps it: the session starts
    again without it, removes it, and runs."""
    made = tmp_path / "small.jsa"
    subprocess.run(
        ["java", f"-XX:ArchiveClassesAtExit={made}", "-version"],
        capture_output=True,
        check=True,
        timeout=120,
    )
    cache = tmp_path / "cache"
    archive = session.class_archive(cache)
    cache.mkdir()
    archive.write_bytes(made.read_bytes()[:20_000])
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from spark_federation import session\n"
        f"cache, log = Path({str(cache)!r}), Path({str(tmp_path / 'out' / 'spark.log')!r})\n"
        "spark = session.build_session('local[1]', driver_memory='512m', log_file=log,\n"
        f"    input_uri={str(SMALL_INPUT)!r}, class_cache=cache)\n"
        "print(spark.range(5).count())\n"
        "session.stop(spark, cache)\n"
    )
    # this checkout's package first, whatever is installed
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": path}
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    assert (done.returncode, done.stdout.strip(), archive.exists()) == (0, "5", False), done.stderr
    # the crash report went beside the log, not into the working directory
    assert list(tmp_path.glob("hs_err_pid*.log")) == []
    assert list((tmp_path / "out").glob("hs_err_pid*.log")) != []
