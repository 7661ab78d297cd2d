"""Writing a simulated community as export dirs in the spec §7.5 layout (for synth)."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from hearthnet.mesh.heartlog import arrow_schema, day_of
from spark_federation.synth_model import (
    BEACON_MS,
    VERSION,
    Interval,
    Scenario,
    SimLink,
    SynthConfig,
    Timeline,
)


@dataclass(slots=True)
class _Written:
    records: int = 0
    duplicates: int = 0
    malformed: int = 0


_MALFORMED_LINES = (
    b'{"ts": 1763800000123, "node": "ed25519:AAAA", "peer": ',  # truncated mid-record
    b"this is not json at all",
    b'{"ts": "yesterday", "node": "%(n)s", "peer": "%(n)s", "kind": "pong", "seq": 1}',
    b'{"ts": 1763800000123, "node": "%(n)s", "peer": "%(p)s", "kind": "ping", "seq": 7}',
    b'{"ts": 1763800000123, "peer": "%(p)s", "kind": "pong", "seq": 7, "rtt_ms": 2.0}',
    b'{"ts": 1763800000123, "node": "bob", "peer": "%(p)s", "kind": "pong", "seq": 7}',
    b'{"ts": 1763800000123, "node": "%(n)s", "peer": "%(p)s", "kind": "pong", "rtt_ms": "fast"}',
    b'{"ts": 1763800000123, "node": "%(n)s", "peer": "%(n)s", "kind": "pong", "seq": 9}',
)


class ExportWriter:
    """Writes one export dir per node (half of them one level deeper) in the spec §7.5 layout."""

    def __init__(self, out: Path, cfg: SynthConfig, sc: Scenario) -> None:
        self.out = out
        self.cfg = cfg
        self.sc = sc
        self.community = sc.order[0]
        self.malformed_written = 0  # cycles the bad-line templates across all files
        self.degree = {n: 0 for n in sc.order}
        for lk in sc.links:
            self.degree[lk.a] += 1
            self.degree[lk.b] += 1

    def export_dir(self, n: str, copy: int = 0) -> Path:
        name = self.sc.nodes[n].name
        parent = self.out / "site-b" if self.sc.order.index(n) % 2 else self.out
        suffix = f"-reexport{copy}" if copy else ""
        return parent / f"{name}{suffix}"

    def _write(
        self, directory: Path, day: str, rows: list[dict[str, Any]], extra: bytes = b""
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        if self.cfg.fmt == "parquet":
            if rows:
                pq.write_table(
                    pa.Table.from_pylist(rows, schema=arrow_schema(directory.name)),
                    directory / f"{day}.parquet",
                    compression="zstd",
                )
            return
        with (directory / f"{day}.jsonl").open("wb") as fh:
            for row in rows:
                fh.write(orjson.dumps(row) + b"\n")
            fh.write(extra)

    def heartbeats(
        self,
        n: str,
        columns: list[tuple[float, str, int | None, float | None, float | None, SimLink]],
        links: list[SimLink],
        malformed: int,
        dups: int,
    ) -> _Written:
        node = self.sc.nodes[n]
        rows: list[dict[str, Any]] = []
        log_head = 1_000 + self.sc.order.index(n) * 10
        for t, kind, seq, rtt, offset, lk in columns:
            peer = lk.b if lk.a == n else lk.a
            log_head += 1 if kind == "pong" else 0
            rows.append(
                {
                    "ts": int(t + node.clock_offset_ms),
                    "node": n,
                    "peer": peer,
                    "community": self.community,
                    "kind": kind,
                    "seq": seq,
                    "rtt_ms": rtt,
                    "path": "relay" if lk.via else "direct",
                    "via": lk.via,
                    "clock_offset_ms": offset,
                    "peers_linked": self.degree[n],
                    "log_head": log_head,
                    "subscribers": 3 + self.sc.order.index(n) % 7,
                    "version": VERSION,
                }
            )
        written = _Written(records=len(rows), duplicates=min(dups, len(rows)))
        by_day: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_day.setdefault(day_of(row["ts"]), []).append(row)
        directory = self.export_dir(n) / "heartbeats"
        days = sorted(by_day)
        bad_rows = self._malformed(n, links, malformed)
        written.malformed = malformed
        for i, day in enumerate(days):
            day_rows = by_day[day]
            extra = b""
            if i == len(days) - 1 and bad_rows:
                if self.cfg.fmt == "parquet":
                    day_rows = day_rows + bad_rows
                else:
                    extra = b"\n".join(bad_rows)  # the last line ends without newline: cut off
            self._write(directory, day, day_rows, extra)
        if written.duplicates:
            # An admin collected an older export too: its records overlap this one's.
            self._write(self.export_dir(n, 1) / "heartbeats", days[0], rows[: written.duplicates])
        return written

    def _malformed(self, n: str, links: list[SimLink], count: int) -> list[Any]:
        """Bad lines (JSONL) or rows (Parquet); the last JSONL line has no newline (truncated)."""
        peer = (links[0].b if links[0].a == n else links[0].a) if links else n
        if self.cfg.fmt == "parquet":
            return [
                {"ts": 1_763_800_000_123 + i, "node": n, "peer": peer, "kind": "bogus", "seq": i}
                if i % 2 == 0
                else {"ts": None, "node": None, "peer": peer, "kind": "pong", "seq": i}
                for i in range(count)
            ]
        subst = {b"n": n.encode(), b"p": peer.encode()}
        lines = []
        for _ in range(count):
            template = _MALFORMED_LINES[self.malformed_written % len(_MALFORMED_LINES)]
            self.malformed_written += 1
            lines.append(template % subst if b"%(" in template else template)
        return lines

    def beacons(self, up_spans: dict[int, list[Interval]], t0: int, t_end: int) -> None:
        """Every node's beacons every 30 s while it is up; ``all`` puts them in every export."""
        by_node: dict[str, list[dict[str, Any]]] = {n: [] for n in self.sc.order}
        for n in self.sc.order:
            node = self.sc.nodes[n]
            mine = [lk for lk in self.sc.links if n in (lk.a, lk.b)]
            started = t0
            t = t0 + 3_000 + self.sc.order.index(n) * 997 % BEACON_MS
            while t < t_end:
                if self.sc.outages[n].find(t) is not None:
                    started = self.sc.outages[n].find(t).end_ms  # type: ignore[union-attr]
                    t += BEACON_MS
                    continue
                peers = [
                    {
                        "peer": lk.b if lk.a == n else lk.a,
                        "rtt_ms_p50": lk.base_rtt_ms,
                        "loss_pct": 0.0,
                        "path": "relay" if lk.via else "direct",
                    }
                    for lk in mine
                    if any(iv.holds(t) for iv in up_spans.get(lk.index, []))
                ]
                by_node[n].append(
                    {
                        "ts": int(t + node.clock_offset_ms),
                        "node": n,
                        "name": node.name,
                        "uptime_s": int((t - started) / 1000),
                        "peers": peers,
                        "log_head": 1_000 + int((t - t0) / 5_000),
                        "subscribers": 3 + self.sc.order.index(n) % 7,
                        "cpu_pct": 2.5,
                        "rss_mb": 61.0,
                        "version": VERSION,
                    }
                )
                t += BEACON_MS
        everyone = [b for n in self.sc.order for b in by_node[n]]
        for n in self.sc.order:
            rows = everyone if self.cfg.beacons == "all" else by_node[n]
            self._write(self.export_dir(n) / "beacons", day_of(t0), rows)

    def traces(
        self,
        up_spans: dict[int, list[Interval]],
        broken: dict[int, Timeline],
        t0: int,
        t_end: int,
        rng: random.Random,
    ) -> tuple[int, int]:
        """Messages published at random live nodes, delivered live along the fastest live
        path; a node down at the publish gets it as catch-up (anti-entropy) 1-5 s after it
        is back. Returns (trace records, of which catch-up)."""
        per_node: dict[str, list[dict[str, Any]]] = {n: [] for n in self.sc.order}
        late_rng = random.Random(rng.random())  # catch-up draws leave the live ones as they were
        t = t0 + self.cfg.trace_interval_ms
        seq = late = 0
        while t < t_end:
            live = [n for n in self.sc.order if self.sc.outages[n].find(t) is None]
            origin = rng.choice(live)
            adj: dict[str, list[tuple[str, float]]] = {n: [] for n in live}
            for lk in self.sc.links:
                if (
                    lk.a in adj
                    and lk.b in adj
                    and broken[lk.index].find(t) is None
                    and any(iv.holds(t) for iv in up_spans.get(lk.index, []))
                ):
                    adj[lk.a].append((lk.b, lk.base_rtt_ms / 2))
                    adj[lk.b].append((lk.a, lk.base_rtt_ms / 2))
            seq += 1
            msg_id = f"01SYNTH{seq:019d}"
            published = int(t + self.sc.nodes[origin].clock_offset_ms)

            def record(dest: str, at: float, hops: int, catch_up: bool) -> dict[str, Any]:
                return {
                    "ts": int(at + self.sc.nodes[dest].clock_offset_ms),
                    "node": dest,
                    "msg_id": msg_id,  # noqa: B023 - used at once, in this iteration
                    "origin": origin,  # noqa: B023
                    "published_ms": published,  # noqa: B023
                    "hops": hops,
                    "catch_up": catch_up,
                }

            for dest, (delay, hops) in _fastest_paths(origin, adj, rng).items():
                if dest != origin:
                    per_node[dest].append(record(dest, t + delay, hops, catch_up=False))
            for dest in self.sc.order:
                down = self.sc.outages[dest].find(t)
                back = None if down is None else down.end_ms + late_rng.uniform(1_000, 5_000)
                if back is not None and back < t_end:
                    per_node[dest].append(record(dest, back, 1, catch_up=True))
                    late += 1
            t += self.cfg.trace_interval_ms
        for n, rows in per_node.items():
            self._write(self.export_dir(n) / "traces", day_of(t0), rows)
        return sum(len(v) for v in per_node.values()), late


def _fastest_paths(
    origin: str, adj: dict[str, list[tuple[str, float]]], rng: random.Random
) -> dict[str, tuple[float, int]]:
    """Dijkstra over per-hop delays (half the RTT plus 0.3-2 ms of processing per hop)."""
    best: dict[str, tuple[float, int]] = {}
    heap: list[tuple[float, int, str]] = [(0.0, 0, origin)]
    while heap:
        delay, hops, n = heapq.heappop(heap)
        if n in best:
            continue
        best[n] = (delay, hops)
        for m, d in adj[n]:
            if m not in best:
                heapq.heappush(heap, (delay + d + rng.uniform(0.3, 2.0), hops + 1, m))
    return best
