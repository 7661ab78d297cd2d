"""The heartbeat log and its export (spec §7.5), plus message traces for propagation.

Heartbeat records go to ``<data_dir>/heartbeats/YYYY-MM-DD.jsonl`` (UTC days, kept 14 days):
one JSON object per observation (``pong``, ``miss``, ``link_up``, ``link_down``). Trace
records (``<data_dir>/traces/``) note when a gossiped message arrived and after how many
hops; they are sampled at a bounded rate. Writes are buffered and flushed once a second by
the node's task.

``export`` copies this node's records and the community's beacons (from the message log)
into ``OUT/heartbeats/``, ``OUT/beacons/`` and ``OUT/traces/`` as JSON lines or Parquet,
the input of the PySpark mesh-health job.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sqlite3
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from hearthnet.canonical import parse_json
from hearthnet.errors import BadRequest, ConfigError
from hearthnet.ids import short_id
from hearthnet.pubsub.logstore import topic_bodies
from hearthnet.ratelimit import TokenBucket

KEEP_DAYS = 14
BUFFER_MAX = 10_000
TRACES_PER_S = 50.0

log = logging.getLogger("hearthnet.mesh")


def day_of(ts_ms: int) -> str:
    """``YYYY-MM-DD`` (UTC) of a Unix-ms timestamp."""
    return dt.datetime.fromtimestamp(ts_ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d")


class DailyJsonl:
    """Buffered JSON lines, one file per UTC day, old files pruned."""

    def __init__(self, directory: Path, keep_days: int = KEEP_DAYS) -> None:
        self.directory = directory
        self.keep_days = keep_days
        self._buffer: list[tuple[str, str]] = []
        self.dropped = 0

    def add(self, record: dict[str, Any]) -> None:
        """Buffer one record (dropped, and counted, if the buffer is full)."""
        if len(self._buffer) >= BUFFER_MAX:
            self.dropped += 1
            return
        self._buffer.append((day_of(int(record["ts"])), json.dumps(record, separators=(",", ":"))))

    def flush(self) -> int:
        """Append buffered records to their day files; returns how many."""
        if not self._buffer:
            return 0
        batch, self._buffer = self._buffer, []
        self.directory.mkdir(parents=True, exist_ok=True)
        by_day: dict[str, list[str]] = {}
        for day, line in batch:
            by_day.setdefault(day, []).append(line)
        for day, lines in by_day.items():
            with (self.directory / f"{day}.jsonl").open("a", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
        return len(batch)

    def prune(self, now_ms: int) -> int:
        """Delete day files older than ``keep_days``; returns how many."""
        if not self.directory.exists():
            return 0
        cutoff = day_of(now_ms - self.keep_days * 86_400_000)
        removed = 0
        for path in self.directory.glob("*.jsonl"):
            if path.stem < cutoff:
                path.unlink(missing_ok=True)
                removed += 1
        return removed


class HeartbeatLog:
    """Heartbeat and trace records of one node."""

    def __init__(self, data_dir: Path, *, node: str, community: str, version: str) -> None:
        self.node = node
        self.community = community
        self.version = version
        self.heartbeats = DailyJsonl(data_dir / "heartbeats")
        self.traces = DailyJsonl(data_dir / "traces")
        self._trace_budget = TokenBucket(TRACES_PER_S, TRACES_PER_S, time.monotonic())

    def heartbeat(
        self,
        *,
        ts: int,
        peer: str,
        kind: str,
        seq: int | None = None,
        rtt_ms: float | None = None,
        clock_offset_ms: float | None = None,
        path: str = "direct",
        via: str | None = None,
        peers_linked: int = 0,
        log_head: int = 0,
        subscribers: int = 0,
    ) -> None:
        """One observation of one link (spec §7.5 record format)."""
        self.heartbeats.add(
            {
                "ts": ts,
                "node": self.node,
                "peer": peer,
                "community": self.community,
                "kind": kind,
                "seq": seq,
                "rtt_ms": rtt_ms,
                "path": path,
                "via": via,
                "clock_offset_ms": clock_offset_ms,
                "peers_linked": peers_linked,
                "log_head": log_head,
                "subscribers": subscribers,
                "version": self.version,
            }
        )

    def trace(
        self,
        *,
        ts: int,
        msg_id: str,
        origin: str,
        published_ms: int,
        hops: int,
        catch_up: bool = False,
    ) -> None:
        """A gossiped message arrived (sampled: at most 50 records a second); ``catch_up``
        when a peer had advertised it before (backlog), not a live copy."""
        if self._trace_budget.take(time.monotonic()) == 0.0:
            self.traces.add(
                {
                    "ts": ts,
                    "node": self.node,
                    "msg_id": msg_id,
                    "origin": origin,
                    "published_ms": published_ms,
                    "hops": hops,
                    "catch_up": catch_up,
                }
            )

    def flush(self) -> None:
        """Write what is buffered."""
        self.heartbeats.flush()
        self.traces.flush()

    def prune(self, now_ms: int) -> None:
        """Drop files older than 14 days."""
        self.heartbeats.prune(now_ms)
        self.traces.prune(now_ms)


def _records_since(directory: Path, since_ms: int) -> Iterator[dict[str, Any]]:
    if not directory.exists():
        return
    first_day = day_of(since_ms)
    for path in sorted(directory.glob("*.jsonl")):
        if path.stem < first_day:
            continue
        with path.open(encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue  # a torn last line after a crash
                if isinstance(record, dict) and int(record.get("ts", 0)) >= since_ms:
                    yield record


def _beacons_since(db: Path, since_ms: int) -> Iterator[dict[str, Any]]:
    if not db.exists():
        return
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'messages'").fetchone():
            # a log the node has not upgraded yet (one row per message)
            raws: Iterator[bytes] = (
                raw
                for (raw,) in conn.execute(
                    "SELECT raw FROM messages WHERE topic = 'mesh.beacon' AND ts >= ? ORDER BY seq",
                    (since_ms,),
                )
            )
        else:
            raws = topic_bodies(conn, "mesh.beacon", since_ms)
        for raw in raws:
            try:
                # the project's parser: a hostile row (deep nesting, huge numbers) is
                # refused as bad_request instead of crashing the export with RecursionError
                envelope = parse_json(raw)
            except BadRequest as exc:
                log.warning("export: skipped a mesh.beacon message that is not JSON: %s", exc)
                continue
            if (
                isinstance(envelope, dict)
                and isinstance(envelope.get("data"), dict)
                and isinstance(envelope.get("ts"), int)
            ):
                yield {**envelope["data"], "ts": envelope["ts"]}
    finally:
        conn.close()


# Parquet column types per record kind (spec §7.5; the mesh-health job reads exactly these).
_INT, _FLOAT, _STR, _BOOL = "int64", "float64", "string", "bool"
PARQUET_FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "heartbeats": (
        ("ts", _INT),
        ("node", _STR),
        ("peer", _STR),
        ("community", _STR),
        ("kind", _STR),
        ("seq", _INT),
        ("rtt_ms", _FLOAT),
        ("path", _STR),
        ("via", _STR),
        ("clock_offset_ms", _FLOAT),
        ("peers_linked", _INT),
        ("log_head", _INT),
        ("subscribers", _INT),
        ("version", _STR),
    ),
    "beacons": (
        ("ts", _INT),
        ("node", _STR),
        ("name", _STR),
        ("uptime_s", _INT),
        ("peers", "peers"),
        ("log_head", _INT),
        ("subscribers", _INT),
        ("cpu_pct", _FLOAT),
        ("rss_mb", _FLOAT),
        ("version", _STR),
    ),
    "traces": (
        ("ts", _INT),
        ("node", _STR),
        ("msg_id", _STR),
        ("origin", _STR),
        ("published_ms", _INT),
        ("hops", _INT),
        ("catch_up", _BOOL),  # absent (null) in records written before it existed
    ),
}
BEACON_PEER_FIELDS = (("peer", _STR), ("rtt_ms_p50", _FLOAT), ("loss_pct", _FLOAT), ("path", _STR))


def _pyarrow() -> tuple[Any, Any]:
    try:
        import pyarrow as pa  # noqa: PLC0415 - optional: the analysis extra
        import pyarrow.parquet as pq  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigError(
            f"Parquet export needs pyarrow: {sys.executable} -m pip install -e '.[analysis]'"
            " in the HearthNet checkout ('hearthnet[analysis]' where it is installed as a"
            " package), or --format jsonl, which mesh health reads too"
        ) from exc
    return pa, pq


def arrow_schema(kind: str) -> Any:
    """The ``pyarrow`` schema of one record kind (``heartbeats``, ``beacons``, ``traces``)."""
    pa, _ = _pyarrow()
    types = {_INT: pa.int64(), _FLOAT: pa.float64(), _STR: pa.string(), _BOOL: pa.bool_()}
    types["peers"] = pa.list_(pa.struct([(n, types[t]) for n, t in BEACON_PEER_FIELDS]))
    return pa.schema([(name, types[t]) for name, t in PARQUET_FIELDS[kind]])


def _coerce(row: dict[str, Any], kind: str) -> dict[str, Any]:
    """Keep the schema's fields, with numbers of the schema's type (older records wrote
    some integers as floats)."""
    out: dict[str, Any] = {}
    for name, t in PARQUET_FIELDS[kind]:
        value = row.get(name)
        if value is not None and t == _INT and isinstance(value, float):
            value = int(value)
        elif value is not None and t == _FLOAT and isinstance(value, int):
            value = float(value)
        out[name] = value
    return out


def _write(records: Iterable[dict[str, Any]], path: Path, fmt: str, kind: str) -> int:
    rows = list(records)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        with path.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps({**row, **_coerce(row, kind)}, separators=(",", ":")) + "\n")
        return len(rows)
    pa, pq = _pyarrow()
    table = pa.Table.from_pylist([_coerce(r, kind) for r in rows], schema=arrow_schema(kind))
    pq.write_table(table, path)
    return len(rows)


def export(
    data_dir: Path, out: Path, *, node: str, since_ms: int, fmt: str = "jsonl"
) -> dict[str, int]:
    """Write this node's heartbeats and traces and the community's beacons under ``out``.

    Returns the number of records written per kind.
    """
    if fmt not in ("jsonl", "parquet"):
        raise ConfigError("--format is jsonl or parquet")
    stem = (
        short_id(node).replace("-", "").lower()
        + "-"
        + time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    )
    ext = "jsonl" if fmt == "jsonl" else "parquet"
    return {
        "heartbeats": _write(
            _records_since(data_dir / "heartbeats", since_ms),
            out / "heartbeats" / f"{stem}.{ext}",
            fmt,
            "heartbeats",
        ),
        "beacons": _write(
            _beacons_since(data_dir / "pubsub" / "log.sqlite3", since_ms),
            out / "beacons" / f"{stem}.{ext}",
            fmt,
            "beacons",
        ),
        "traces": _write(
            _records_since(data_dir / "traces", since_ms),
            out / "traces" / f"{stem}.{ext}",
            fmt,
            "traces",
        ),
    }
