"""What one idle pub/sub WebSocket subscriber costs the node, by source line (spec §11).

    python -m bench.idle_memory --sessions 2000          # ~1 min

Starts ``hearthnet node start`` in a child process that runs the node with a control
thread on its stdin; opens a few subscribers (so one-off imports and caches are not
counted), starts ``tracemalloc``, opens ``--sessions`` more token subscribers with the
fan-out load generator (``bench/fanout/loadgen.mjs --mode idle``, all sharing one token as
in ``bench_pubsub``'s idle scenario), and prints the Python memory they added, per session
and by the source line that allocated it. ``tracemalloc`` itself makes RSS meaningless in
this process: RSS per 1,000 comes from ``bench_pubsub``'s idle scenario.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

from bench.loadgen import Loadgen
from bench.pubsub_targets import NODE_ENV, issue_token


def serve(data_dir: str, top: int) -> None:
    """The child: the node, and a thread taking ``start`` / ``report`` lines from stdin."""

    def control() -> None:
        before: tracemalloc.Snapshot | None = None
        for line in sys.stdin:
            if line.strip() == "start":
                gc.collect()
                tracemalloc.start(1)
                before = tracemalloc.take_snapshot()
            elif line.strip() == "report" and before is not None:
                gc.collect()
                stats = tracemalloc.take_snapshot().compare_to(before, "lineno")
                rows = [(s.size_diff, s.count_diff, str(s.traceback[0])) for s in stats]
                print(json.dumps({"total": sum(r[0] for r in rows), "rows": rows[:top]}))
                sys.stdout.flush()

    threading.Thread(target=control, daemon=True).start()
    from hearthnet.cli import main  # noqa: PLC0415 (only the child runs a node)

    sys.argv = ["hearthnet", "node", "start", "--data-dir", data_dir, "--host", "127.0.0.1",
                "--port", "0", "--log-level", "warning"]  # fmt: skip
    main()


def idle_subscribers(url: str, auth: Path, n: int, workdir: Path) -> Loadgen:
    """``n`` subscribed, idle connections, held until the generator is closed."""
    lg = Loadgen(
        ["--proto", "hearthnet", "--url", url, "--mode", "idle", "--subs", str(n),
         "--workers", "2", "--client", "lean", "--topic", "bench.idle",
         "--connect-concurrency", "100", "--hold", "600", "--auth", str(auth)],
        900,
        workdir,
    )  # fmt: skip
    event = lg.next_event()
    if event.get("event") != "ready":
        lg.close()
        raise RuntimeError(f"load generator: {event}")
    return lg


def main() -> None:
    """Measure and print."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--top", type=int, default=30, help="source lines shown")
    parser.add_argument("--serve", help=argparse.SUPPRESS)  # the child's data directory
    opts = parser.parse_args()
    if opts.serve:
        serve(opts.serve, opts.top)
        return
    data = Path(tempfile.mkdtemp(prefix="hn-idle-mem-"))
    workdir = Path(tempfile.mkdtemp(prefix="hn-idle-mem-lg-"))
    node = subprocess.Popen(
        [sys.executable, "-u", "-m", "bench.idle_memory", "--serve", str(data),
         "--top", str(opts.top)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ, **NODE_ENV},
    )  # fmt: skip
    assert node.stdin is not None
    assert node.stdout is not None
    loadgens: list[Loadgen] = []
    try:
        fields = dict(p.split("=", 1) for p in node.stdout.readline().split()[2:])
        url = "ws" + fields["url"].removeprefix("http") + "/pubsub/v1/subscribe"
        auth = workdir / "token.json"
        auth.write_text(json.dumps({"shared": {"token": issue_token(data, "subscriber")}}))
        loadgens.append(idle_subscribers(url, auth, 20, workdir))  # warm-up, not counted
        time.sleep(1)
        node.stdin.write("start\n")
        node.stdin.flush()
        time.sleep(1)
        loadgens.append(idle_subscribers(url, auth, opts.sessions, workdir))
        time.sleep(2)
        node.stdin.write("report\n")
        node.stdin.flush()
        report = json.loads(node.stdout.readline())
    finally:
        for lg in loadgens:
            lg.close()
        node.terminate()
        node.wait(30)
    n = opts.sessions
    print(f"{n:,} idle subscribers: {report['total'] / n:,.0f} bytes of Python memory each")
    print("bytes per session  objects per session  allocated at")
    for size, count, where in report["rows"]:
        print(f"{size / n:>18.1f}  {count / n:>19.2f}  {where}")


if __name__ == "__main__":
    main()
