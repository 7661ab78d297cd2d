"""Where the slowest deliveries of the latency scenario wait, in a node process.

Loaded into a node started by a benchmark through ``bench/p99_trace_site`` (its
``sitecustomize``; nothing in the node's code knows of it), :func:`install` records, with
the time each started and how long it took: every job of the log's writer
(``SqliteWriter.run`` in its thread, ``run_here`` on the event loop: a commit, a
retention transaction, a checkpoint job), whether the database file changed in it (the
WAL was copied: SQLite's automatic checkpoint ran inside it), every checkpoint job of its
own, every commit's hand-over (``MessageLog._done``: answers and fan-out, on the loop)
with each of its messages' time in the node (from its ``ts``, set when it was queued, to
the end of that call), garbage collections, and the event loop's lateness (a 5 ms sleep
that woke more than 8 ms late). The records go to ``<prefix>.<pid>`` as JSON lines, twice
a second. :func:`report` reads them back: the messages' time in the node by percentile,
the jobs by kind and where they ran, the longest records, and for the messages at or over
the p99 the longest record that overlapped their wait.

Run (from the tree under test)::

    HN_P99_TRACE=/tmp/p99 PYTHONPATH=bench/p99_trace_site:. python -m bench.bench_pubsub \\
        --servers hearthnet-normal --skip throughput,durable,idle,history --repeat 2
    python -m bench.p99_trace /tmp/p99.<pid>

The wrappers cost a few µs a job and a commit: compare records with each other, not with
figures measured without them.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hearthnet.pubsub import log as mlog
from hearthnet.pubsub import logstore

MAX_RECORDS = 3_000_000  # bounded: ~5 a commit
LAG_TICK_S = 0.005
LAG_MIN_S = 0.008


class Recorder:
    """Records ``[kind, start s, duration ms, info]`` and appends them to ``out``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.base = time.perf_counter()
        self.records: list[list[Any]] = []
        threading.Thread(target=self._flush, name="p99-trace", daemon=True).start()

    def rec(self, kind: str, start: float, seconds: float, info: Any = None) -> None:
        """One record (``start`` a ``perf_counter`` time)."""
        if len(self.records) < MAX_RECORDS:
            self.records.append([kind, round(start - self.base, 4), round(seconds * 1e3, 3), info])

    def _flush(self) -> None:
        done = 0
        while True:
            time.sleep(0.5)
            end = len(self.records)
            if end > done:
                with self.out.open("a", encoding="utf-8") as f:
                    f.writelines(json.dumps(r) + "\n" for r in self.records[done:end])
                done = end


def _name(job: Any) -> str:
    func = getattr(job, "func", job)
    return str(getattr(func, "__qualname__", repr(func)))[-40:]


def _db_state(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError:
        return (0, 0)
    return (st.st_size, st.st_mtime_ns)


def install(out: Path) -> Recorder:
    """Wrap the log's writer, its commits' hand-over and open (the lateness probe), and
    record collections."""
    rec, clock = Recorder(out), time.perf_counter
    writer_cls: Any = logstore.SqliteWriter
    run, run_here = writer_cls.run, writer_cls.run_here

    def timed(job: Any, path: Path, where: str, queued: float) -> Callable[[Any], Any]:
        def wrapped(conn: Any) -> Any:
            before, t = _db_state(path), clock()
            try:
                return job(conn)
            finally:
                copied = _db_state(path) != before
                rec.rec(where, t, clock() - t, [_name(job), round((t - queued) * 1e3, 2), copied])

        return wrapped

    async def run_traced(self: Any, job: Any, *, fsync: bool = True) -> Any:
        return await run(self, timed(job, self.path, "thread", clock()), fsync=fsync)

    def run_here_traced(self: Any, job: Any) -> Any:
        return run_here(self, timed(job, self.path, "loop", clock()))

    writer_cls.run, writer_cls.run_here = run_traced, run_here_traced
    if hasattr(logstore, "checkpoint"):
        checkpoint = logstore.checkpoint

        def checkpoint_traced(conn: Any, path: Path) -> None:
            t = clock()
            try:
                checkpoint(conn, path)
            finally:
                rec.rec("checkpoint", t, clock() - t)

        logstore.checkpoint = checkpoint_traced
    log_cls: Any = mlog.MessageLog
    done, opened = log_cls._done, log_cls.open

    def done_traced(self: Any, batch: Any, outcomes: Any, rows: Any) -> None:
        t = clock()
        try:
            done(self, batch, outcomes, rows)
        finally:
            end_ms = time.time() * 1e3
            waits: Counter[int] = Counter()
            for item in outcomes:
                fields = getattr(item, "fields", None)
                ts = fields["ts"] if fields else getattr(getattr(item, "_message", None), "ts", 0)
                if ts:
                    waits[int(end_ms - ts)] += 1
            rec.rec("handover", t, clock() - t, sorted(waits.items()))

    async def open_traced(self: Any) -> None:
        await opened(self)

        async def lateness() -> None:
            loop = asyncio.get_running_loop()
            while True:
                t = loop.time()
                await asyncio.sleep(LAG_TICK_S)
                late = loop.time() - t - LAG_TICK_S
                if late > LAG_MIN_S:
                    rec.rec("late", clock() - late, late)

        self._p99_trace_lateness = asyncio.get_running_loop().create_task(lateness())

    log_cls._done, log_cls.open = done_traced, open_traced
    started: list[float] = []

    def collected(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [clock()]
        elif started:
            rec.rec("gc", started[0], clock() - started[0], info["generation"])

    gc.callbacks.append(collected)
    return rec


def install_from_env() -> None:
    """In a node process (``node start``) when ``HN_P99_TRACE`` names an output prefix:
    :func:`install`, writing to ``<prefix>.<pid>``."""
    prefix = os.environ.get("HN_P99_TRACE")
    if prefix and "start" in sys.argv:
        install(Path(f"{prefix}.{os.getpid()}"))


def _pct(values: Counter[int], ps: tuple[float, ...]) -> dict[str, int]:
    total, seen, out = sum(values.values()), 0, {}
    for v in sorted(values):
        seen += values[v]
        for p in ps:
            if str(p) not in out and seen >= p * total:
                out[str(p)] = v
    return out


def _spread(ms: list[float]) -> dict[str, float]:
    ms = sorted(ms)
    return {
        "n": len(ms),
        "p50": ms[len(ms) // 2],
        "p99": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
        "max": ms[-1],
    }


def report(records: list[list[Any]]) -> dict[str, Any]:
    """What the records say (see the module's docstring)."""
    waits: Counter[int] = Counter()
    for kind, _t, _ms, info in records:
        if kind == "handover":
            waits.update({int(v): int(c) for v, c in info})
    tail = _pct(waits, (0.5, 0.9, 0.99, 0.999, 1.0))
    jobs: dict[str, list[float]] = {}
    for kind, _t, ms, info in records:
        if kind in ("thread", "loop"):
            jobs.setdefault(f"{kind} {info[0]}{' (WAL copied)' if info[2] else ''}", []).append(ms)
        elif kind in ("checkpoint", "gc", "late", "handover"):
            jobs.setdefault(kind if kind != "gc" else f"gc {info}", []).append(ms)
    spans = [
        (t, t + ms / 1e3, ms, kind if kind not in ("thread", "loop") else f"{kind} {info[0]}")
        for kind, t, ms, info in records
        if kind != "handover" or ms > 5
    ]
    blame: Counter[str] = Counter()
    p99 = tail.get("0.99", 0)
    for kind, t, ms, info in records:
        if kind != "handover":
            continue
        slow = sum(int(c) for v, c in info if v >= p99)
        if slow:
            longest = max(int(v) for v, _c in info) / 1e3
            end = t + ms / 1e3
            over = [s for s in spans if s[1] > end - longest and s[0] < end and s[2] > 5]
            blame[max(over, key=lambda s: s[2])[3] if over else "nothing over 5 ms"] += slow
    return {
        "time_in_node_ms": tail,
        "messages": sum(waits.values()),
        "records_by_kind_ms": {k: _spread(v) for k, v in sorted(jobs.items())},
        "longest": sorted(
            ([round(t, 2), ms, kind, info if kind != "handover" else None]
             for kind, t, ms, info in records),
            key=lambda r: -r[1],
        )[:12],
        "messages_at_p99_or_over_by_longest_overlap": dict(blame.most_common(10)),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    """Print :func:`report` of a trace file."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m bench.p99_trace TRACE_FILE")
        return
    lines = Path(args[0]).read_text(encoding="utf-8").splitlines()
    print(json.dumps(report([json.loads(line) for line in lines]), indent=1))


if __name__ == "__main__":
    main()
