"""The command line: usage errors, clear one-line errors, the install hint (no Spark started)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spark_federation.cli import INSTALL_HINT, build_parser, main, spark_error_line
from spark_federation.mesh_health import run
from spark_federation.params import JobConfig


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """Missing --out is a usage error: exit 2 and argparse's usage line."""
    assert main(["--input", "x"]) == 2
    assert "--out" in capsys.readouterr().err


def test_bad_window_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """A window that does not divide an hour is refused before Spark starts."""
    assert main(["--input", "x", "--out", "y", "--window", "7m"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (len(err), "does not divide an hour" in err[0]) == (1, True)


def test_missing_local_input_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A local input path that does not exist is one line on stderr and exit 1, no traceback."""
    assert main(["--input", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert (len(err), "does not exist" in err[0]) == (1, True)


def test_with_json_errors_are_one_object_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json (also before the command, as for every command): a bad window is
    {"error": "usage"} and exit 2, a missing input {"error": "error"} and exit 1; nothing
    on stdout."""
    from hearthnet.cli import main as hearthnet  # noqa: PLC0415 - the `hearthnet` entry

    missing = ["--input", str(tmp_path / "nope"), "--out", str(tmp_path / "o")]
    got = []
    for argv in (
        ["--input", "x", "--out", "y", "--window", "7m", "--json"],
        ["--json", *missing],
    ):
        code = main(argv)
        out, err = capsys.readouterr()
        got.append((code, out, json.loads(err)["error"]))
    code = hearthnet(["--json", "mesh", "health", *missing])
    out, err = capsys.readouterr()
    got.append((code, out, json.loads(err)["error"]))
    assert [(2, "", "usage"), (1, "", "error"), (1, "", "error")] == got


def test_without_pyspark_says_how_to_install(tmp_path: Path) -> None:
    """With pyspark unimportable the CLI exits 1 and prints the pip command for the extra."""
    code = (
        "import sys; sys.modules['pyspark'] = None\n"
        "from spark_federation.cli import main\n"
        f"sys.exit(main(['--input', {str(tmp_path)!r}, '--out', {str(tmp_path / 'o')!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, INSTALL_HINT in done.stderr) == (1, True)


def test_class_archive_written_once_then_mapped(tmp_path: Path) -> None:
    """Without an archive the JVM is told to write one under this process's name; once
    it has the archive's name, the JVM maps it; no options on a path with white space."""
    from spark_federation.session import (  # noqa: PLC0415 - pyspark only here
        class_archive,
        class_archive_options,
    )

    cache = tmp_path / "cache"
    [first] = class_archive_options(cache)
    assert first == f"-XX:ArchiveClassesAtExit={class_archive(cache)}.{os.getpid()}"
    assert cache.is_dir()
    class_archive(cache).write_bytes(b"archive")
    assert class_archive_options(cache) == [f"-XX:SharedArchiveFile={class_archive(cache)}"]
    assert class_archive_options(tmp_path / "with space") == []


def test_class_cache_default_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--class-cache defaults to $XDG_CACHE_HOME/hearthnet; '' turns the archive off."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    args = build_parser().parse_args(["--input", "i", "--out", "o"])
    assert args.class_cache == str(tmp_path / "hearthnet")
    off = build_parser().parse_args(["--input", "i", "--out", "o", "--class-cache", ""])
    assert off.class_cache == ""


@pytest.mark.parametrize(
    ("java_env", "says"),
    [
        ({"JAVA_HOME": "/nonexistent-java"}, "JAVA_HOME=/nonexistent-java has no bin/java"),
        ({"PATH": "/nonexistent-bin"}, "Java not found"),
    ],
)
def test_without_java_says_so_before_starting_spark(
    tmp_path: Path, java_env: dict[str, str], says: str
) -> None:
    """No Java: one line naming Java and exit 1, instead of PySpark's "Java gateway
    process exited before sending its port number"; no JVM is started."""
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"} | java_env
    done = subprocess.run(
        [sys.executable, "-m", "spark_federation.mesh_health", "--input", str(tmp_path),
         "--out", str(tmp_path / "o")],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip
    assert (1, [says], False) == (
        done.returncode,
        [says for line in done.stderr.splitlines() if says in line],
        (tmp_path / "o" / "spark.log").exists(),
    )


@pytest.mark.spark
def test_a_cut_off_gzip_export_is_named_in_the_error(spark: Any, tmp_path: Path) -> None:
    """A .jsonl.gz cut off in transfer fails the job (gzip cannot be read past the cut);
    the one line the CLI prints names the file and the cause, not py4j's "An error
    occurred while calling o123.collectToPython"."""
    a, b = "ed25519:" + "A" * 43, "ed25519:" + "B" * 43
    lines = [
        json.dumps({"ts": 1_763_800_000_000 + 5000 * i, "node": a, "peer": b, "community": a,
                    "kind": "pong", "seq": i, "rtt_ms": 1.5, "path": "direct"})
        for i in range(200)
    ]  # fmt: skip
    packed = gzip.compress("\n".join(lines).encode(), mtime=0)
    cut = tmp_path / "in" / "n0" / "heartbeats" / "2025-11-22.jsonl.gz"
    cut.parent.mkdir(parents=True)
    cut.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(Exception) as caught:  # whatever py4j raises
        run(spark, JobConfig(str(tmp_path / "in"), str(tmp_path / "o")), lambda _: None)
    line = spark_error_line(caught.value)
    assert (1, True, True) == (len(line.splitlines()), str(cut) in line, "EOF" in line), line
