"""``hearthnet mesh health``: argument parsing, progress lines, exit codes.

Exit codes follow spec §9: 0 ok, 1 error (one line on stderr, no traceback for
bad input), 2 usage. Spark is imported only after the arguments parse, so
``--help`` and usage errors work without the ``analysis`` extra. ``--json``, as on every
other command (docs/cli.md): the result as one JSON object on stdout, errors as
``{"error", "message"}`` on stderr; progress lines stay on stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spark_federation.errors import MeshHealthError
from spark_federation.params import JobConfig, Thresholds, parse_duration_ms, parse_time_ms

# HearthNet installs from its checkout (README): the extra comes from there too, into the
# environment that runs this command
INSTALL_HINT = "-m pip install -e '.[analysis]' in the HearthNet checkout (and Java 17)"
_DEFAULTS = Thresholds()


def default_class_cache() -> Path:
    """$XDG_CACHE_HOME/hearthnet, else ~/.cache/hearthnet."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "hearthnet"


def build_parser(prog: str = "hearthnet mesh health") -> argparse.ArgumentParser:
    """The argument parser shared by the node's CLI, ``python -m`` and spark-submit."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Mesh-health analysis of exported heartbeat logs (PySpark).",
    )
    p.add_argument("--input", required=True, help="directory or Hadoop URI holding export dirs")
    p.add_argument("--out", required=True, help="local directory for summary.json and report.html")
    p.add_argument(
        "--master", help="Spark master URL (default local[*]; spark-submit sets its own)"
    )
    p.add_argument("--window", default="1m", help="analysis window (default 1m)")
    p.add_argument(
        "--since", help="ignore records before: 24h (back from now), Unix ms or ISO-8601"
    )
    p.add_argument("--until", help="ignore records from this time on (same forms as --since)")
    p.add_argument("--tables", help="where to write Parquet tables (default OUT/tables)")
    p.add_argument(
        "--flap-threshold",
        type=int,
        default=_DEFAULTS.flap_threshold,
        help="down→up cycles within an hour that make a link flapping (default 3)",
    )
    p.add_argument(
        "--skew-threshold-ms",
        type=float,
        default=_DEFAULTS.skew_threshold_ms,
        help="clock offset that makes a node skewed (default 500)",
    )
    p.add_argument("--shuffle-partitions", type=int, help="spark.sql.shuffle.partitions")
    p.add_argument("--driver-memory", default="2g", help="driver memory in local mode (default 2g)")
    p.add_argument("--no-report", action="store_true", help="skip report.html and charts")
    p.add_argument("--ui", action="store_true", help="enable the Spark UI (for profiling)")
    p.add_argument(
        "--class-cache",
        default=str(default_class_cache()),
        help="local mode: where the JVM keeps Spark's classes ready for the next run"
        " (default $XDG_CACHE_HOME/hearthnet or ~/.cache/hearthnet; '' for none)",
    )
    p.add_argument(
        "--quiet", action="store_true", help="no progress lines (Spark's own log: OUT/spark.log)"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print {out, report, summary} as JSON on stdout when done (summary: summary.json);"
        " errors as {error, message} on stderr",
    )
    return p


def _fail(args: argparse.Namespace, prog: str, code: str, message: str) -> None:
    """One line on stderr: ``PROG: error: MESSAGE``, or with --json ``{"error", "message"}``
    (``code``: ``usage`` or ``error``, as the other commands' codes of this machine)."""
    if args.json:
        print(json.dumps({"error": code, "message": message}), file=sys.stderr)
    else:
        print(f"{prog}: error: {message}", file=sys.stderr)


def result_document(args: argparse.Namespace, summary: dict[str, Any]) -> dict[str, Any]:
    """What --json prints when the job is done: where the report is, and summary.json's
    object unchanged (docs/cli.md)."""
    out = Path(args.out).resolve()
    return {
        "out": str(out),
        "report": None if args.no_report else str(out / "report.html"),
        "summary": summary,
    }


def config_from_args(args: argparse.Namespace) -> JobConfig:
    """Turn parsed arguments into a :class:`JobConfig` (raises MeshHealthError if invalid)."""
    now = int(time.time() * 1000)
    return JobConfig(
        input_uri=args.input,
        out_dir=args.out,
        tables_uri=args.tables,
        window_ms=parse_duration_ms(args.window),
        since_ms=parse_time_ms(args.since, now_ms=now) if args.since else None,
        until_ms=parse_time_ms(args.until, now_ms=now) if args.until else None,
        thresholds=Thresholds(
            flap_threshold=args.flap_threshold,
            skew_threshold_ms=args.skew_threshold_ms,
        ),
        report=not args.no_report,
    )


def java_problem(env: dict[str, str] | None = None) -> str | None:
    """Why a local Spark JVM cannot start, in the admin's terms, or None when it can.

    Spark's launcher runs ``$JAVA_HOME/bin/java`` when JAVA_HOME is set, else the first
    ``java`` on the PATH; without one PySpark fails with "Java gateway process exited
    before sending its port number", which names neither Java nor the fix.
    """
    env = dict(os.environ) if env is None else env
    home = env.get("JAVA_HOME")
    if home:
        if shutil.which("java", path=os.path.join(home, "bin")) is None:
            return f"JAVA_HOME={home} has no bin/java: set it to a Java 17 install, or unset it"
        return None
    if shutil.which("java", path=env.get("PATH", os.defpath)) is None:
        return "Java not found (no java on the PATH, JAVA_HOME not set): install Java 17"
    return None


# Spark's own error messages start with their error class: [FAILED_READ_FILE.NO_HINT] ...
_ERROR_CLASS = re.compile(r"\[[A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*\] [^\n]*")


def spark_error_line(exc: BaseException) -> str:
    """One line saying what went wrong in Spark: the first line of the error, unless that
    is py4j's "An error occurred while calling o689.collectToPython." (every error the
    JVM raised in an action), then Spark's first error-class message in it (it names the
    file of a read error) and its root cause."""
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines[0].startswith("An error occurred while calling"):
        return lines[0]
    found = _ERROR_CLASS.search(text)
    head = found.group(0).strip() if found else (lines[1:] or lines)[0].lstrip(": ")
    causes = [line.removeprefix("Caused by: ") for line in lines if line.startswith("Caused by: ")]
    if causes and causes[-1] not in head:
        return f"{head} (cause: {causes[-1]})"
    return head


def _log_libraries_to(log_file: Path) -> None:
    """Send what the Python libraries log to the job's log file, with Spark's, instead of
    between the progress lines (matplotlib says so when it builds its font cache on a
    first run)."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in ("matplotlib", "py4j"):
        lib = logging.getLogger(name)
        lib.addHandler(handler)
        lib.propagate = False


def main(argv: Sequence[str] | None = None, prog: str = "hearthnet mesh health") -> int:
    """Run the job from command-line arguments; returns the exit code."""
    parser = build_parser(prog)
    try:
        args = parser.parse_args(list(argv) if argv is not None else None)
    except SystemExit as exc:  # argparse exits 2 on usage errors, 0 on --help
        return int(exc.code or 0)
    try:
        cfg = config_from_args(args)
    except MeshHealthError as exc:
        _fail(args, prog, "usage", str(exc))
        return 2
    if "://" not in args.input and not Path(args.input).exists():
        _fail(args, prog, "error", f"input {args.input} does not exist")
        return 1
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ and args.master is None
    if not under_submit and (java := java_problem()) is not None:
        _fail(args, prog, "error", java)
        return 1
    _log_libraries_to(Path(args.out) / "spark.log")
    try:
        # imported here, not at the top: --help and usage errors must work without pyspark
        from spark_federation import mesh_health, session  # noqa: PLC0415
    except ImportError as exc:
        _fail(
            args,
            prog,
            "error",
            f"PySpark is not installed ({exc.name}): {sys.executable} {INSTALL_HINT}",
        )
        return 1

    def progress(line: str) -> None:
        # stderr, like any tool's progress: stdout stays free for a result
        if not args.quiet:
            print(f"mesh health {line}", file=sys.stderr, flush=True)

    spark = None
    class_cache = Path(args.class_cache) if args.class_cache else None
    try:
        spark = session.build_session(
            args.master,
            driver_memory=args.driver_memory,
            shuffle_partitions=args.shuffle_partitions,
            ui=args.ui,
            log_file=Path(args.out) / "spark.log",
            input_uri=args.input,
            class_cache=class_cache,
        )
        summary = mesh_health.run(spark, cfg, progress)
    except MeshHealthError as exc:
        _fail(args, prog, "error", str(exc))
        return 1
    except Exception as exc:  # Spark/JVM failure: one line, full detail only on request
        where = "" if under_submit else f" (Spark's own log: {Path(args.out) / 'spark.log'})"
        _fail(args, prog, "error", f"Spark job failed: {spark_error_line(exc)}{where}")
        return 1
    finally:
        if spark is not None:
            session.stop(spark, class_cache)
    progress(
        f"done: {summary['nodes']} nodes, {len(summary['partitions'])} partitions,"
        f" {len(summary['outages'])} outages, {len(summary['flapping_links'])} flapping links,"
        f" {len(summary['relay_only_nodes'])} relay-only, {len(summary['skewed_nodes'])} skewed"
    )
    if args.json:
        print(json.dumps(result_document(args, summary), sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
