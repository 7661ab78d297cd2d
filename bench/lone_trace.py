"""Where a 1-in-flight publish's round trip goes, piece by piece, in a node process.

Loaded into a node started by a benchmark through ``bench/lone_trace_site`` (its
``sitecustomize``; nothing in the node's code knows of it), :func:`install` wraps the
functions of the lone-publish path with two clocks (wall and the thread's CPU) and, for
three of them, marks on the event loop's timeline: a WebSocket read starting
(``LeanWebSocket.data_received``), a socket write ending (``write_through``: a publish's
answer, then its delivery) and the end of the loop callback that committed it
(``WsPublisher.flush``). The node writes what it gathered when it exits (the benchmark
stops it with SIGTERM). :func:`report` reads that back: per function the calls, median
wall and mean CPU per commit; per round trip (a read to the next read) the node's time
before the answer was written, the time from the answer to the next read, and the rest.
The wrappers cost ~1-2 µs a call (~20 calls a publish): compare pieces with each other,
not with figures measured without it.

Run (from the tree under test)::

    HN_LONE_TRACE=/tmp/trace PYTHONPATH=bench/lone_trace_site:. python -m bench.bench_pubsub \\
        --servers hearthnet-normal --skip throughput,latency,idle,history \\
        --durable-outstanding 1 --repeat 1 --duration 15 --warmup 3
    python -m bench.lone_trace /tmp/trace.<pid>
"""

from __future__ import annotations

import atexit
import functools
import importlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# (module, qualified name, timeline mark or "", modules that imported the name)
TARGETS: list[tuple[str, str, str, tuple[str, ...]]] = [
    ("hearthnet.pubsub.wsupgrade", "LeanWebSocket.data_received", "rx", ()),
    ("hearthnet.pubsub.ws", "WsSession.decode", "", ()),
    ("hearthnet.pubsub.ws", "WsSession.on_message", "", ()),
    ("hearthnet.pubsub.ws_publish", "WsPublisher.publish", "", ()),
    ("hearthnet.pubsub.ws_publish", "WsPublisher.flush", "fl", ()),
    ("hearthnet.pubsub.log", "MessageLog.publish_many", "", ()),
    ("hearthnet.pubsub.log", "MessageLog.end_turn", "", ()),
    ("hearthnet.pubsub.logcommit", "write_batch", "", ("hearthnet.pubsub.log",)),
    ("hearthnet.pubsub.logcommit", "sign_local", "", ()),
    ("hearthnet.ids", "new_ulids", "", ("hearthnet.pubsub.logcommit", "hearthnet.pubsub.logrun")),
    ("hearthnet.pubsub.envelope", "Message.signed_batch", "", ()),
    ("hearthnet.identity", "KeyPair.sign_bytes", "", ()),
    ("hearthnet.pubsub.logcommit", "_write_lone", "", ()),
    ("hearthnet.pubsub.logrun", "store_row", "", ("hearthnet.pubsub.logcommit",)),
    ("hearthnet.pubsub.log", "MessageLog._done", "", ()),
    ("hearthnet.pubsub.logindex", "LogIndex.add_columns", "", ()),
    ("hearthnet.pubsub.ws_publish", "answer", "", ()),
    ("hearthnet.pubsub.fanout", "FanOut.on_commit", "", ()),
    ("hearthnet.pubsub.fanout", "FanOut._flush_dirty", "", ()),
    ("hearthnet.pubsub.subscriber", "Subscriber.write_out", "", ()),
    ("hearthnet.transport.direct", "write_through", "wt", ("hearthnet.pubsub.sinks",)),
]
MAX_EVENTS = 2_000_000  # timeline marks kept (bounded: ~3 per publish)
MAX_WALLS = 200_000  # wall times kept per function for its median


class Trace:
    """What the wrappers gather: per function [calls, wall ns, CPU ns, walls], and the
    loop's timeline marks (kind, perf_counter_ns)."""

    def __init__(self) -> None:
        self.stats: dict[str, list[Any]] = {}
        self.events: list[tuple[str, int]] = []

    def wrap(self, name: str, fn: Callable[..., Any], mark: str) -> Callable[..., Any]:
        """``fn`` timed under ``name``; with ``mark``, its start and end on the timeline."""
        st = self.stats.setdefault(name, [0, 0, 0, []])
        events, wall, cpu = self.events, time.perf_counter_ns, time.thread_time_ns

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0, c0 = wall(), cpu()
            if mark and len(events) < MAX_EVENTS:
                events.append((mark + "0", t0))
            try:
                return fn(*args, **kwargs)
            finally:
                t1 = wall()
                st[0] += 1
                st[1] += t1 - t0
                st[2] += cpu() - c0
                if len(st[3]) < MAX_WALLS:
                    st[3].append(t1 - t0)
                if mark and len(events) < MAX_EVENTS:
                    events.append((mark + "1", t1))

        return timed

    def dump(self, path: Path) -> None:
        """Write the counters (each function's median wall, not every wall) and marks."""
        stats = {
            name: [c, w, u, statistics.median(walls) if walls else 0]
            for name, (c, w, u, walls) in self.stats.items()
        }
        path.write_text(json.dumps({"stats": stats, "events": self.events}))


def install(out: Path) -> Trace:
    """Wrap every :data:`TARGETS` function (and the names other modules imported of it)
    and write the trace to ``out`` when the process exits."""
    trace = Trace()
    for module_name, qualname, mark, importers in TARGETS:
        owner: Any = importlib.import_module(module_name)
        *path, attr = qualname.split(".")
        for part in path:
            owner = getattr(owner, part)
        timed = trace.wrap(qualname, getattr(owner, attr), mark)
        setattr(owner, attr, timed)
        for importer in importers:
            setattr(importlib.import_module(importer), attr, timed)
    atexit.register(trace.dump, out)
    return trace


def install_from_env() -> None:
    """In a node process (``node start``) when ``HN_LONE_TRACE`` names an output prefix:
    :func:`install`, writing to ``<prefix>.<pid>``."""
    prefix = os.environ.get("HN_LONE_TRACE")
    if prefix and "start" in sys.argv:
        install(Path(f"{prefix}.{os.getpid()}"))


def cycles(events: list[tuple[str, int]]) -> list[dict[str, int]]:
    """The round trips of a 1-in-flight run on the loop's timeline: each from a read
    (``rx0``) to the next read after the commit's writes; ``ack`` the end of the first
    write (the answer), ``dl`` of the second (the delivery), ``fl`` the end of the
    callback that committed. Reads before the answer (a frame split over reads) stay in
    their round trip."""
    out: list[dict[str, int]] = []
    cur: dict[str, int] | None = None
    for kind, t in events:
        if kind == "rx0":
            if cur is not None and "ack" in cur:
                cur["next"] = t
                out.append(cur)
                cur = None
            if cur is None:
                cur = {"rx": t, "writes": 0}
        elif cur is not None and kind == "wt1":
            cur["writes"] += 1
            cur.setdefault("ack" if cur["writes"] == 1 else "dl", t)
        elif cur is not None and kind == "fl1" and "ack" in cur:
            cur.setdefault("fl", t)
    return out


def report(data: dict[str, Any], skip: float = 0.2) -> dict[str, Any]:
    """Per function (calls, wall p50 and mean, CPU mean, µs per commit) and the round
    trip's parts (medians in µs), leaving out the first ``skip`` of the round trips."""
    stats = data["stats"]
    commits = max(1, stats.get("MessageLog._done", [1])[0])
    functions = {
        name: {
            "calls_per_commit": round(c / commits, 2),
            "wall_p50_us": round(p50 / 1e3, 1),
            "wall_us_per_commit": round(w / commits / 1e3, 1),
            "cpu_us_per_commit": round(u / commits / 1e3, 1),
        }
        for name, (c, w, u, p50) in stats.items()
    }
    trips = cycles([(k, t) for k, t in data["events"]])
    trips = trips[int(len(trips) * skip) :]

    def med(a: str, b: str) -> float | None:
        spans = [c[b] - c[a] for c in trips if a in c and b in c and c[b] >= c[a]]
        return round(statistics.median(spans) / 1e3, 1) if spans else None

    return {
        "commits": commits,
        "round_trips": len(trips),
        "functions": functions,
        "read_to_answer_written_us": med("rx", "ack"),
        "answer_to_delivery_written_us": med("ack", "dl"),
        "answer_to_commit_callback_end_us": med("ack", "fl"),
        "answer_to_next_read_us": med("ack", "next"),
        "commit_callback_end_to_next_read_us": med("fl", "next"),
        "read_to_next_read_us": med("rx", "next"),
    }


def main(argv: list[str] | None = None) -> None:
    """Print :func:`report` of a trace file."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print("usage: python -m bench.lone_trace TRACE_FILE")
        return
    print(json.dumps(report(json.loads(Path(args[0]).read_text())), indent=1))


if __name__ == "__main__":
    main()
