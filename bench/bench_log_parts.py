"""Where the CPU of a publish through the log goes: the writer thread's pieces apart.

Runs ``bench_publish_cost.measure_log`` (``MessageLog.publish`` for batches of
``--batch`` publishes until each is committed) with thread CPU timers
(``time.thread_time``) wrapped around the writer thread's pieces: the whole commit job
(``logcommit.write_batch``), signing (``logcommit.sign_local``: JCS, leaf hashes, the
tree, one ed25519 signature per batch, the ``Message`` objects) and the SQLite
transaction (``logcommit.transaction``: insert and commit). What the process spent
beyond the commit job is the event loop (``publish()``, answering the futures, the
bench's ``gather``) and the hand-over between the threads.

Run: python -m bench.bench_log_parts [--messages 20000 --batch 125 --sync full,normal --runs 3
     --await gather]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from bench.bench_publish_cost import AWAIT_MODES, measure_log
from bench.common import save
from hearthnet.identity import KeyPair
from hearthnet.pubsub import log as log_module
from hearthnet.pubsub import logcommit

PIECES = ("write_batch", "sign_local", "transaction")


def _timed(fn: Callable[..., Any], spent: dict[str, float], name: str) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.thread_time() - t0

    return wrapper


# Where each piece is looked up when the commit job runs: log.py calls write_batch, and
# write_batch calls sign_local and transaction, by their module's global names.
_HOOKS = ((log_module, "write_batch"), (logcommit, "sign_local"), (logcommit, "transaction"))


@contextmanager
def timers() -> Iterator[dict[str, float]]:
    """Thread CPU seconds spent in each of :data:`PIECES` while the block runs."""
    spent = dict.fromkeys(PIECES, 0.0)
    saved = [getattr(module, name) for module, name in _HOOKS]
    for (module, name), fn in zip(_HOOKS, saved, strict=True):
        setattr(module, name, _timed(fn, spent, name))
    try:
        yield spent
    finally:
        for (module, name), fn in zip(_HOOKS, saved, strict=True):
            setattr(module, name, fn)


async def measure(sync: str, count: int, batch: int, mode: str = "gather") -> dict[str, float]:
    """One run: CPU µs per message, in all and per piece (``mode``: how each batch is
    awaited, see ``bench_publish_cost.measure_log``)."""
    with timers() as spent:
        row = await measure_log(KeyPair.generate(), sync, count, batch, mode=mode)
    committed = row["messages"] + batch  # measure_log commits one batch before timing
    job, sign, sql = (spent[p] / committed * 1e6 for p in PIECES)
    total = float(row["cpu_us_per_message"])
    return {
        "total": total,
        "event_loop_and_hand_over": total - job,
        "sign": sign,
        "sqlite": sql,
        "writer_rest": job - sign - sql,
    }


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"messages": opts.messages, "batch": opts.batch, "sync": {}}
    for sync in opts.sync:
        runs = [await measure(sync, opts.messages, opts.batch, opts.mode) for _ in range(opts.runs)]
        medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        out["sync"][sync] = {"median": medians, "runs": runs}
        print(
            f"sync={sync}: {medians['total']:.1f} µs CPU per message = event loop and "
            f"hand-over {medians['event_loop_and_hand_over']:.1f} + signing "
            f"{medians['sign']:.1f} + SQLite {medians['sqlite']:.1f} + rest of the commit "
            f"job {medians['writer_rest']:.1f} (median of {opts.runs})"
        )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=20_000, help="per run")
    p.add_argument("--batch", type=int, default=125, help="publishes committed together")
    p.add_argument("--sync", default="full,normal", help="comma list: full, normal")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument(
        "--await",
        dest="mode",
        default="gather",
        choices=AWAIT_MODES,
        help="how each batch is awaited (bench_publish_cost --await)",
    )
    p.add_argument("--name", default="log_parts")
    opts = p.parse_args()
    opts.sync = [s.strip() for s in opts.sync.split(",") if s.strip()]
    for s in opts.sync:
        if s not in ("full", "normal"):
            p.error(f"--sync: {s!r} is not full or normal")
    if opts.messages < 1 or opts.batch < 1 or opts.runs < 1:
        p.error("--messages, --batch and --runs must be at least 1")
    save(opts.name, asyncio.run(run(opts)))


if __name__ == "__main__":
    main()
