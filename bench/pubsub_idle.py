"""The pub/sub benchmark's idle and history scenarios (``bench_pubsub``): N subscribed
connections held (server RSS and CPU per 1,000), and a history page of 100 messages read
back with the signed Python client.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

from bench.common import percentile, proc_rss_mb
from bench.loadgen import Loadgen, LoadgenError, tree_cpu_s
from bench.pubsub_targets import Target, hearthnet_token_file, start_target
from hearthnet.client import Client
from hearthnet.identity import load_or_create_keys


def idle_run(target: Target, n: int, opts: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Open ``n`` subscribed connections, hold them, measure the server's RSS and CPU."""
    args = [
        "--proto", target.proto,
        "--url", target.ws_url,
        "--mode", "idle",
        "--subs", str(n),
        "--workers", str(opts.workers),
        "--client", opts.client,
        "--topic", "bench.idle",
        "--connect-concurrency", str(opts.connect_concurrency),
        "--hold", str(opts.idle_hold + 120),
    ]  # fmt: skip
    auth: Path | None = None
    if target.hearthnet:
        auth = hearthnet_token_file(target, workdir)
        args += ["--auth", str(auth)]
    rss_before = proc_rss_mb(target.pid)
    cpu_before = tree_cpu_s(target.pid)
    load1 = os.getloadavg()[0]
    lg = Loadgen(args, opts.idle_hold + 240 + n / 100, workdir, opts.loadgen_profile)
    result: dict[str, Any] | None = None
    try:
        ready = lg.next_event()
        if ready.get("event") != "ready":
            raise LoadgenError(f"unexpected event {ready}")
        setup_cpu = tree_cpu_s(target.pid) - cpu_before
        time.sleep(2)  # let the server settle
        t0, c0 = time.monotonic(), tree_cpu_s(target.pid)
        time.sleep(opts.idle_hold)
        hold_cpu = (tree_cpu_s(target.pid) - c0) / (time.monotonic() - t0)
        rss_held = proc_rss_mb(target.pid)
        lg.send("stop")
        while result is None:
            event = lg.next_event()
            if event.get("event") == "done":
                result = event["result"]
    finally:
        lg.close()
        if auth is not None:
            auth.unlink(missing_ok=True)
    connected = result["connected"]
    return {
        "server": target.name,
        "requested": n,
        "connected": connected,
        "connect_failed": result["connect_failed"],
        "fail_reasons": result["fail_reasons"],
        "closed_while_held": result["closed_while_held"],
        "load1_before": round(load1, 2),
        "setup_s": round(result["setup_s"], 2),
        "connections_per_s": round(connected / result["setup_s"]) if result["setup_s"] else None,
        "server_cpu_s_setup": round(setup_cpu, 2),
        "server_cpu_cores_held": round(hold_cpu, 4),
        "server_rss_mb_before": round(rss_before, 1),
        "server_rss_mb_held": round(rss_held, 1),
        "rss_mb_per_1000": (
            round((rss_held - rss_before) / connected * 1000, 2) if connected else None
        ),
        "loadgen_cpu_s_hold": round(result["loadgen_cpu_s_hold"], 3),
    }


def history_run(target: Target, repeats: int) -> dict[str, Any]:
    """Publish 100 messages, then time GET /history?limit=100 (signed, keep-alive)."""
    keys = load_or_create_keys(target.node.data_dir)
    payload = "@@" + "0" * 15 + ":" + "0" * 10 + ":"
    payload += "x" * (256 - len(payload))

    async def go() -> dict[str, Any]:
        async with Client(target.node.url, keys=keys) as client:
            topic = f"bench.history.t{time.monotonic_ns()}"
            for _ in range(100):
                await client.publish(topic, "bench", payload)
            times = []
            count = 0
            for _ in range(repeats):
                t0 = time.perf_counter()
                page = await client.history(topic, limit=100)
                times.append((time.perf_counter() - t0) * 1000)
                count = len(page["messages"])
            return {
                "server": target.name,
                "messages": count,
                "repeats": repeats,
                "p50_ms": round(statistics.median(times), 2),
                "p99_ms": round(percentile(times, 99), 2),
                "first_ms": round(times[0], 2),
            }

    return asyncio.run(go())


def run_idle(
    names: list[str], n: int, opts: argparse.Namespace, workdir: Path, result: dict[str, Any]
) -> None:
    """Idle connections, each server freshly started (so its baseline RSS is its own)."""
    for name in names:
        print(f"idle {n:,} connections {name} ...", flush=True)
        target = start_target(name)
        try:
            time.sleep(1)
            r = idle_run(target, n, opts, workdir)
        except LoadgenError as exc:
            print(f"  ! {name}: {exc}")
            result["notes"].append(f"idle {name}: {exc}")
            continue
        finally:
            target.stop()
        result["idle"].append(r)
        print(
            f"  {r['connected']:,} connected in {r['setup_s']} s; RSS "
            f"{r['server_rss_mb_before']} -> {r['server_rss_mb_held']} MiB "
            f"({r['rss_mb_per_1000']} MiB per 1,000)",
            flush=True,
        )
