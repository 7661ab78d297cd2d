"""The SparkSession of one mesh-health run: local-mode settings sized to the input, and
Spark's own logging kept off the terminal.

Under ``spark-submit`` the master, resources and logging are spark-submit's and are left
alone. In local mode the job knows its machine and, for a local input directory, the size
of its input, and chooses:

- ``spark.sql.shuffle.partitions``: one per :data:`BYTES_PER_PARTITION` of heartbeat
  input, at least 1 and at most two per core. Spark's default of 200 costs more in task
  start-up than a laptop's data needs; a few hundred records need one.
- for a small input (under :data:`SMALL_INPUT_BYTES`, about a million records), the
  quick JIT only (``-XX:TieredStopAtLevel=1``), the serial collector
  (:data:`SMALL_INPUT_JVM`: no collector threads beside the job's), and no adaptive
  re-planning: compiling
  and re-planning the job's few hundred small stages cost more than running them. A large
  input keeps the optimising JIT, which pays for itself past a few million records
  (docs/benchmarks-log.md), and gets the parallel collector (:data:`LARGE_INPUT_JVM`):
  G1's concurrent threads and write barriers cost the job about twice the parallel
  collector's CPU, and a batch job does not need G1's short pauses. Its files are also
  read in :data:`READ_SPLITS_PER_CORE` tasks a core (``spark.sql.files.minPartitionNum``):
  Spark packs files into splits of up to 128 MiB, which gave 10 M records in 100 files
  5 tasks on 2 cores, the last running alone for a fifth of the pass.
- for a tiny input (under :data:`TINY_INPUT_BYTES`, a few ten thousand records, such
  as the tests' and a short recording's), also no generated code
  (:data:`TINY_INPUT_CONF`: operators and expressions interpreted): generating and
  compiling Java for every stage costs more than interpreting a few thousand rows, but
  interpreting costs about ten times as much per row, so a million records (a few
  passes of 10-30 CPU-seconds each) must keep it.
- after the one pass over the records, whatever the input's size, no adaptive
  re-planning and no whole-stage code generation (:data:`AFTER_PASS_CONF`, set by
  :func:`scoped_conf` for the rest of the run and then restored): every later query
  reads the pass's small aggregates, where re-planning each stage as a Spark job of
  its own, and generating and compiling a class per stage, cost more than they save.
- and, for the same reason, the quick JIT only from then on (:func:`quick_jit`, a
  compiler directive added to the running JVM and removed when the run ends): the
  optimising compiler keeps what it compiled for the pass, where it pays for itself,
  and compiles nothing more; code first hot after the pass gets the quick compiler's
  code, as in a small input's JVM. The optimising compiler's thread otherwise takes a
  core for much of the steps after the pass (docs/benchmarks-log.md).

And, given a cache directory (the CLI's ``--class-cache``), the JVM maps the classes
an earlier run loaded from a class-data archive there (:func:`class_archive_options`)
instead of reading and verifying them from Spark's jars again: that is most of the
JVM's start.

The answers do not depend on any of these.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pyspark.errors import PySparkRuntimeError
from pyspark.sql import SparkSession

LOG4J2 = Path(__file__).resolve().parent / "log4j2.properties"
BYTES_PER_PARTITION = 32 << 20
SMALL_INPUT_BYTES = 16 << 20
TINY_INPUT_BYTES = 1 << 20
RECORD_DIRS = ("heartbeats", "beacons", "traces")
QUICK_JIT = "-XX:TieredStopAtLevel=1"
# the JVM of a run on a small input: the serial collector (no collector threads beside the
# job's). Turning off the verification of loaded classes saved another ~7 % of the tests'
# run (docs/benchmarks-log.md) but is not done: the job would then run any jar on its class
# path unchecked.
SMALL_INPUT_JVM = "-XX:+UseSerialGC"
# the JVM of a run on a large (or unknown) input: the parallel collector
LARGE_INPUT_JVM = "-XX:+UseParallelGC"
# the JVM of Spark's launcher (it prints the driver's command line and exits)
LAUNCHER_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# Spark settings of a local session on a small input (with the quick JIT)
SMALL_INPUT_CONF = {"spark.sql.adaptive.enabled": "false"}
# and on a tiny one: no whole-stage code generation, expressions interpreted rather than
# compiled (Spark's factoryMode, otherwise used by its own tests)
TINY_INPUT_CONF = {
    **SMALL_INPUT_CONF,
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
}
# read tasks per core for a large input: many even tasks, so no core waits for the last
READ_SPLITS_PER_CORE = 8
# Spark settings of a local run once the records are reduced to their aggregates
AFTER_PASS_CONF = {"spark.sql.adaptive.enabled": "false", "spark.sql.codegen.wholeStage": "false"}


def local_input_bytes(input_uri: str) -> int | None:
    """Bytes of record files under a local input (a path or ``file:`` URI); None for
    other file systems, whose listing needs the JVM."""
    parsed = urlparse(input_uri)
    if parsed.scheme not in ("", "file"):
        return None
    root = Path(parsed.path if parsed.scheme else input_uri)
    if not root.is_dir():
        return None
    total = 0
    for directory, _, files in os.walk(root):
        if Path(directory).name in RECORD_DIRS:
            total += sum(
                (Path(directory) / f).stat().st_size for f in files if not f.startswith((".", "_"))
            )
    return total


def local_cores(master: str) -> int:
    """The cores of a ``local[N]`` master (``local[*]``, ``local``: this machine's)."""
    inside = master[master.find("[") + 1 : master.find("]")] if "[" in master else "1"
    head = inside.split(",")[0].strip()
    return int(head) if head.isdigit() and int(head) > 0 else os.cpu_count() or 2


def shuffle_partitions_for(input_bytes: int | None, cores: int) -> int:
    """Shuffle partitions for local mode: sized to the input, 1 to ``2 * cores``."""
    most = max(4, 2 * cores)
    if input_bytes is None:
        return most
    return max(1, min(most, math.ceil(input_bytes / BYTES_PER_PARTITION)))


def settings_for(input_bytes: int | None, cores: int = 2) -> tuple[list[str], dict[str, str]]:
    """JVM options and Spark settings of a local session for an input of this size
    (None: unknown, Spark's defaults) on this many cores."""
    if input_bytes is None or input_bytes >= SMALL_INPUT_BYTES:
        # the pass over the records in READ_SPLITS_PER_CORE tasks a core: Spark's own split
        # (files packed up to 128 MiB) gave 10 M records 5 tasks, the last running alone
        return [LARGE_INPUT_JVM], {
            "spark.sql.files.minPartitionNum": str(READ_SPLITS_PER_CORE * max(1, cores))
        }
    return [QUICK_JIT, SMALL_INPUT_JVM], dict(
        TINY_INPUT_CONF if input_bytes < TINY_INPUT_BYTES else SMALL_INPUT_CONF
    )


def _archive_key() -> str:
    """What a class-data archive is good for: this Spark (its jars) on this Java."""
    import pyspark  # noqa: PLC0415 - only its version and place

    java = shutil.which("java", path=os.path.join(os.environ.get("JAVA_HOME", ""), "bin"))
    java = java or shutil.which("java") or ""
    real = Path(java).resolve() if java else None
    parts = [
        pyspark.__version__,
        str(Path(pyspark.__file__).resolve().parent),
        str(real),
        str(real.stat().st_mtime_ns) if real else "",
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def class_archive(cache_dir: Path) -> Path:
    """The class-data archive of this Spark on this Java in ``cache_dir``."""
    return cache_dir / f"spark-classes-{_archive_key()}.jsa"


def class_archive_options(cache_dir: Path) -> list[str]:
    """JVM options that map Spark's classes from an archive in ``cache_dir``.

    With no archive yet, the JVM writes one when it exits (Java's dynamic class-data
    sharing), under a name of this process; :func:`stop` waits for that JVM to exit
    and only then gives the file the archive's name, so no run maps one half written.
    A JVM that finds an archive it cannot use (another build) starts without it; one
    that fails to start with it (a damaged archive crashes Java 17 as it maps it) is
    started again without it by :func:`build_session`, which removes it. No options
    when the directory's path has white space (the JVM options are split on it), or
    when the directory cannot be made or written.
    """
    archive = class_archive(cache_dir)
    if any(ch.isspace() for ch in str(archive)):
        return []
    if archive.is_file():
        return [f"-XX:SharedArchiveFile={archive}"]
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError:  # no cache here (read-only, not a directory): run without
        return []
    if not os.access(cache_dir, os.W_OK):
        return []
    return [f"-XX:ArchiveClassesAtExit={archive}.{os.getpid()}"]


def stop(spark: SparkSession, class_cache: Path | None = None, wait_s: float = 120.0) -> None:
    """Stop the session; when its local JVM is writing a class-data archive on exit, also
    let the JVM exit (it exits when its standard input closes), so the archive is
    complete, and name it. Otherwise the JVM finishes exiting on its own, as PySpark
    leaves it, and the command returns without waiting for it.
    """
    proc: Any = getattr(spark.sparkContext._gateway, "proc", None)
    options = str(spark.sparkContext.getConf().get("spark.driver.extraJavaOptions", ""))
    spark.stop()
    if class_cache is None or proc is None or "-XX:ArchiveClassesAtExit=" not in options:
        return
    written = Path(f"{class_archive(class_cache)}.{os.getpid()}")
    with contextlib.suppress(OSError, ValueError):
        proc.stdin.close()
    try:
        proc.wait(timeout=wait_s)
    except Exception:  # still writing: leave it, the next run writes one again
        return
    if written.is_file():
        os.replace(written, class_archive(class_cache))
        _remove_stale_archives(class_cache)


def _remove_stale_archives(cache_dir: Path) -> None:
    """Remove the archives of other Spark or Java builds, and those left half written by
    runs that are gone (each is the size of Spark's classes, ~170 MB)."""
    current = class_archive(cache_dir).name
    for path in cache_dir.glob("spark-classes-*.jsa*"):
        if path.name == current:
            continue
        suffix = path.name.rpartition(".")[2]
        if suffix.isdigit() and _alive(int(suffix)):
            continue  # another run still writing its archive
        with contextlib.suppress(OSError):
            path.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


@contextlib.contextmanager
def scoped_conf(spark: SparkSession, conf: Mapping[str, str]) -> Iterator[None]:
    """Run a block with these session settings, then put back what was there before."""
    before = {key: spark.conf.get(key, None) for key in conf}
    for key, value in conf.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in before.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


# a HotSpot compiler directive: no method compiled by C2 (the optimising compiler) from
# now on; a method C2 may not compile is compiled by C1 alone (as -XX:TieredStopAtLevel=1)
C2_OFF_DIRECTIVE = [{"match": ["*.*"], "c2": {"Exclude": True}}]
_DCMD = "com.sun.management:type=DiagnosticCommand"


def _diagnostic_command(spark: SparkSession, operation: str, *args: str) -> str:
    """Run one of the driver JVM's diagnostic commands (what ``jcmd`` runs), in process.

    Through reflection on the MBeanServer interface: the platform server's class is not
    public, so py4j cannot call its methods directly.
    """
    jvm: Any = spark.sparkContext._jvm
    gateway: Any = spark.sparkContext._gateway
    lang = jvm.java.lang

    def array(kind: Any, values: list[Any]) -> Any:
        out = gateway.new_array(kind, len(values))
        for i, v in enumerate(values):
            out[i] = v
        return out

    types = [
        lang.Class.forName(n)
        for n in ("javax.management.ObjectName", "java.lang.String", "[Ljava.lang.Object;")
    ]
    types.append(lang.Class.forName("[Ljava.lang.String;"))
    invoke = lang.Class.forName("javax.management.MBeanServer").getMethod(
        "invoke", array(lang.Class, types)
    )
    server = jvm.java.lang.management.ManagementFactory.getPlatformMBeanServer()
    call = [
        jvm.javax.management.ObjectName(_DCMD),
        operation,
        array(lang.Object, [array(lang.String, list(args))]),
        array(lang.String, ["[Ljava.lang.String;"]),
    ]
    return str(invoke.invoke(server, array(lang.Object, call)))


@contextlib.contextmanager
def quick_jit(spark: SparkSession) -> Iterator[None]:
    """Run a block with the driver JVM's optimising compiler (C2) compiling nothing new.

    What C2 already compiled stays; methods that get hot in the block are compiled by
    C1 only. The directive is removed afterwards. A JVM without the diagnostic command
    (not HotSpot) runs the block unchanged.
    """
    with tempfile.TemporaryDirectory(prefix="mesh-health-jit-") as tmp:
        directive = Path(tmp) / "c2-off.json"
        directive.write_text(json.dumps(C2_OFF_DIRECTIVE))
        try:
            added = "1 compiler directives added" in _diagnostic_command(
                spark, "compilerDirectivesAdd", str(directive)
            )
        except Exception:  # no such command on this JVM: leave the JIT alone
            added = False
    try:
        yield
    finally:
        if added:
            _diagnostic_command(spark, "compilerDirectivesRemove")


@contextlib.contextmanager
def _output_to(log_file: Path) -> Iterator[None]:
    """Point this process's stdout and stderr descriptors at ``log_file`` while the JVM
    is started: the JVM inherits them, so what it prints (its own warnings, log4j,
    shutdown messages) goes to the file for its whole life; ours are restored after."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    try:
        with log_file.open("ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            yield
    finally:
        for fd, target in zip(saved, (1, 2), strict=True):
            os.dup2(fd, target)
            os.close(fd)


def build_session(
    master: str | None,
    *,
    driver_memory: str = "2g",
    shuffle_partitions: int | None = None,
    ui: bool = False,
    log_file: Path | None = None,
    input_uri: str | None = None,
    class_cache: Path | None = None,
) -> SparkSession:
    """The SparkSession for one run.

    Args:
        master: Spark master (default ``local[*]``); None under spark-submit keeps its own.
        driver_memory: driver heap in local mode.
        shuffle_partitions: overrides the sizing above.
        ui: enable the Spark UI (profiling).
        log_file: where the JVM this starts logs (at warning level, :data:`LOG4J2`)
            instead of the terminal.
        input_uri: the job's input, to size local mode by.
        class_cache: in local mode, where the JVM keeps its class-data archive
            (:func:`class_archive_options`); None: none.
    """
    builder = SparkSession.builder.appName("hearthnet-mesh-health")
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ and master is None
    java_options: list[str] = []
    if not under_submit:
        chosen = master or "local[*]"
        builder = builder.master(chosen).config("spark.driver.memory", driver_memory)
        if chosen.startswith("local"):
            size = local_input_bytes(input_uri) if input_uri else None
            partitions = shuffle_partitions or shuffle_partitions_for(size, os.cpu_count() or 2)
            builder = builder.config("spark.sql.shuffle.partitions", str(partitions))
            jit, conf = settings_for(size, local_cores(chosen))
            java_options.extend(jit)
            if class_cache is not None:
                java_options.extend(class_archive_options(class_cache))
            for key, value in conf.items():
                builder = builder.config(key, value)
        elif shuffle_partitions:
            builder = builder.config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        builder = builder.config("spark.ui.enabled", "true" if ui else "false")
    # the job prints its own progress lines; Spark's console bar would overwrite them
    builder = builder.config("spark.sql.session.timeZone", "UTC").config(
        "spark.ui.showConsoleProgress", "false"
    )
    if log_file is not None and not under_submit:
        java_options.append(f"-Dlog4j2.configurationFile={LOG4J2.as_uri()}")
        crash_dir = str(log_file.parent.resolve())
        if not any(ch.isspace() for ch in crash_dir):
            # a JVM crash report goes beside the log, not into the current directory
            java_options.append(f"-XX:ErrorFile={crash_dir}/hs_err_pid%p.log")
    if not under_submit and (master or "local[*]").startswith("local"):
        local_processes()
    try:
        return _start(builder, java_options, log_file if not under_submit else None)
    except PySparkRuntimeError:
        # the JVM did not come up: if it was mapping a class-data archive, the archive
        # is the likely cause (Java 17 crashes on a damaged one); start without it
        mapped = [o for o in java_options if o.startswith("-XX:SharedArchiveFile=")]
        if class_cache is None or not mapped:
            raise
        with contextlib.suppress(OSError):
            class_archive(class_cache).unlink()
        rest = [o for o in java_options if o not in mapped]
        return _start(builder, rest, log_file if not under_submit else None)


def local_processes() -> None:
    """Defaults for the processes a local session starts besides the JVM (the caller's
    own settings stay): Python workers run this interpreter (PySpark's default is
    whatever ``python3`` is first on the PATH: another version, or a shim that starts
    a shell first), and Spark's launcher, a JVM of its own that only prints the
    driver's command line, runs with the quick JIT and the serial collector."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LAUNCHER_OPTS", LAUNCHER_JVM)


def _start(
    builder: SparkSession.Builder, java_options: list[str], log_file: Path | None
) -> SparkSession:
    """Start the session with these driver JVM options, its output into ``log_file``."""
    if java_options:
        builder = builder.config("spark.driver.extraJavaOptions", " ".join(java_options))
    if log_file is None:
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        return spark
    with _output_to(log_file):
        return builder.getOrCreate()
