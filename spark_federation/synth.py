"""Synthetic heartbeat exports with injected, known events (spec §10).

Writes the export layout of spec §7.5 (``<export>/heartbeats/*.jsonl|*.parquet``,
``beacons/``, ``traces/``) for a simulated community, and returns the events it
injected so tests and benchmarks know the right answers::

    python -m spark_federation.synth --nodes 5 --hours 2 --out /tmp/mesh --seed 1
    python -m spark_federation.synth --nodes 50 --hours 35 --format parquet \\
        --beacons own --no-traces --out /tmp/bench

Injected events, each in its own slot of the span unless placed by hand:
``node_down`` (a node stops and restarts), ``partition`` (two groups lose every
link between them; ``end_ms`` is when the first link across comes back),
``flapping_link`` (a direct link repeatedly impaired for ~20 s), ``relay_only``
(a node behind NAT reaching everyone through a relay) and ``clock_skew`` (a node
whose clock is seconds off). Duplicate exports and malformed lines can be added
with known counts. The link model is in :mod:`spark_federation.synth_model`.
"""

from __future__ import annotations

import argparse
import base64
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from spark_federation.errors import MeshHealthError
from spark_federation.params import HOUR_MS, parse_duration_ms
from spark_federation.synth_export import ExportWriter
from spark_federation.synth_model import (
    DEFAULT_START_MS,
    InjectedEvent,
    Interval,
    LinkHistory,
    Scenario,
    SimLink,
    SimNode,
    SynthConfig,
    Timeline,
    simulate_link,
)

__all__ = ["DEFAULT_START_MS", "InjectedEvent", "SynthConfig", "SynthResult", "generate", "main"]

MAX_DIRECT_DEGREE = 8  # spec §7.2: D = 8


@dataclass(slots=True)
class SynthResult:
    """What was written: the known answers.

    Attributes:
        events: injected events.
        nodes: every NodeID, in generation order.
        links: undirected links as sorted (a, b) pairs.
        records: unique heartbeat records written.
        duplicates: extra copies of heartbeat records in re-exports.
        malformed: malformed heartbeat lines or rows written.
        traces: trace records written.
        catch_up_traces: of those, receives of backlog by a node that was down at the publish.
        start_ms: start of the simulated span (true time).
        end_ms: end of the simulated span (true time).
    """

    events: list[InjectedEvent]
    nodes: list[str]
    links: list[tuple[str, str]]
    records: int = 0
    duplicates: int = 0
    malformed: int = 0
    traces: int = 0
    catch_up_traces: int = 0
    start_ms: int = 0
    end_ms: int = 0
    names: dict[str, str] = field(default_factory=dict)

    def of_kind(self, kind: str) -> list[InjectedEvent]:
        """The injected events of one kind."""
        return [e for e in self.events if e.kind == kind]


def node_id(rng: random.Random) -> str:
    """A NodeID in the spec §1.1 form from 32 random bytes."""
    raw = bytes(rng.getrandbits(8) for _ in range(32))
    return "ed25519:" + base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def build_scenario(cfg: SynthConfig) -> Scenario:
    """Choose nodes, topology and events, and derive each link's broken intervals."""
    if cfg.nodes < 2:
        raise MeshHealthError("--nodes must be at least 2")
    rng = random.Random(cfg.seed)
    span = int(cfg.hours * HOUR_MS)
    t0 = cfg.start_ms
    ids = [node_id(rng) for _ in range(cfg.nodes)]
    # Roles: node 0 relays for the NAT nodes 1..k; members are everything else.
    nat_count = min(cfg.relay_only, max(0, cfg.nodes - 3))
    relay = ids[0] if nat_count else None
    nat = ids[1 : 1 + nat_count]
    members = [n for n in ids if n != relay and n not in nat]
    skewed = members[-cfg.skewed :] if cfg.skewed else []
    offsets = {n: rng.gauss(0.0, 2.0) for n in ids}
    for n in skewed:
        offsets[n] = rng.choice((-1.0, 1.0)) * rng.uniform(1_500.0, 4_000.0)
    nodes = {
        n: SimNode(
            node_id=n,
            name=f"node-{i:02d}",
            clock_offset_ms=offsets[n],
            relay_id=relay if n in nat else None,
            is_relay=n == relay,
        )
        for i, n in enumerate(ids)
    }
    pairs = _topology(ids, rng)
    if relay:
        pairs |= {_pair(relay, n) for n in nat}
    base = {p: rng.uniform(0.8, 25.0) for p in sorted(pairs)}
    links: list[SimLink] = []
    for i, (a, b) in enumerate(sorted(pairs)):
        via = relay if (a in nat or b in nat) and relay not in (a, b) else None
        rtt = base[(a, b)]
        if via is not None:
            rtt = base.get(_pair(a, via), 10.0) + base.get(_pair(b, via), 10.0)
        links.append(SimLink(i, a, b, round(rtt, 3), via))
    events: list[InjectedEvent] = [InjectedEvent("relay_only", (n,), value=None) for n in nat] + [
        InjectedEvent("clock_skew", (n,), value=offsets[n]) for n in skewed
    ]

    outage_lists = _outage_plan(cfg, members, skewed, t0=t0, span=span, rng=rng)
    outages = {n: Timeline(outage_lists.get(n, [])) for n in ids}
    for n, tl in outages.items():
        events += [InjectedEvent("node_down", (n,), iv.start_ms, iv.end_ms) for iv in tl.intervals]

    link_breaks: dict[int, list[Interval]] = {lk.index: [] for lk in links}
    partition_specs = (
        list(cfg.partitions)
        if cfg.partitions is not None
        else [(int(span * 0.40) + rng.randrange(60_000), int(span * 0.12))]
    )
    partition_groups: list[tuple[int, int, set[str]]] = []
    for offset, duration in partition_specs:
        side = _partition_side(ids, members, relay, nat, rng)
        start, end = t0 + offset, t0 + offset + duration
        partition_groups.append((start, end, side))
        for lk in links:
            ends = {lk.a, lk.b} | ({lk.via} if lk.via else set())
            if 0 < len(ends & side) < len(ends):
                link_breaks[lk.index].append(Interval(start, end))

    direct = [lk for lk in links if lk.via is None and lk.a in members and lk.b in members]
    events += _flap_plan(cfg, direct, link_breaks, t0=t0, span=span, rng=rng)
    return Scenario(nodes, ids, links, outages, link_breaks, events, partition_groups)


def _outage_plan(
    cfg: SynthConfig,
    members: list[str],
    skewed: list[str],
    *,
    t0: int,
    span: int,
    rng: random.Random,
) -> dict[str, list[Interval]]:
    """Node outages in the slot [0.10, 0.32) of the span, split between the stopped nodes."""
    outage_lists: dict[str, list[Interval]] = {n: [] for n in members}
    down_pool = [n for n in members if n not in skewed]
    for k in range(min(cfg.down, len(down_pool))):
        # slot [0.10, 0.32) of the span, split between the outages
        lo = 0.10 + 0.22 * k / max(cfg.down, 1)
        hi = 0.10 + 0.22 * (k + 1) / max(cfg.down, 1)
        start = t0 + int(span * (lo + (hi - lo) * 0.1)) + rng.randrange(60_000)
        end = t0 + int(span * (lo + (hi - lo) * 0.8)) + rng.randrange(60_000)
        victim = down_pool[k % len(down_pool)]
        outage_lists[victim].append(Interval(start, end))
    return outage_lists


def _flap_plan(
    cfg: SynthConfig,
    direct: list[SimLink],
    link_breaks: dict[int, list[Interval]],
    *,
    t0: int,
    span: int,
    rng: random.Random,
) -> list[InjectedEvent]:
    """Flapping links in the slot [0.65, 0.85): ~20 s impairments every 1-2 minutes."""
    events: list[InjectedEvent] = []
    flap_links = rng.sample(direct, min(cfg.flapping, len(direct)))
    for k, lk in enumerate(flap_links):
        lo = t0 + int(span * (0.65 + 0.2 * k / max(cfg.flapping, 1)))
        hi = t0 + int(span * (0.65 + 0.2 * (k + 1) / max(cfg.flapping, 1)))
        t, cycles = float(lo), 0
        while t + 40_000 < hi and cycles < 1_000:
            length = rng.uniform(16_500.0, 24_000.0)  # > 3 pings: the link must close
            link_breaks[lk.index].append(Interval(int(t), int(t + length)))
            t += length + rng.uniform(45_000.0, 120_000.0)
            cycles += 1
        events.append(
            InjectedEvent("flapping_link", tuple(sorted((lk.a, lk.b))), lo, int(t), value=cycles)
        )
    return events


def _topology(ids: list[str], rng: random.Random) -> set[tuple[str, str]]:
    """Full mesh up to D+1 nodes (spec §7.2); beyond that a ring lattice plus random chords."""
    n = len(ids)
    pairs: set[tuple[str, str]] = set()
    if n <= MAX_DIRECT_DEGREE + 1:
        return {_pair(a, b) for i, a in enumerate(ids) for b in ids[i + 1 :]}
    for i in range(n):
        for step in (1, 2):
            pairs.add(_pair(ids[i], ids[(i + step) % n]))
    for i in range(n):
        for _ in range(2):
            j = rng.randrange(n)
            if j != i:
                pairs.add(_pair(ids[i], ids[j]))
    return pairs


def _pair(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a < b else (b, a)


def _partition_side(
    ids: list[str], members: list[str], relay: str | None, nat: list[str], rng: random.Random
) -> set[str]:
    """The minority side of a partition: a run of consecutive members (connected in the lattice).

    The relay and its NAT nodes stay on the other side together, so both sides
    remain internally connected and the partition has exactly two components.
    """
    size = max(1, (len(members) + 1) // 2 if relay else len(members) // 2)
    start = rng.randrange(max(1, len(members) - size + 1))
    return set(members[start : start + size])


def _link_timelines(sc: Scenario) -> dict[int, Timeline]:
    """Each link's broken intervals: its ends' (and relay's) outages plus cuts and impairments."""
    result = {}
    for lk in sc.links:
        parts = list(sc.link_breaks[lk.index])
        for n in (lk.a, lk.b, *([lk.via] if lk.via else [])):
            parts += sc.outages[n].intervals
        result[lk.index] = Timeline(parts)
    return result


def generate(cfg: SynthConfig, out_dir: str | Path) -> SynthResult:
    """Simulate the community and write its exports under ``out_dir``.

    Returns:
        The known answers: injected events (partition ends filled in from the
        simulated links) and exact counts of records, duplicates and malformed lines.
    """
    out = Path(out_dir)
    sc = build_scenario(cfg)
    t0 = cfg.start_ms
    t_end = t0 + int(cfg.hours * HOUR_MS)
    broken = _link_timelines(sc)
    result = SynthResult(
        events=[],
        nodes=list(sc.order),
        links=sorted((lk.a, lk.b) for lk in sc.links),
        start_ms=t0,
        end_ms=t_end,
        names={n: sc.nodes[n].name for n in sc.order},
    )
    by_node: dict[str, list[SimLink]] = {n: [] for n in sc.order}
    for lk in sc.links:
        by_node[lk.a].append(lk)
        by_node[lk.b].append(lk)
    up_spans: dict[int, list[Interval]] = {}
    writer = ExportWriter(out, cfg, sc)
    dup_nodes = _dup_plan(sc, cfg)
    malformed_left = cfg.malformed
    for idx, n in enumerate(sc.order):
        columns: list[tuple[float, str, int | None, float | None, float | None, SimLink]] = []
        for lk in by_node[n]:
            hist: LinkHistory = simulate_link(
                lk,
                sc.nodes,
                broken[lk.index],
                sc.outages,
                start_ms=t0,
                end_ms=t_end,
                seed=cfg.seed,
                heartbeat_ms=cfg.heartbeat_ms,
            )
            up_spans.setdefault(lk.index, hist.up_spans)
            d = hist.records[n]
            columns += [
                (d.t[i], d.kind[i], d.seq[i], d.rtt[i], d.offset[i], lk) for i in range(len(d.t))
            ]
        columns.sort(key=lambda r: r[0])
        bad = malformed_left // (len(sc.order) - idx) if cfg.malformed else 0
        malformed_left -= bad
        written = writer.heartbeats(n, columns, by_node[n], bad, dup_nodes.get(n, 0))
        result.records += written.records
        result.duplicates += written.duplicates
        result.malformed += written.malformed
    if cfg.beacons != "none":
        writer.beacons(up_spans, t0, t_end)
    if cfg.traces:
        result.traces, result.catch_up_traces = writer.traces(
            up_spans, broken, t0, t_end, random.Random(cfg.seed + 7)
        )
    result.events = _settle_events(sc, up_spans)
    return result


def _dup_plan(sc: Scenario, cfg: SynthConfig) -> dict[str, int]:
    """How many records of which nodes are exported a second time (overlapping exports)."""
    if cfg.duplicates <= 0:
        return {}
    chosen = sc.order[-2:] if len(sc.order) > 1 else sc.order
    per = cfg.duplicates // len(chosen)
    plan = dict.fromkeys(chosen, per)
    plan[chosen[0]] += cfg.duplicates - per * len(chosen)
    return plan


def _settle_events(sc: Scenario, up_spans: dict[int, list[Interval]]) -> list[InjectedEvent]:
    """Add partition events, ending when the first link across the cut is back up."""
    events = list(sc.events)
    for start, cut_end, side in sc.partition_groups:
        heal = None
        for lk in sc.links:
            ends = {lk.a, lk.b} | ({lk.via} if lk.via else set())
            if 0 < len(ends & side) < len(ends):
                back = [iv.start_ms for iv in up_spans[lk.index] if iv.start_ms >= start]
                if back:
                    heal = min(back) if heal is None else min(heal, *back)
        other = tuple(sorted(n for n in sc.order if n not in side))
        events.append(
            InjectedEvent(
                "partition",
                tuple(sorted(sc.order)),
                start,
                heal if heal is not None else cut_end,
                groups=(tuple(sorted(side)), other),
            )
        )
    return sorted(events, key=lambda e: (e.kind, e.start_ms or 0, e.nodes))


def _parse_partition(text: str) -> tuple[int, int]:
    """``40m`` or ``40m+10m``: offset from the start, and duration (default 10 minutes)."""
    offset, _, duration = text.partition("+")
    return parse_duration_ms(offset), parse_duration_ms(duration) if duration else 600_000


def events_to_json(result: SynthResult) -> dict[str, Any]:
    """The known answers as plain JSON (written next to a committed fixture as expected.json)."""
    return {
        "nodes": result.nodes,
        "names": result.names,
        "links": [list(p) for p in result.links],
        "records": result.records,
        "duplicates": result.duplicates,
        "malformed": result.malformed,
        "traces": result.traces,
        "start_ms": result.start_ms,
        "end_ms": result.end_ms,
        "events": [
            {
                "kind": e.kind,
                "nodes": list(e.nodes),
                "start_ms": e.start_ms,
                "end_ms": e.end_ms,
                "groups": [list(g) for g in e.groups],
                "value": e.value,
            }
            for e in result.events
        ],
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spark_federation.synth``: write exports and print the injected events."""
    parser = argparse.ArgumentParser(
        prog="python -m spark_federation.synth",
        description="Write synthetic heartbeat exports with known injected events.",
    )
    parser.add_argument("--nodes", type=int, default=5)
    parser.add_argument("--hours", type=float, default=2.0)
    parser.add_argument("--out", required=True, help="directory to write export dirs into")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--partition-at",
        action="append",
        metavar="OFFSET[+DURATION]",
        help="partition at this offset from the start (e.g. 40m+10m); repeatable",
    )
    parser.add_argument("--no-partition", action="store_true")
    parser.add_argument("--down", type=int, default=1, help="nodes that stop and restart")
    parser.add_argument("--flapping", type=int, default=1, help="flapping links")
    parser.add_argument("--relay-only", type=int, default=1, help="nodes behind NAT")
    parser.add_argument("--skew", type=int, default=1, help="nodes with a skewed clock")
    parser.add_argument("--duplicates", type=int, default=0, help="records exported twice")
    parser.add_argument("--malformed", type=int, default=0, help="malformed records")
    parser.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    parser.add_argument("--beacons", choices=("all", "own", "none"), default="all")
    parser.add_argument("--no-traces", action="store_true")
    parser.add_argument("--start-ms", type=int, default=DEFAULT_START_MS)
    parser.add_argument("--expected", help="also write the known answers as JSON to this file")
    args = parser.parse_args(argv)
    try:
        partitions: tuple[tuple[int, int], ...] | None = None
        if args.no_partition:
            partitions = ()
        elif args.partition_at:
            partitions = tuple(_parse_partition(p) for p in args.partition_at)
        cfg = SynthConfig(
            nodes=args.nodes,
            hours=args.hours,
            seed=args.seed,
            start_ms=args.start_ms,
            partitions=partitions,
            down=args.down,
            flapping=args.flapping,
            relay_only=args.relay_only,
            skewed=args.skew,
            duplicates=args.duplicates,
            malformed=args.malformed,
            fmt=args.format,
            beacons=args.beacons,
            traces=not args.no_traces,
        )
        result = generate(cfg, args.out)
    except MeshHealthError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    answers = events_to_json(result)
    if args.expected:
        Path(args.expected).write_bytes(orjson.dumps(answers, option=orjson.OPT_INDENT_2))
    print(
        f"wrote {result.records} heartbeat records ({result.duplicates} duplicated,"
        f" {result.malformed} malformed), {result.traces} traces for {len(result.nodes)} nodes"
        f" to {args.out}"
    )
    for e in result.events:
        print(
            orjson.dumps(
                {
                    k: v
                    for k, v in answers["events"][result.events.index(e)].items()
                    if v not in (None, [])
                }
            ).decode()
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
