"""The fan-out benchmark's load generator process (bench/fanout/loadgen.mjs) and what is
measured around it: CPU of processes and their threads, the machine's busy time, RSS.

Every loop is bounded: the load generator gets ``--max-time``, and reading its events
stops at its deadline; it is stopped by PID.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import ROOT, proc_cpu_s, proc_rss_mb
from bench.servers import MissingTool, require

FANOUT_DIR = ROOT / "bench" / "fanout"
LOADGEN = FANOUT_DIR / "loadgen.mjs"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- measuring processes and the machine ---------------------------------------------


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """CPU seconds of each thread of ``pid``: ``{tid: (name, seconds)}``."""
    out: dict[int, tuple[str, float]] = {}
    task_dir = Path(f"/proc/{pid}/task")
    try:
        tids = [int(t) for t in os.listdir(task_dir)]
    except OSError:
        return out
    for tid in tids:
        try:
            stat = (task_dir / str(tid) / "stat").read_text(encoding="ascii")
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        parts = stat.rsplit(")", 1)[1].split()
        out[tid] = (name, (int(parts[11]) + int(parts[12])) / CLK_TCK)
    return out


def loop_and_rest_s(pid: int) -> tuple[float, float, float]:
    """``(user, system, other threads)`` CPU seconds of ``pid``: its main thread (the
    node's event loop) in user and kernel mode, and every other thread's total (the
    log's writer among them)."""
    loop_user = loop_sys = rest = 0.0
    for tid, (_, seconds) in thread_cpu(pid).items():
        if tid != pid:
            rest += seconds
            continue
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text(encoding="ascii")
        except OSError:
            continue
        parts = stat.rsplit(")", 1)[1].split()
        loop_user, loop_sys = int(parts[11]) / CLK_TCK, int(parts[12]) / CLK_TCK
    return loop_user, loop_sys, rest


def context_switches(pid: int) -> tuple[int, int]:
    """``(main thread, other threads)``: voluntary and involuntary context switches of
    ``pid``'s threads since they started (``/proc/PID/task/TID/status``). A thread that
    waits for the GIL, a lock or a queue switches out voluntarily."""
    main = rest = 0
    task_dir = Path(f"/proc/{pid}/task")
    try:
        tids = [int(t) for t in os.listdir(task_dir)]
    except OSError:
        return 0, 0
    for tid in tids:
        try:
            text = (task_dir / str(tid) / "status").read_text(encoding="ascii")
        except OSError:
            continue
        n = sum(int(line.split()[1]) for line in text.splitlines() if "ctxt_switches:" in line)
        if tid == pid:
            main = n
        else:
            rest += n
    return main, rest


def machine_busy_s() -> float:
    """CPU seconds all CPUs spent busy since boot (``/proc/stat``)."""
    with open("/proc/stat", encoding="ascii") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid`` and its direct children (the node may run helpers)."""
    total = proc_cpu_s(pid)
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text(encoding="ascii").split()
    except OSError:
        children = []
    for child in children:
        with contextlib.suppress(OSError):
            total += proc_cpu_s(int(child))
    return total


def proc_syscalls(pid: int) -> tuple[int, int]:
    """``(syscr, syscw)`` of ``pid``: read and write system calls so far (0, 0 if unreadable)."""
    try:
        text = Path(f"/proc/{pid}/io").read_text(encoding="ascii")
    except OSError:
        return 0, 0
    fields = dict(line.split(": ", 1) for line in text.splitlines())
    return int(fields["syscr"]), int(fields["syscw"])


def proc_sys_s(pid: int) -> float:
    """CPU seconds ``pid`` spent in the kernel (its threads included; 0 if unreadable)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except OSError:
        return 0.0
    return int(stat.rsplit(")", 1)[1].split()[12]) / CLK_TCK


@dataclass
class Snapshot:
    """Counters taken at one instant of a run."""

    t: float
    server_cpu: float
    loadgen_threads: dict[int, tuple[str, float]]
    machine_busy: float
    server_rss: float
    server_syscalls: tuple[int, int]  # (reads, writes) from /proc/PID/io, sockets included
    server_sys: float  # the server's CPU seconds in the kernel (stime)
    server_threads: tuple[float, float, float]  # loop user, loop system, other threads
    server_switches: tuple[int, int]  # context switches: main thread, other threads

    @classmethod
    def take(cls, server_pid: int, loadgen_pid: int) -> Snapshot:
        """Read everything now."""
        return cls(
            time.monotonic(),
            tree_cpu_s(server_pid),
            thread_cpu(loadgen_pid),
            machine_busy_s(),
            proc_rss_mb(server_pid),
            proc_syscalls(server_pid),
            proc_sys_s(server_pid),
            loop_and_rest_s(server_pid),
            context_switches(server_pid),
        )


class RssPeak:
    """Samples a process's RSS in a background thread; keeps the peak."""

    def __init__(self, pid: int, every_s: float = 0.25) -> None:
        self.pid = pid
        self.every_s = every_s
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, proc_rss_mb(self.pid))
            except OSError:
                return
            self._stop.wait(self.every_s)

    def __enter__(self) -> RssPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2)


# --- running the load generator ------------------------------------------------------


class LoadgenError(RuntimeError):
    """The load generator failed or timed out."""


class Loadgen:
    """One load generator process: JSON-line events on stdout, stopped by PID."""

    def __init__(
        self, args: list[str], timeout_s: float, workdir: Path, profile_dir: Path | None = None
    ) -> None:
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self.stderr_path = workdir / f"loadgen-{time.monotonic_ns()}.err"
        self._stderr = self.stderr_path.open("wb")
        self.proc = subprocess.Popen(
            [
                "node",
                *(
                    []
                    if profile_dir is None
                    else ["--cpu-prof", "--cpu-prof-dir", str(profile_dir)]
                ),
                str(LOADGEN),
                *args,
                "--max-time",
                str(int(timeout_s)),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            cwd=FANOUT_DIR,
        )
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        """The load generator's PID."""
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.strip()
            if line.startswith("{"):
                with contextlib.suppress(json.JSONDecodeError):
                    self.events.put(json.loads(line))
        self.events.put(None)

    def next_event(self) -> dict[str, Any]:
        """The next event, or LoadgenError when the process ended or the time is up."""
        left = self.deadline + 30 - time.monotonic()
        try:
            event = self.events.get(timeout=max(0.1, left))
        except queue.Empty:
            raise LoadgenError(
                f"load generator silent past its deadline ({self.timeout_s} s)"
            ) from None
        if event is None:
            self.proc.wait(10)
            raise LoadgenError(
                f"load generator exited with {self.proc.returncode}: {self.stderr_tail()}"
            )
        return event

    def send(self, line: str) -> None:
        """Write a line to the load generator's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stderr_tail(self) -> str:
        """The end of its stderr."""
        self._stderr.flush()
        text = self.stderr_path.read_text(errors="replace")
        return text[-2000:]

    def close(self) -> None:
        """Wait for it to end; kill it by PID if it does not."""
        if self.proc.poll() is None:
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._stderr.close()
        with_stdin = self.proc.stdin
        if with_stdin is not None and not with_stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                with_stdin.close()


def loadgen_thread_shares(
    a: dict[int, tuple[str, float]], b: dict[int, tuple[str, float]], wall: float
) -> list[dict[str, Any]]:
    """Per-thread CPU share (of one core) between two samples, busiest first."""
    shares = []
    for tid, (name, cpu) in b.items():
        before = a.get(tid, (name, 0.0))[1]
        share = (cpu - before) / wall
        if share > 0.005:
            shares.append({"tid": tid, "name": name, "cores": round(share, 3)})
    return sorted(shares, key=lambda s: -s["cores"])


def timeline(series: list[list[int]]) -> str:
    """Deliveries/s in each sampling interval (about 250 ms), as one compact line."""
    rates = []
    prev_t, prev_n = 0, 0
    for t, n, _published in series:
        if t > prev_t:
            rates.append(round((n - prev_n) / (t - prev_t) * 1000))
        prev_t, prev_n = t, n
    return " ".join(str(r) for r in rates)


def ensure_loadgen() -> str:
    """node is installed and bench/fanout has its packages (npm ci when missing)."""
    require("node")
    out = subprocess.run(["node", "--version"], capture_output=True, text=True, check=True)
    version = out.stdout.strip()
    if int(version.lstrip("v").split(".")[0]) < 20:
        raise MissingTool(f"Node.js 20+ needed, found {version}")
    if not (FANOUT_DIR / "node_modules" / "ws").exists():
        if shutil.which("npm") is None:
            raise MissingTool("npm not found; install it, then run `npm ci` in bench/fanout")
        print("installing the load generator's packages (npm ci in bench/fanout)")
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=FANOUT_DIR, check=True)
    return version
