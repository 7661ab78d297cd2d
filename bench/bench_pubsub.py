"""Pub/sub fan-out benchmark (spec §11, issues 3 and 17): HearthNet against nats-server
(core, and JetStream for durable publish) and Mosquitto, in the same run, with the same
Node.js load generator (bench/fanout/loadgen.mjs).

Scenarios, for every server (interleaved: each scenario runs against all servers before
the next scenario starts, so a change in the machine's background load hits all alike):

- throughput: 1 publisher -> 100 and -> 1,000 subscribers over WebSocket, 256-byte
  payloads; the publisher runs as fast as the server accepts (bounded outstanding publish
  acks) and at most ``--lead`` messages ahead of the slowest live subscriber, so every
  counted delivery really happened; deliveries/s over the steady part (after a warm-up);
- latency: publish at 2,000 msg/s to 100 subscribers; publish->deliver p50/p99/max;
- durable: 1 publisher -> 1 durable consumer, the publisher waiting for each publish's
  ack (1 in flight) and pipelining (``--durable-outstanding``, default 1 and 256):
  HearthNet's log against NATS JetStream (file storage, acknowledged publishes, a durable
  push consumer acking every half window); messages/s and server CPU per message;
- idle: N subscribed connections held; server RSS per 1,000 (HearthNet: 20,000 in the
  full run, capped by this process's open-file hard limit);
- history (HearthNet only): GET .../history?limit=100 after publishing 100 messages.

Measured from outside: server CPU (``/proc/PID/stat``) over the same steady window as the
deliveries, hence server CPU time per delivery; server RSS; the load generator's CPU
(whole process and its busiest thread, to show it was not the bottleneck); the CPU that
other processes on the machine used meanwhile; delivered vs expected per subscriber,
gaps, drops and disconnects (reported, never hidden).

Fairness: the same load generator, payload, subscriber count and pacing for every
server; HearthNet with acks on (window 1,024, ack every 512) and durable publish (the
default ``sync=full``), MQTT QoS 0, plain NATS core for fan-out. HearthNet clients are
token clients (``hearthnet token issue``), as applications are; ``hearthnet`` gets JSON
frames, ``hearthnet-cbor`` the same node over the CBOR subprotocol, ``hearthnet-sig`` the
same node with subscribers that ask for ``sig``, ``hearthnet-node`` the same node with
clients that authenticate as the node itself, ``hearthnet-normal`` a node with
``sync=normal``.

Durability (the durable scenario): each server's ack promises something different, and
the report says what (``DURABILITY`` in bench/pubsub_targets.py) and gives each HearthNet
server's ratio to the server that promises the same (``LIKE_FOR_LIKE``).
``hearthnet`` (``sync=full``) fsyncs SQLite's WAL before each ack: it survives a power
cut; its peer is ``jetstream-sync`` (``sync_interval: always``, an fsync before each
PubAck), which needs nats-server 2.10+ and is left out, with a note, on 2.9 (Debian 12's
2.9.10 has no such setting). ``hearthnet-normal`` writes the WAL without an fsync before
each ack, as ``jetstream`` (the default) writes its block file and fsyncs every 2
minutes: both survive kill -9 but not a power cut; that pair is the like-for-like row.

Run: python -m bench.bench_pubsub            (full; about 15 minutes)
     python -m bench.bench_pubsub --quick    (smoke run; about 3 minutes)
Writes bench/results/pubsub.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import proc_rss_mb, save
from bench.loadgen import (
    Loadgen,
    LoadgenError,
    RssPeak,
    Snapshot,
    ensure_loadgen,
    loadgen_thread_shares,
    timeline,
)
from bench.pubsub_idle import history_run, run_idle
from bench.pubsub_report import like_for_like, median_index, round_ratios, table
from bench.pubsub_targets import (
    DEFAULT_SERVERS,
    DURABILITY,
    DURABLE_SERVERS,
    FANOUT_SERVERS,
    LIKE_FOR_LIKE,
    NODE_ENV,
    SERVERS,
    Target,
    hearthnet_auth_file,
    start_targets,
)
from bench.servers import (
    MissingTool,
    jetstream_sync_missing,
    require,
    system_instances,
)

REFERENCE = {"throughput": "nats", "latency": "nats", "durable": "jetstream"}
SETTINGS = (
    "duration", "warmup", "repeat", "rate", "latency_subs", "payload", "lead", "outstanding",
    "workers", "client", "drain", "idle_hold", "connect_concurrency", "pause_subs",
    "hearthnet_auth", "verify", "durable_outstanding", "durable_lead",
)  # fmt: skip


@dataclass
class Scenario:
    """One fan-out run's parameters."""

    mode: str  # throughput | latency | durable (throughput through a durable consumer)
    subs: int
    duration_s: float
    warmup_s: float
    rate: int = 0
    outstanding: int | None = None  # publishes in flight (None: --outstanding)
    lead: int | None = None  # None: --lead

    @property
    def servers(self) -> tuple[str, ...]:
        """The servers this scenario runs against."""
        return DURABLE_SERVERS if self.mode == "durable" else FANOUT_SERVERS


def fanout_run(
    target: Target, sc: Scenario, opts: argparse.Namespace, workdir: Path, run_no: int
) -> dict[str, Any]:
    """One throughput, latency or durable run against one server; everything measured."""
    topic = f"bench.{'durable' if sc.mode == 'durable' else 'fanout'}.r{run_no}"
    args = [
        "--proto", target.proto,
        "--url", target.ws_url,
        "--mode", "latency" if sc.mode == "latency" else "throughput",
        "--subs", str(sc.subs),
        "--workers", str(opts.workers),
        "--client", opts.client,
        "--topic", topic,
        "--payload", str(opts.payload),
        "--duration", str(sc.duration_s),
        "--warmup", str(sc.warmup_s),
        "--lead", str(opts.lead if sc.lead is None else sc.lead),
        "--outstanding", str(opts.outstanding if sc.outstanding is None else sc.outstanding),
        "--window", str(opts.window),
        "--drain", str(opts.drain),
        "--pause-subs", str(opts.pause_subs),
    ]  # fmt: skip
    if sc.mode == "latency":
        args += ["--rate", str(sc.rate)]
    if sc.mode == "durable":
        args += ["--consumer", f"bench-r{run_no}"]
    auth: Path | None = None
    if target.hearthnet:
        auth = hearthnet_auth_file(target, sc.subs, workdir, target.auth(opts.hearthnet_auth))
        args += ["--auth", str(auth), "--form", target.form]
        if opts.verify or target.verify:
            args += ["--verify", "1"]
        if target.fields:
            args += ["--fields", target.fields]
    timeout = sc.warmup_s + sc.duration_s + opts.drain + 60 + sc.subs / 50
    load1 = os.getloadavg()[0]
    rss0 = proc_rss_mb(target.pid)
    lg = Loadgen(args, timeout, workdir, opts.loadgen_profile)
    snaps: dict[str, Snapshot] = {}
    result: dict[str, Any] | None = None
    try:
        with RssPeak(target.pid) as peak:
            while result is None:
                event = lg.next_event()
                kind = event.get("event")
                if kind == "ready":
                    if event["failed"]:
                        print(f"  ! {event['failed']} subscribers failed: {event['fail_reasons']}")
                elif kind in ("steady_start", "steady_end"):
                    snaps[kind] = Snapshot.take(target.pid, lg.pid)
                elif kind == "done":
                    result = event["result"]
    finally:
        lg.close()
        if auth is not None:
            auth.unlink(missing_ok=True)
    if not target.alive():
        raise LoadgenError(f"{target.name} died during the run")
    a, b = snaps["steady_start"], snaps["steady_end"]
    wall = b.t - a.t
    steady = result["steady"]
    deliveries = steady["deliveries"]
    server_cpu = b.server_cpu - a.server_cpu
    threads = loadgen_thread_shares(a.loadgen_threads, b.loadgen_threads, wall)
    loadgen_cores = sum(t["cores"] for t in threads)
    busy = (b.machine_busy - a.machine_busy) / wall
    out = {
        "server": target.name,
        "mode": sc.mode,
        "subscribers": sc.subs,
        "outstanding": opts.outstanding if sc.outstanding is None else sc.outstanding,
        "rate": sc.rate or None,
        "load1_before": round(load1, 2),
        "deliveries_per_s": round(steady["deliveries_per_s"]),
        "publish_per_s": round(steady["publish_per_s"]),
        "server_cpu_cores": round(server_cpu / wall, 3),
        "server_cpu_us_per_delivery": round(server_cpu / deliveries * 1e6, 3)
        if deliveries
        else None,
        # system calls of the server in the steady window (reads: client frames; writes:
        # frames out, one per subscriber per flush), per delivery and per publish
        "server_writes_per_delivery": round(
            (b.server_syscalls[1] - a.server_syscalls[1]) / deliveries, 4
        )
        if deliveries
        else None,
        "server_syscalls_per_publish": [
            round((b.server_syscalls[i] - a.server_syscalls[i]) / steady["published"], 2)
            if steady.get("published")
            else None
            for i in (0, 1)
        ],
        "server_cpu_kernel_share": round((b.server_sys - a.server_sys) / server_cpu, 3)
        if server_cpu > 0
        else None,
        # where the server's CPU goes, per published message (µs): its main thread in user
        # and kernel mode (the node's event loop: the writes to subscribers are most of its
        # kernel time) and its other threads (the log's writer); /proc's ticks, 10 ms each
        "server_us_per_publish_loop_user_sys_other": [
            round((b.server_threads[i] - a.server_threads[i]) / steady["published"] * 1e6, 1)
            for i in (0, 1, 2)
        ]
        if steady.get("published")
        else None,
        # context switches per published message: the event loop's thread, then the
        # others (a thread switches out when it waits for the GIL, a lock or a queue)
        "server_switches_per_publish_loop_other": [
            round((b.server_switches[i] - a.server_switches[i]) / steady["published"], 2)
            for i in (0, 1)
        ]
        if steady.get("published")
        else None,
        "server_rss_mb_before": round(rss0, 1),
        "server_rss_mb_peak": round(peak.peak, 1),
        "loadgen_cpu_cores": round(loadgen_cores, 3),
        # the generator shares the machine's cores with the server: on a busy 2-core
        # machine, deliveries/s <= cores / (server + generator CPU per delivery)
        "loadgen_cpu_us_per_delivery": round(loadgen_cores * wall / deliveries * 1e6, 3)
        if deliveries
        else None,
        "loadgen_busiest_thread": threads[0] if threads else None,
        "loadgen_threads": " ".join(f"{t['name']}:{t['cores']}" for t in threads[:8]),
        "other_processes_cpu_cores": round(max(0.0, busy - server_cpu / wall - loadgen_cores), 3),
        "published": result["published"],
        "delivered": result["delivered_total"],
        "expected": result["expected_total"],
        "subscribers_complete": result["subscribers_complete"],
        "missing": result["missing_by_index"],
        "gap_messages": result["gap_messages"],
        "subscribers_closed": result["subscribers_closed"],
        "close_codes": result["close_codes"],
        "connect_failed": result["connect_failed"],
        "publish_errors": result["publish_errors"],
        "publisher_fail_reasons": result["publisher_fail_reasons"],
        "publisher_closed": result["publisher_closed"],
        "latency_ms": {
            k: (round(v, 3) if v is not None else None) for k, v in result["latency_ms"].items()
        },
        "publisher_max_behind_ms": result["publisher_max_behind_ms"],
        # publish -> ack round trips sent in the steady window (protocols acking each one)
        "publish_ack_ms": result.get("publish_ack_ms"),
        "drain_s": round(result["drain_s"], 3),
        "setup_s": round(result["setup_s"], 3),
        "duplicates_or_reordered": result["duplicates_or_reordered"],
        "subscriber_errors": result["subscriber_errors"],
        "subscriber_fail_reasons": result["subscriber_fail_reasons"],
        "per_subscriber_min_max": [result["per_subscriber_min"], result["per_subscriber_max"]],
        "loadgen_workers": result["workers"],
        "paused_subscribers": result["paused_subscribers"],
        "timeline": timeline(result["series_ms_delivered_published"]),
    }
    out["lossless"] = (
        out["delivered"] == out["expected"]
        and out["missing"] == 0
        and out["subscribers_closed"] == 0
        and out["connect_failed"] == 0
    )
    return out


# --- the whole run ---------------------------------------------------------------------


def raise_open_files() -> int:
    """Raise this process's (and so its children's) open-file limit to the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else 1 << 20
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Options (defaults: the full run; --quick shrinks durations and counts)."""
    p = argparse.ArgumentParser(
        prog="python -m bench.bench_pubsub", description=__doc__.splitlines()[0]
    )
    p.add_argument("--quick", action="store_true", help="short smoke run (about 3 minutes)")
    p.add_argument(
        "--servers",
        default=",".join(DEFAULT_SERVERS),
        help=f"comma list of servers, of: {', '.join(SERVERS)}",
    )
    p.add_argument("--subs", default="100,1000", help="throughput subscriber counts")
    p.add_argument("--duration", type=float, help="steady seconds per run (full 10, quick 3)")
    p.add_argument("--warmup", type=float, help="warm-up seconds per run (full 3, quick 1)")
    p.add_argument("--repeat", type=int, help="runs per scenario, median kept (full 3, quick 1)")
    p.add_argument("--rate", type=int, default=2000, help="latency scenario publish rate")
    p.add_argument("--latency-subs", type=int, default=100)
    p.add_argument("--payload", type=int, default=256, help="payload bytes")
    p.add_argument(
        "--lead",
        type=int,
        default=1000,
        help="max messages the publisher runs ahead of the slowest subscriber (0: open loop)",
    )
    p.add_argument("--outstanding", type=int, default=256, help="max unacknowledged publishes")
    p.add_argument(
        "--window",
        type=int,
        default=1024,
        help="HearthNet subscriber flow-control window (spec default 1024; acks every half)",
    )
    p.add_argument("--workers", type=int, default=2, help="load generator subscriber threads")
    p.add_argument(
        "--client",
        choices=("lean", "ws"),
        default="lean",
        help="load generator WebSocket client: lean (frames parsed per TCP chunk) or ws",
    )
    p.add_argument(
        "--loadgen-profile",
        type=Path,
        help="write V8 CPU profiles of the load generator (every thread) into this directory",
    )
    p.add_argument(
        "--pause-subs",
        type=int,
        default=0,
        help="diagnostic: this many subscribers stop reading while publishing (loss handling)",
    )
    p.add_argument("--drain", type=float, default=10.0, help="max seconds to wait for stragglers")
    p.add_argument(
        "--idle", type=int, help="idle connections (full 20000, quick 1000; capped by fd limit)"
    )
    p.add_argument("--idle-servers", default="hearthnet,nats,mosquitto")
    p.add_argument("--idle-hold", type=float, default=5.0, help="seconds idle connections are held")
    p.add_argument("--connect-concurrency", type=int, default=100)
    p.add_argument("--history-repeats", type=int, help="history requests (full 200, quick 30)")
    p.add_argument(
        "--durable-outstanding",
        default="1,256",
        help="durable 1->1 scenario: publishes in flight, one run per value (1: wait for each ack)",
    )
    p.add_argument(
        "--durable-lead",
        type=int,
        default=512,
        help="durable scenario: max messages ahead of the consumer (JetStream's stream keeps "
        "1,000 per subject, as the node does)",
    )
    p.add_argument(
        "--hearthnet-auth",
        choices=("token", "node"),
        default="token",
        help="HearthNet clients: token clients (default, as applications are) or the node's "
        "own identity (no token checks, no publish rate limit)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="HearthNet subscribers ask to verify (verify: true): frames carry sig",
    )
    p.add_argument(
        "--skip", default="", help="comma list of: throughput,latency,durable,idle,history"
    )
    p.add_argument("--name", default="pubsub", help="results file name under bench/results/")
    args = p.parse_args(argv)
    q = args.quick
    args.duration = args.duration or (3.0 if q else 10.0)
    args.warmup = args.warmup if args.warmup is not None else (1.0 if q else 3.0)
    args.repeat = args.repeat or (1 if q else 3)
    args.idle = args.idle if args.idle is not None else (1000 if q else 20000)
    args.history_repeats = args.history_repeats or (30 if q else 200)
    return args


def fanout_scenarios(opts: argparse.Namespace, skip: set[str]) -> list[tuple[str, Scenario]]:
    """The throughput and latency scenarios asked for."""
    scenarios: list[tuple[str, Scenario]] = []
    if "throughput" not in skip:
        for subs in (int(x) for x in opts.subs.split(",") if x):
            sc = Scenario("throughput", subs, opts.duration, opts.warmup)
            scenarios.append((f"throughput 1→{subs:,}", sc))
    if "latency" not in skip:
        sc = Scenario("latency", opts.latency_subs, opts.duration, opts.warmup, opts.rate)
        scenarios.append((f"latency {opts.rate:,} msg/s 1→{opts.latency_subs:,}", sc))
    if "durable" not in skip:
        for n in (int(x) for x in opts.durable_outstanding.split(",") if x):
            sc = Scenario(
                "durable", 1, opts.duration, opts.warmup, outstanding=n, lead=opts.durable_lead
            )
            scenarios.append((f"durable 1→1, {n} in flight", sc))
    return scenarios


def run_fanout(
    targets: dict[str, Target],
    scenarios: list[tuple[str, Scenario]],
    opts: argparse.Namespace,
    workdir: Path,
    result: dict[str, Any],
) -> None:
    """Each scenario against every server it applies to, in turn, ``opts.repeat`` rounds;
    the order is reversed every other round, so a drift in the machine's load does not
    always favour the same server. Ratios to the scenario's reference peer are also taken
    within each round (the servers of one round ran minutes apart at most)."""
    run_no = 0
    for key, sc in scenarios:
        names = [n for n in targets if n in sc.servers]
        if not names:
            continue
        runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
        rounds: list[dict[str, dict[str, Any]]] = []
        for rep in range(opts.repeat):
            rounds.append({})
            for name in names if rep % 2 == 0 else names[::-1]:
                target = targets[name]
                run_no += 1
                print(f"{key} [{rep + 1}/{opts.repeat}] {name} ...", flush=True)
                try:
                    r = fanout_run(target, sc, opts, workdir, run_no)
                except LoadgenError as exc:
                    print(f"  ! {name}: {exc}")
                    result["notes"].append(f"{key} {name} run {rep + 1}: {exc}")
                    if not target.alive():
                        raise
                    continue
                runs[name].append(r)
                rounds[-1][name] = r
                lat = r["latency_ms"]
                print(
                    f"  {r['deliveries_per_s']:,}/s  server {r['server_cpu_cores']:.2f} cores "
                    f"{r['server_cpu_us_per_delivery']} µs/delivery  loadgen "
                    f"{r['loadgen_cpu_cores']:.2f} cores (busiest thread "
                    f"{(r['loadgen_busiest_thread'] or {}).get('cores')})  others "
                    f"{r['other_processes_cpu_cores']:.2f}  "
                    f"syscalls per publish (r, w) {r['server_syscalls_per_publish']}, kernel "
                    f"{r['server_cpu_kernel_share']} of server CPU, µs per publish (main "
                    f"thread user, system; other threads) "
                    f"{r['server_us_per_publish_loop_user_sys_other']}, context switches "
                    f"per publish (main, other) {r['server_switches_per_publish_loop_other']}  "
                    f"p50 {lat.get('50')} p99 {lat.get('99')} ms  "
                    f"publish->ack p50 / p99 {_ack_ms(r)} ms  "
                    f"{'lossless' if r['lossless'] else 'LOSS: ' + _loss(r)}",
                    flush=True,
                )
                if r["paused_subscribers"]["count"]:
                    print(f"  paused subscribers: {r['paused_subscribers']}", flush=True)
        result["fanout"][key] = {
            "scenario": sc.__dict__,
            "runs": runs,
            "median_run": {n: median_index(rs) for n, rs in runs.items() if rs},
            "round_ratios": round_ratios(rounds, REFERENCE[sc.mode]),
        }
        if sc.mode == "durable":
            result["fanout"][key]["like_for_like"] = like_for_like(rounds, LIKE_FOR_LIKE)


def main(argv: list[str] | None = None) -> None:
    """Run everything and write bench/results/pubsub.json."""
    opts = parse_args(argv)
    servers = [s for s in opts.servers.split(",") if s]
    skip = set(opts.skip.split(",")) - {""}
    for s in servers:
        if s not in SERVERS:
            raise SystemExit(f"unknown server {s!r}; choose from {', '.join(SERVERS)}")
    try:
        node_version = ensure_loadgen()
        for s in servers:
            if not s.startswith("hearthnet"):
                require("mosquitto" if s == "mosquitto" else "nats-server")
    except MissingTool as exc:
        raise SystemExit(f"bench_pubsub: {exc}") from None
    notes = []
    if "jetstream-sync" in servers and (missing := jetstream_sync_missing(require("nats-server"))):
        servers.remove("jetstream-sync")  # the runs with `full` then have no like-for-like peer
        notes.append(f"jetstream-sync not run: {missing}")
        print("note:", notes[-1])
    nofile = raise_open_files()
    foreign = system_instances()
    if foreign:
        print(f"note: other broker processes are running (not ours, left alone): {foreign}")
    idle_n = opts.idle
    if idle_n > nofile - 200:
        notes.append(
            f"{idle_n} idle connections asked; capped to {nofile - 200} by the open-file hard "
            f"limit ({nofile}) of this machine"
        )
        idle_n = nofile - 200
        print("note:", notes[-1])

    workdir = Path(tempfile.mkdtemp(prefix="bench-pubsub-"))
    targets: dict[str, Target] = {}
    result: dict[str, Any] = {
        "command": " ".join(
            ["python -m bench.bench_pubsub", *(sys.argv[1:] if argv is None else argv)]
        ),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
        "node": node_version,
        "open_files_limit": nofile,
        "settings": {k: getattr(opts, k) for k in SETTINGS},
        "hearthnet_env": NODE_ENV,
        "versions": {},
        "durability": {n: DURABILITY[n] for n in servers if n in DURABILITY},
        "fanout": {},
        "history": None,
        "idle": [],
        "notes": notes,
    }
    try:
        scenarios = fanout_scenarios(opts, skip)
        want_history = "history" not in skip and "hearthnet" in servers
        wanted = {n for _, sc in scenarios for n in sc.servers} | (
            {"hearthnet"} if want_history else set()
        )
        targets.update(start_targets([n for n in servers if n in wanted]))
        for name, t in targets.items():
            result["versions"][name] = t.version
            print(f"started {name} ({t.version}) pid {t.pid} at {t.ws_url}")
        run_fanout(targets, scenarios, opts, workdir, result)
        if want_history:
            print("history replay ...", flush=True)
            result["history"] = history_run(targets["hearthnet"], opts.history_repeats)
            print(f"  p50 {result['history']['p50_ms']} ms", flush=True)
        for target in targets.values():
            target.stop()
        targets.clear()
        if "idle" not in skip:
            names = [s for s in opts.idle_servers.split(",") if s in servers]
            run_idle(names, idle_n, opts, workdir, result)
    finally:
        for target in targets.values():
            try:
                target.stop()
            except Exception as exc:  # keep stopping the others
                print(f"stopping {target.name}: {exc}")
        shutil.rmtree(workdir, ignore_errors=True)
    result["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    result["table"] = table(result)
    save(opts.name, result)
    print()
    print(result["table"])


def _ack_ms(r: dict[str, Any]) -> str:
    ack = r.get("publish_ack_ms")
    if not ack:
        return "–"
    return f"{ack['50']:.3f} / {ack['99']:.3f}"


def _loss(r: dict[str, Any]) -> str:
    parts = [f"{r['delivered']:,}/{r['expected']:,} delivered"]
    for k in ("missing", "gap_messages", "subscribers_closed", "connect_failed", "publish_errors"):
        if r[k]:
            parts.append(f"{k}={r[k]}")
    if r["publisher_closed"]:
        parts.append(f"publisher closed: {r['publisher_closed']}")
    return ", ".join(parts)


if __name__ == "__main__":
    main()
