"""Heartbeat and trace records on disk, and their export (spec §7.5) in both formats."""

from __future__ import annotations

import asyncio
import builtins
import gzip
import json
import sqlite3
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from hearthnet.clock import now_ms
from hearthnet.errors import ConfigError
from hearthnet.identity import KeyPair
from hearthnet.mesh.heartlog import HeartbeatLog, arrow_schema, export
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.logstore import pack_heads, split_bodies, unpack_heads

KEYS = KeyPair.from_seed(b"\x61" * 32)
PEER = KeyPair.from_seed(b"\x62" * 32).node_id
DAY_MS = 86_400_000


def write_records(data_dir: Path, ts: int) -> None:
    """One link's life (up, two pongs, a miss, down) and one trace, flushed to disk."""
    hlog = HeartbeatLog(data_dir, node=KEYS.node_id, community=KEYS.node_id, version="0.3.0")
    hlog.heartbeat(ts=ts, peer=PEER, kind="link_up", peers_linked=1)
    hlog.heartbeat(ts=ts + 5000, peer=PEER, kind="pong", seq=1, rtt_ms=0.8, clock_offset_ms=0)
    hlog.heartbeat(ts=ts + 10000, peer=PEER, kind="pong", seq=2, rtt_ms=1, clock_offset_ms=-2.5)
    hlog.heartbeat(ts=ts + 15000, peer=PEER, kind="miss", seq=3)
    hlog.heartbeat(ts=ts + 20000, peer=PEER, kind="link_down")
    hlog.trace(
        ts=ts + 1000, msg_id="01JD0000000000000000000001", origin=PEER, published_ms=ts, hops=2
    )
    hlog.flush()


async def write_beacon(data_dir: Path, uptime_s: float) -> None:
    """A beacon in the node's message log, as the mesh publishes it."""
    log = MessageLog(data_dir / "pubsub" / "log.sqlite3", KEYS)
    await log.open()
    task = asyncio.get_running_loop().create_task(log.run())
    beacon = {
        "node": KEYS.node_id,
        "name": "kitchen",
        "uptime_s": uptime_s,
        "peers": [{"peer": PEER, "rtt_ms_p50": 0.9, "loss_pct": 0, "path": "direct"}],
        "log_head": 7,
        "subscribers": 2,
        "cpu_pct": 1.5,
        "rss_mb": 60.2,
        "version": "0.3.0",
    }
    try:
        await log.publish(topic="mesh.beacon", msg_type="beacon", data=beacon)
    finally:
        await log.close()
        task.cancel()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of one export file (plain or gzipped)."""
    raw = path.read_bytes()
    text = gzip.decompress(raw).decode() if path.suffix == ".gz" else raw.decode()
    return [json.loads(line) for line in text.splitlines()]


async def test_export_jsonl_has_every_kind(tmp_path: Path) -> None:
    """Heartbeats, traces and beacons land in their directories; numbers get the schema's
    types (a beacon's uptime written as a float is exported as an integer)."""
    ts = now_ms() - 60_000
    write_records(tmp_path / "node", ts)
    await write_beacon(tmp_path / "node", uptime_s=12.7)
    counts = export(tmp_path / "node", tmp_path / "out", node=KEYS.node_id, since_ms=ts - 1)
    heartbeats = read_jsonl(next((tmp_path / "out" / "heartbeats").glob("*.jsonl")))
    beacons = read_jsonl(next((tmp_path / "out" / "beacons").glob("*.jsonl")))
    traces = read_jsonl(next((tmp_path / "out" / "traces").glob("*.jsonl")))
    assert {"heartbeats": 5, "beacons": 1, "traces": 1} == counts
    assert ["link_up", "pong", "pong", "miss", "link_down"] == [h["kind"] for h in heartbeats]
    assert (1.0, 12, "kitchen") == (
        heartbeats[2]["rtt_ms"],
        beacons[0]["uptime_s"],
        beacons[0]["name"],
    )
    assert isinstance(heartbeats[2]["rtt_ms"], float)
    assert (2, PEER) == (traces[0]["hops"], traces[0]["origin"])


async def test_export_parquet_uses_the_job_schema(tmp_path: Path) -> None:
    """Parquet files carry exactly the column types the mesh-health job reads, including
    the beacon's list of peer structs."""
    ts = now_ms() - 60_000
    write_records(tmp_path / "node", ts)
    await write_beacon(tmp_path / "node", uptime_s=3.2)
    export(tmp_path / "node", tmp_path / "out", node=KEYS.node_id, since_ms=ts - 1, fmt="parquet")
    tables = {
        kind: pq.read_table(next((tmp_path / "out" / kind).glob("*.parquet")))
        for kind in ("heartbeats", "beacons", "traces")
    }
    assert [True, True, True] == [t.schema.equals(arrow_schema(k)) for k, t in tables.items()]
    beacon = tables["beacons"].to_pylist()[0]
    assert (3, PEER, 0.0) == (
        beacon["uptime_s"],
        beacon["peers"][0]["peer"],
        beacon["peers"][0]["loss_pct"],
    )
    assert [None, 0.8, 1.0, None, None] == tables["heartbeats"].column("rtt_ms").to_pylist()


async def test_export_since_skips_older_records_and_days(tmp_path: Path) -> None:
    """--since cuts by record time; whole day files before it are not even read."""
    ts = now_ms()
    write_records(tmp_path / "node", ts - 3 * DAY_MS)
    write_records(tmp_path / "node", ts - 60_000)
    counts = export(tmp_path / "node", tmp_path / "out", node=KEYS.node_id, since_ms=ts - DAY_MS)
    assert {"heartbeats": 5, "beacons": 0, "traces": 1} == counts


def test_traces_are_sampled_and_old_days_pruned(tmp_path: Path) -> None:
    """At most ~50 traces a second are kept; files older than 14 days are deleted."""
    hlog = HeartbeatLog(tmp_path, node=KEYS.node_id, community=KEYS.node_id, version="0.3.0")
    ts = now_ms()
    for i in range(500):
        hlog.trace(ts=ts, msg_id=f"m{i}", origin=PEER, published_ms=ts, hops=1)
    hlog.heartbeat(ts=ts - 20 * DAY_MS, peer=PEER, kind="link_up")
    hlog.heartbeat(ts=ts, peer=PEER, kind="link_up")
    hlog.flush()
    kept = len(read_jsonl(next((tmp_path / "traces").glob("*.jsonl"))))
    hlog.prune(ts)
    assert 50 <= kept <= 60
    assert 1 == len(list((tmp_path / "heartbeats").glob("*.jsonl")))


def test_parquet_export_without_pyarrow_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The analysis extra is optional: a clear ConfigError, not an ImportError."""
    real_import = builtins.__import__

    def no_pyarrow(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("pyarrow"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    write_records(tmp_path / "node", now_ms())
    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(ConfigError, match="-e '\\.\\[analysis\\]'"):
        export(tmp_path / "node", tmp_path / "out", node=KEYS.node_id, since_ms=0, fmt="parquet")


async def test_export_skips_a_stored_beacon_nested_too_deep(tmp_path: Path) -> None:
    """A mesh.beacon row whose JSON nests 100,000 deep is skipped; the others export."""
    await write_beacon(tmp_path / "node", uptime_s=1.0)
    await write_beacon(tmp_path / "node", uptime_s=2.0)
    hostile = b'{"ts":1,"data":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with sqlite3.connect(tmp_path / "node" / "pubsub" / "log.sqlite3") as db:
        key, origin, blob, bodies = db.execute(
            "SELECT seq, origin, heads, bodies FROM batches ORDER BY seq LIMIT 1"
        ).fetchone()
        heads = unpack_heads(blob, origin)
        rest = split_bodies(heads, bodies)[1:]
        heads[0] = heads[0]._replace(size=len(hostile))
        db.execute(
            "UPDATE batches SET heads = ?, bodies = ? WHERE seq = ?",
            (pack_heads(heads, origin), b"".join([hostile, *rest]), key),
        )
    counts = export(tmp_path / "node", tmp_path / "out", node=KEYS.node_id, since_ms=0)
    beacons = read_jsonl(next((tmp_path / "out" / "beacons").glob("*.jsonl")))
    assert (1, [2]) == (counts["beacons"], [b["uptime_s"] for b in beacons])
