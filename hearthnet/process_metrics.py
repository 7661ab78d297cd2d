"""The process series every Prometheus exporter has (``process_*``) and the node's build.

Read at scrape time from ``/proc/self`` where it exists (Linux); elsewhere the series
that need it are left out rather than reported wrong. Names and meanings are those of
the Prometheus client libraries, so stock dashboards and alerts work unchanged.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

from hearthnet import __version__
from hearthnet.metrics import LabelValues, MetricsRegistry

PROC = Path("/proc")


def _page_size() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 4096


def _ticks_per_s() -> int:
    try:
        return os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        return 100


def process_start_time_s(proc: Path = PROC) -> float | None:
    """Seconds since the epoch at which this process started, from ``/proc`` (None
    elsewhere): the boot time plus the process's start in clock ticks after boot."""
    try:
        stat = (proc / "self" / "stat").read_text()
        boot = next(
            line for line in (proc / "stat").read_text().splitlines() if line.startswith("btime ")
        )
    except (OSError, StopIteration):
        return None
    # the command name (field 2) may hold spaces and parentheses: fields after the last ')'
    fields = stat.rsplit(")", 1)[1].split()
    return int(boot.split()[1]) + int(fields[19]) / _ticks_per_s()


def resident_bytes(proc: Path = PROC) -> float:
    """Resident set size now (``/proc/self/statm``), in bytes."""
    return float(int((proc / "self" / "statm").read_text().split()[1]) * _page_size())


def open_fds(proc: Path = PROC) -> float:
    """File descriptors open now."""
    return float(len(os.listdir(proc / "self" / "fd")))


def register_process_metrics(registry: MetricsRegistry, proc: Path = PROC) -> None:
    """Add ``process_cpu_seconds_total``, ``process_resident_memory_bytes``,
    ``process_open_fds``, ``process_start_time_seconds`` and ``hearthnet_build_info``."""
    registry.read_counter(
        "process_cpu_seconds_total",
        "Total user and system CPU time spent in seconds.",
        lambda: sum(os.times()[:2]),
    )
    if (proc / "self" / "statm").exists():
        registry.gauge(
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            lambda: resident_bytes(proc),
        )
    if (proc / "self" / "fd").is_dir():
        registry.gauge(
            "process_open_fds", "Number of open file descriptors.", lambda: open_fds(proc)
        )
    # without /proc, registration time: the node registers its metrics as it starts
    started = process_start_time_s(proc) or time.time()
    registry.gauge(
        "process_start_time_seconds",
        "Start time of the process since unix epoch in seconds.",
        lambda: started,
    )
    build: dict[LabelValues, float] = {(__version__, platform.python_version()): 1.0}
    registry.gauge(
        "hearthnet_build_info",
        "The running build: HearthNet version and Python version (value 1).",
        lambda: build,
        ("version", "python"),
    )
