"""summary.json from the job's collected rows (no Spark here); see docs/mesh-health.md."""

from __future__ import annotations

from typing import Any

from spark_federation import exports
from spark_federation.params import JobConfig


def overall_availability(hourly: list[dict[str, Any]]) -> dict[str, float]:
    """Per node, windows up over windows analysed across all its hours (nodes without an
    analysed window are left out)."""
    up: dict[str, int] = {}
    total: dict[str, int] = {}
    for r in hourly:
        up[r["node"]] = up.get(r["node"], 0) + int(r["windows_up"] or 0)
        total[r["node"]] = total.get(r["node"], 0) + int(r["windows"] or 0)
    return {n: up[n] / total[n] for n in total if total[n]}


def _catch_up_summary(collected: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """summary.json ``catch_up``: backlog receives, apart from live propagation (None
    without traces)."""
    split = collected.get("trace_split")
    if not split:
        return None
    [counts] = split
    [total] = collected.get("catch_up_all") or [{"p50_ms": None, "p99_ms": None, "max_ms": None}]

    def ms(v: Any) -> float | None:
        return None if v is None else round(float(v), 1)

    return {
        "messages": counts["catch_up"],
        "p50_ms": ms(total["p50_ms"]),
        "p99_ms": ms(total["p99_ms"]),
        "max_ms": ms(total["max_ms"]),
        "nodes": {r["node"]: r["messages"] for r in collected["catch_up"]},
        "live_messages": counts["live"],
        "inferred": counts["inferred"],
    }


def summary(
    cfg: JobConfig,
    *,
    counts: dict[str, int],
    side_counts: dict[str, dict[str, int] | None],
    files: exports.ExportFiles,
    sizes: tuple[int, int],
    span: tuple[int, int],
    overall: dict[str, float],
    collected: dict[str, list[dict[str, Any]]],
    names: dict[str, str],
    tables: list[str],
) -> dict[str, Any]:
    """summary.json (spec §10 fields first, then what this job adds); see docs/mesh-health.md."""
    return {
        "records": counts["records"],
        "skipped": counts["skipped"],
        "duplicates": counts["duplicates"],
        "out_of_range": counts["out_of_range"],
        "nodes": sizes[0],
        "links": sizes[1],
        "window_s": cfg.window_ms // 1000,
        "span": {"start_ms": span[0], "end_ms": span[1]},
        "availability": availability(overall),
        "outages": outages(collected["outages"]),
        "partitions": partitions(collected["events"]),
        "flapping_links": sorted(
            (
                {"node": min(f["a"], f["b"]), "peer": max(f["a"], f["b"]), "flaps": f["flaps"]}
                for f in collected["flapping"]
            ),
            key=lambda f: (f["node"], f["peer"]),
        ),
        "relays": sorted(r["node"] for r in collected["relays"] if r["is_relay"]),
        "relay_only_nodes": sorted(r["node"] for r in collected["relays"] if r["relay_only"]),
        "clock_skew_ms": {
            r["node"]: round(float(r["skew_ms"]), 1)
            for r in sorted(collected["skew"], key=lambda r: r["node"])
        },
        "skewed_nodes": sorted(r["node"] for r in collected["skew"] if r["skewed"]),
        "propagation": [
            {
                "hops": p["hops"],
                "messages": p["messages"],
                "p50_ms": round(float(p["p50_ms"]), 1),
                "p99_ms": round(float(p["p99_ms"]), 1),
            }
            for p in collected["propagation"]
        ],
        "catch_up": _catch_up_summary(collected),
        "inputs": {
            "exports": len(files.exports),
            "files": {k: files.count(k) for k in exports.KINDS},
            "beacons": side_counts["beacons"],
            "traces": side_counts["traces"],
        },
        "names": dict(sorted(names.items())),
        "tables": tables,
        "thresholds": {
            "flap_per_hour": cfg.thresholds.flap_threshold,
            "skew_ms": cfg.thresholds.skew_threshold_ms,
        },
    }


def outages(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """summary.json ``outages`` from node_outages' rows."""
    return [{"node": d["node"], "start_ms": d["start_ms"], "end_ms": d["end_ms"]} for d in rows]


def partitions(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """summary.json ``partitions`` from partition_events' rows."""
    return [
        {
            "start_ms": e["start_ms"],
            "end_ms": e["end_ms"],
            "components": e["components"],
            "sizes": list(e["sizes"]),
        }
        for e in events
    ]


def availability(overall: dict[str, float]) -> dict[str, float]:
    """summary.json ``availability`` from :func:`overall_availability`."""
    return {k: round(v, 4) for k, v in sorted(overall.items())}
