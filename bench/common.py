"""Shared benchmark plumbing: start the node with the CLI, measure CPU of processes, report.

Every benchmark starts its own servers on loopback, bounds every loop by count and
time, and stops what it started by PID.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


def percentile(values: list[float], p: float) -> float:
    """The p-th percentile (0..100) by nearest rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def proc_cpu_s(pid: int) -> float:
    """User+system CPU seconds of a process from /proc."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(parts[11]) + int(parts[12])) / ticks


def proc_rss_mb(pid: int) -> float:
    """Resident set size of a process in MiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def self_cpu_s() -> float:
    """CPU seconds used by this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 10) -> None:
    """Stop a process we started: SIGTERM, then SIGKILL if it lingers past ``grace_s``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@dataclass
class NodeUnderTest:
    """A node started by ``hearthnet node start`` for a benchmark."""

    proc: subprocess.Popen[str]
    url: str
    data_dir: Path
    ready_s: float
    fields: dict[str, str] = field(default_factory=dict)
    temporary: bool = False  # data_dir was made for this node: removed when it stops

    @property
    def pid(self) -> int:
        """The node's PID."""
        return self.proc.pid

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers; a temporary data directory goes too."""
        stop_process(self.proc)
        if self.temporary:
            shutil.rmtree(self.data_dir, ignore_errors=True)


def start_node(
    *extra: str, env: dict[str, str] | None = None, data_dir: Path | None = None
) -> NodeUnderTest:
    """Start a node with the CLI on a free loopback port and wait for its ready line."""
    data = data_dir or Path(tempfile.mkdtemp(prefix="hn-bench-"))
    started = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hearthnet.cli",
            "node",
            "start",
            "--data-dir",
            str(data),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--log-level",
            "warning",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("hearthnet ready"):
        stop_process(proc)
        raise RuntimeError(f"node did not start: {line!r}")
    ready_s = time.monotonic() - started
    fields = dict(p.split("=", 1) for p in line.split()[2:])
    return NodeUnderTest(proc, fields["url"], data, ready_s, fields, temporary=data_dir is None)


def summarize_latencies(samples_s: list[float]) -> dict[str, float]:
    """p50/p90/p99/mean in milliseconds."""
    ms = [s * 1000 for s in samples_s]
    return {
        "p50_ms": round(percentile(ms, 50), 3),
        "p90_ms": round(percentile(ms, 90), 3),
        "p99_ms": round(percentile(ms, 99), 3),
        "mean_ms": round(statistics.fmean(ms), 3) if ms else float("nan"),
        "n": len(ms),
    }


def save(name: str, result: dict[str, Any]) -> Path:
    """Write a result file under bench/results/ and print it."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    result = {
        "benchmark": name,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        **result,
    }
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    return path
