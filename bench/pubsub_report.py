"""Reading the fan-out benchmark's results: the median run, ratios to the peer within
each round, and the Markdown tables for docs/benchmarks-log.md. Pure."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any


def median_index(runs: list[dict[str, Any]]) -> int:
    """Index of the median run: by deliveries/s for throughput runs, by p99 for latency runs
    (the lower middle one for even counts, i.e. the worse of the two)."""

    def key(i: int) -> float:
        r = runs[i]
        if r["mode"] == "latency":
            return -(r["latency_ms"].get("99") or float("inf"))
        return float(r["deliveries_per_s"])

    order = sorted(range(len(runs)), key=key)
    return order[(len(order) - 1) // 2]


def fmt(v: Any, nd: int = 0) -> str:
    """A number for the table."""
    if v is None:
        return "–"
    if isinstance(v, float) and nd:
        return f"{v:,.{nd}f}"
    return f"{round(v):,}" if isinstance(v, (int, float)) else str(v)


def table(result: dict[str, Any]) -> str:
    """The Markdown tables for docs/benchmarks-log.md."""
    lines: list[str] = []
    if result["fanout"]:
        lines += [
            "| scenario | server | deliveries/s | vs peer | server CPU µs/delivery | CPU vs peer "
            "| server CPU (cores) | loadgen CPU (cores; busiest thread) | other load (cores) "
            "| load avg | delivered/expected | p50 ms | p99 ms |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|",
        ]
    for key, sc in result["fanout"].items():
        best = {n: sc["runs"][n][i] for n, i in sc["median_run"].items()}
        ratios = sc.get("round_ratios", {})
        for server, r in best.items():
            mine = ratios.get(server, {})
            # a rate ratio for throughput and durable runs, the p99 ratio for latency runs
            rate = mine.get("p99_median" if r["mode"] == "latency" else "rate_median")
            cpu = mine.get("cpu_median")
            busiest = (r["loadgen_busiest_thread"] or {}).get("cores")
            # throughput runs queue up to --lead messages by design: their latency is not
            # publish->deliver at a given rate, so the table shows it for latency runs only
            lat = r["latency_ms"] if r["mode"] == "latency" else {}
            delivered = f"{r['delivered']:,}/{r['expected']:,}"
            if r["gap_messages"]:
                delivered += f" ({r['gap_messages']:,} in gaps)"
            if r["subscribers_closed"]:
                delivered += f" ({r['subscribers_closed']} closed)"
            lines.append(
                f"| {key} | {server} | {fmt(r['deliveries_per_s'])} "
                f"| {'–' if rate is None else f'{rate:.2f}×'} "
                f"| {fmt(r['server_cpu_us_per_delivery'], 2)} "
                f"| {'–' if cpu is None else f'{cpu:.2f}×'} | {fmt(r['server_cpu_cores'], 2)} "
                f"| {fmt(r['loadgen_cpu_cores'], 2)}; {fmt(busiest, 2)} "
                f"| {fmt(r['other_processes_cpu_cores'], 2)} | {fmt(r['load1_before'], 1)} "
                f"| {delivered} | {fmt(lat.get('50'), 1)} | {fmt(lat.get('99'), 1)} |"
            )
    lines += durability_table(result)
    if result.get("idle"):
        lines += [
            *([""] if lines else []),
            "| idle connections | server | connected | setup s | RSS before MiB | RSS held MiB "
            "| MiB per 1,000 | server CPU held (cores) |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in result["idle"]:
            lines.append(
                f"| {r['requested']:,} | {r['server']} | {r['connected']:,} "
                f"| {fmt(r['setup_s'], 1)} "
                f"| {fmt(r['server_rss_mb_before'], 1)} | {fmt(r['server_rss_mb_held'], 1)} "
                f"| {fmt(r['rss_mb_per_1000'], 2)} | {fmt(r['server_cpu_cores_held'], 3)} |"
            )
    if result.get("history"):
        h = result["history"]
        lines += [
            *([""] if lines else []),
            "| history replay | messages | p50 ms | p99 ms | repeats |",
            "|---|---:|---:|---:|---:|",
            f"| hearthnet GET /history?limit=100 | {h['messages']} | {h['p50_ms']} "
            f"| {h['p99_ms']} | {h['repeats']} |",
        ]
    return "\n".join(lines)


def round_ratios(rounds: list[dict[str, dict[str, Any]]], ref: str) -> dict[str, Any]:
    """Per server, its ratio to ``ref`` within each round where both ran: deliveries/s,
    server CPU per delivery and p99 latency; and the median of each."""
    out: dict[str, Any] = {}
    keys: dict[str, Callable[[dict[str, Any]], float | None]] = {
        "rate": lambda r: r["deliveries_per_s"],
        "cpu": lambda r: r["server_cpu_us_per_delivery"],
        "p99": lambda r: r["latency_ms"].get("99"),
    }
    for name in {n for rnd in rounds for n in rnd}:
        per: dict[str, list[float]] = {k: [] for k in keys}
        for rnd in rounds:
            if name in rnd and ref in rnd:
                for k, get in keys.items():
                    a, b = get(rnd[name]), get(rnd[ref])
                    if a is not None and b:
                        per[k].append(round(a / b, 3))
        out[name] = {
            **{f"{k}_per_round": v for k, v in per.items()},
            **{f"{k}_median": (statistics.median(v) if v else None) for k, v in per.items()},
        }
    return out


def like_for_like(
    rounds: list[dict[str, dict[str, Any]]], peers: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """Per server with a peer in ``peers`` (the server whose acknowledgement promises the
    same durability): its messages/s, CPU per message and publish->ack p50 against that
    peer's, within each round where both ran, and their medians. The p50 ratio says what
    a round trip costs; messages/s at one in flight also carries the tail (preemption on
    a loaded machine)."""
    keys: dict[str, Callable[[dict[str, Any]], float | None]] = {
        "rate": lambda r: r["deliveries_per_s"],
        "cpu": lambda r: r["server_cpu_us_per_delivery"],
        "ack_p50": lambda r: (r.get("publish_ack_ms") or {}).get("50"),
    }
    out: dict[str, dict[str, Any]] = {}
    for name, peer in peers.items():
        per: dict[str, list[float]] = {k: [] for k in keys}
        for rnd in rounds:
            mine, theirs = rnd.get(name), rnd.get(peer)
            if mine is None or theirs is None:
                continue
            for k, get in keys.items():
                a, b = get(mine), get(theirs)
                if a is not None and b:
                    per[k].append(round(a / b, 3))
        if any(name in rnd for rnd in rounds):
            out[name] = {"peer": peer}
            for k, v in per.items():
                out[name][f"{k}_per_round"] = v
                out[name][f"{k}_median"] = statistics.median(v) if v else None
    return out


def durability_table(result: dict[str, Any]) -> list[str]:
    """The durable scenarios' table: what each server's acknowledgement promises, and the
    ratio to the server that promises the same (``–`` when that one did not run)."""
    durable = {k: sc for k, sc in result["fanout"].items() if sc["scenario"]["mode"] == "durable"}
    if not durable:
        return []
    said = result.get("durability", {})
    lines = [
        "",
        "| durable scenario | server | what an ack promises | like-for-like peer | msg/s "
        "| vs peer (msg/s) | vs peer (CPU/msg) | publish→ack p50 / p99 ms | vs peer (p50) |",
        "|---|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for key, sc in durable.items():
        pairs = sc.get("like_for_like", {})
        for server, i in sc["median_run"].items():
            r = sc["runs"][server][i]
            pair = pairs.get(server, {})
            ack = r.get("publish_ack_ms") or {}
            rate, cpu, p50 = (pair.get(f"{k}_median") for k in ("rate", "cpu", "ack_p50"))
            lines.append(
                f"| {key} | {server} | {said.get(server, '?')} | {pair.get('peer', '–')} "
                f"| {fmt(r['deliveries_per_s'])} | {_times(rate)} | {_times(cpu)} "
                f"| {fmt(ack.get('50'), 3)} / {fmt(ack.get('99'), 3)} | {_times(p50)} |"
            )
    return lines


def _times(ratio: float | None) -> str:
    return "–" if ratio is None else f"{ratio:.2f}×"
