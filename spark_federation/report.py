"""report.html and its PNG charts, from small collected tables (no Spark here).

The report directory is self-contained: open ``report.html`` in any browser,
no Spark, no server, no network. Charts are bounded so they stay legible on
any input: at most :data:`MAX_ROWS` nodes or links per chart (the worst ones,
by the chart's own measure), and availability by day instead of by hour past
:data:`MAX_HOURS` hours.

The job draws each chart as soon as its rows are in (:class:`Charts`, a thread of its
own), while Spark works on the other tables; matplotlib is imported there too, not
when the job starts.
"""

from __future__ import annotations

import html
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hearthnet import ids
from hearthnet.errors import HearthNetError
from spark_federation.params import HOUR_MS

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MAX_ROWS = 40
MAX_HOURS = 24 * 14


def _figure(**kwargs: Any) -> Figure:
    # imported on first use: matplotlib costs most of a second to import, which the
    # job spends in the charts' thread rather than before the JVM starts
    from matplotlib.figure import Figure  # noqa: PLC0415

    return Figure(**kwargs)


@dataclass(slots=True)
class ReportData:
    """What the report draws; each list holds plain dicts collected from a table.

    Attributes:
        summary: the summary.json content.
        availability: ``node, hour_ms, availability`` rows.
        rtt: ``a, b, q`` (RTT p5/p25/p50/p75/p95/p99), ``pongs`` per undirected link.
        components: ``window_start_ms, size, nodes`` for each component of partitioned windows.
        per_window: ``win, components, nodes_up`` for every analysed window.
        relay_rows: relay_dependence rows of nodes with relayed links.
    """

    summary: dict[str, Any]
    availability: list[dict[str, Any]] = field(default_factory=list)
    rtt: list[dict[str, Any]] = field(default_factory=list)
    components: list[dict[str, Any]] = field(default_factory=list)
    per_window: list[dict[str, Any]] = field(default_factory=list)
    relay_rows: list[dict[str, Any]] = field(default_factory=list)


def short_id(node: str) -> str:
    """Spec §1.1 short id (``XXXX-XXXX-XXXX-XXXX``); the first 16 characters of anything
    that is not a NodeID (the job reports what the logs say)."""
    try:
        return ids.short_id(node)
    except HearthNetError:
        return node[:16]


def label(node: str, names: dict[str, str]) -> str:
    """How a node is shown: its beacon name and short id, or the short id alone."""
    sid = short_id(node)
    return f"{names[node]} ({sid[:9]})" if node in names else sid


def link_end(node: str, names: dict[str, str]) -> str:
    """A node at one end of a link label: name and 4 short-id characters (names repeat:
    every node on one host may be called after it), or 9 characters of the short id."""
    sid = short_id(node)
    return f"{names[node]} ({sid[:4]})" if node in names else sid[:9]


def _hm(ms: int) -> str:
    return time.strftime("%m-%d %H:%M", time.gmtime(ms / 1000))


def render(out: Path, data: ReportData) -> list[Path]:
    """Write the charts and report.html into ``out``; returns the files written.

    Figures are built with matplotlib's object API (no pyplot), so no global
    backend or figure state is touched and nothing needs closing.
    """
    charts = [chart(out, name, data) for name in CHARTS]
    return _page(out, data, charts)


def chart(out: Path, name: str, data: ReportData) -> Path | None:
    """Draw one chart of :data:`CHARTS` into ``out/<name>.png`` (None: nothing to draw).

    Each reads only its own rows of ``data`` and a few keys of ``data.summary``:
    ``names`` (every chart), ``availability`` (availability, partitions) and
    ``window_s``, ``span``, ``partitions``, ``outages`` (partitions).
    """
    return CHARTS[name](out / f"{name}.png", data)


def _page(out: Path, data: ReportData, charts: list[Path | None]) -> list[Path]:
    page = out / "report.html"
    drawn = [c for c in charts if c is not None]
    page.write_text(_html(data, drawn), encoding="utf-8")
    return [page, *drawn]


@dataclass(slots=True)
class Charts:
    """The report's charts drawn one after the other in a thread of its own, each as
    soon as its rows are in, while the job's other steps go on; then report.html.

    Call :meth:`close` when done (it waits for a chart being drawn).
    """

    out: Path
    _pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="report")
    )
    _drawn: dict[str, Future[Path | None]] = field(default_factory=dict)

    def draw(self, name: str, data: ReportData) -> None:
        """Draw chart ``name`` (:func:`chart`) in the charts' thread."""
        self._drawn[name] = self._pool.submit(chart, self.out, name, data)

    def page(self, data: ReportData) -> list[Path]:
        """report.html once every chart is drawn (any not handed to :meth:`draw` is drawn
        now, from ``data``); returns the files written."""
        charts = [
            self._drawn[n].result() if n in self._drawn else chart(self.out, n, data)
            for n in CHARTS
        ]
        return _page(self.out, data, charts)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _availability_chart(path: Path, data: ReportData) -> Path | None:
    names = data.summary.get("names", {})
    overall = data.summary["availability"]
    if not data.availability:
        return None
    bucket = HOUR_MS
    hours = sorted({r["hour_ms"] for r in data.availability})
    if len(hours) > MAX_HOURS:
        bucket = 24 * HOUR_MS
    cells: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in data.availability:
        cells[(r["node"], r["hour_ms"] - r["hour_ms"] % bucket)].append(r["availability"])
    columns = sorted({k[1] for k in cells})
    nodes = sorted(overall, key=lambda n: (overall[n], label(n, names)))[:MAX_ROWS]
    nodes.sort(key=lambda n: label(n, names))
    grid = [
        [sum(cells.get((n, c), [0.0])) / max(1, len(cells.get((n, c), [0.0]))) for c in columns]
        for n in nodes
    ]
    fig = _figure(figsize=(min(14, max(8, 3 + 0.35 * len(columns))), 1.6 + 0.32 * len(nodes)))
    ax = fig.subplots()
    img = ax.imshow(grid, aspect="auto", cmap="RdYlGn", vmin=0.0, vmax=1.0, interpolation="nearest")
    ax.set_yticks(range(len(nodes)), [label(n, names) for n in nodes], fontsize=8)
    step = max(1, len(columns) // 12)
    ax.set_xticks(
        range(0, len(columns), step),
        [_hm(c) for c in columns[::step]],
        rotation=30,
        fontsize=8,
        ha="right",
    )
    ax.set_title(f"Availability by node and {'hour' if bucket == HOUR_MS else 'day'} (UTC)")
    fig.colorbar(img, ax=ax, fraction=0.03, label="share of windows up")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _rtt_chart(path: Path, data: ReportData) -> Path | None:
    names = data.summary.get("names", {})
    rows = [r for r in data.rtt if r["q"] is not None and r["q"][0] is not None]
    if not rows:
        return None
    rows = sorted(rows, key=lambda r: -r["q"][4])[:MAX_ROWS]
    rows.sort(key=lambda r: r["q"][2])
    stats = [
        {
            "whislo": r["q"][0],
            "q1": r["q"][1],
            "med": r["q"][2],
            "q3": r["q"][3],
            "whishi": r["q"][4],
            "fliers": [r["q"][5]],
            "label": f"{link_end(r['a'], names)} ↔ {link_end(r['b'], names)}",
        }
        for r in rows
    ]
    fig = _figure(figsize=(10, 1.2 + 0.3 * len(stats)))
    ax = fig.subplots()
    ax.bxp(
        stats,
        orientation="horizontal",
        showfliers=True,
        flierprops={"marker": "x", "markersize": 4},
    )
    ax.set_xscale("log")
    ax.set_xlabel("RTT ms (box p25-p75, whiskers p5-p95, x = p99; log scale)")
    ax.tick_params(axis="y", labelsize=8)
    ax.set_title("RTT distribution per link")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _timeline_chart(path: Path, data: ReportData) -> Path | None:
    s = data.summary
    names = s.get("names", {})
    if not data.per_window:
        return None
    window = s["window_s"] * 1000
    # hours for long spans, minutes for short ones (a few minutes read badly as 0.03 h)
    span_ms = s["span"]["end_ms"] - s["span"]["start_ms"]
    unit_ms, unit = (HOUR_MS, "hours") if span_ms >= 3 * HOUR_MS else (60_000, "minutes")
    nodes = sorted(s["availability"], key=lambda n: label(n, names))[:MAX_ROWS]
    fig = _figure(figsize=(12, 2.6 + 0.3 * len(nodes)))
    top, rows = fig.subplots(
        2, 1, sharex=True, gridspec_kw={"height_ratios": [1.2, max(1.0, 0.3 * len(nodes))]}
    )
    xs = [(r["win"] - s["span"]["start_ms"]) / unit_ms for r in data.per_window]
    top.step(
        xs,
        [r["components"] for r in data.per_window],
        where="post",
        color="tab:red",
        label="components",
    )
    top.step(
        xs,
        [r["nodes_up"] for r in data.per_window],
        where="post",
        color="tab:green",
        label="nodes up",
    )
    top.set_ylabel("count")
    top.legend(loc="upper right", fontsize=8)
    top.set_title(f"Partitions and outages ({unit} from start of analysis)")
    for p in s["partitions"]:
        top.axvspan(
            (p["start_ms"] - s["span"]["start_ms"]) / unit_ms,
            (p["end_ms"] - s["span"]["start_ms"]) / unit_ms,
            color="tab:red",
            alpha=0.15,
        )
    largest: dict[int, int] = defaultdict(int)
    for c in data.components:
        largest[c["window_start_ms"]] = max(largest[c["window_start_ms"]], c["size"])
    minority: dict[str, list[int]] = defaultdict(list)
    for c in data.components:
        if c["size"] < largest[c["window_start_ms"]] or c["size"] == 1:
            for n in c["nodes"] or []:
                minority[n].append(c["window_start_ms"])
    width = window / unit_ms
    for y, n in enumerate(nodes):
        start = s["span"]["start_ms"]
        total = (s["span"]["end_ms"] - start) / unit_ms
        rows.broken_barh([(0, total)], (y - 0.35, 0.7), color="#cfe8cf")
        downs = [
            ((o["start_ms"] - start) / unit_ms, (o["end_ms"] - o["start_ms"]) / unit_ms)
            for o in s["outages"]
            if o["node"] == n
        ]
        rows.broken_barh(downs, (y - 0.35, 0.7), color="#555555")
        cut = [((w - start) / unit_ms, width) for w in minority.get(n, [])]
        rows.broken_barh(cut, (y - 0.35, 0.7), color="tab:red")
    rows.set_yticks(range(len(nodes)), [label(n, names) for n in nodes], fontsize=8)
    rows.set_xlabel(f"{unit} (green: up, grey: down, red: in a smaller partition)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _relay_chart(path: Path, data: ReportData) -> Path | None:
    names = data.summary.get("names", {})
    rows = sorted(data.relay_rows, key=lambda r: -(r["link_share"] or 0.0))[:MAX_ROWS]
    if not rows:
        return None
    rows.reverse()
    fig = _figure(figsize=(9, 1.4 + 0.35 * len(rows)))
    ax = fig.subplots()
    ys = range(len(rows))
    ax.barh(
        [y + 0.2 for y in ys],
        [r["link_share"] or 0.0 for r in rows],
        height=0.4,
        label="share of links via relay",
    )
    ax.barh(
        [y - 0.2 for y in ys],
        [r["traffic_share"] or 0.0 for r in rows],
        height=0.4,
        label="share of pings via relay",
    )
    ax.set_yticks(
        list(ys),
        [label(r["node"], names) + (" *" if r["relay_only"] else "") for r in rows],
        fontsize=8,
    )
    ax.set_xlim(0, 1)
    ax.set_xlabel("share (* = relay-only: no direct link to a non-relay node)")
    ax.set_title("Relay dependence")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    if not rows:
        return "<p class=none>none</p>"
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _html(data: ReportData, charts: list[Path]) -> str:
    s = data.summary
    names = s.get("names", {})

    def who(n: str) -> str:
        return label(n, names)

    def span(a: int, b: int) -> str:
        return f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(a / 1000))} – {_hm(b)} UTC"

    verdicts = [
        ("Nodes", s["nodes"]),
        ("Links", s["links"]),
        ("Records", s["records"]),
        ("Skipped (malformed)", s["skipped"]),
        ("Duplicates", s["duplicates"]),
        ("Window", f"{s['window_s']} s"),
        ("Analysed", span(s["span"]["start_ms"], s["span"]["end_ms"])),
    ]
    if s.get("propagation"):
        worst = max(p["p99_ms"] for p in s["propagation"])
        verdicts.append(("Propagation p99 (live)", f"{worst:,.0f} ms"))
    if s.get("catch_up") and s["catch_up"]["messages"]:
        verdicts.append(("Catch-up p50", f"{s['catch_up']['p50_ms'] / 1000:,.1f} s"))
    sections = [
        "<h2>Partitions</h2>"
        + _table(
            ["when", "minutes", "components", "sizes"],
            [
                [
                    span(p["start_ms"], p["end_ms"]),
                    (p["end_ms"] - p["start_ms"]) // 60_000,
                    p["components"],
                    ", ".join(map(str, p["sizes"])),
                ]
                for p in s["partitions"]
            ],
        ),
        "<h2>Outages</h2>"
        + _table(
            ["node", "when", "minutes"],
            [
                [
                    who(o["node"]),
                    span(o["start_ms"], o["end_ms"]),
                    (o["end_ms"] - o["start_ms"]) // 60_000,
                ]
                for o in s["outages"]
            ],
        ),
        "<h2>Flapping links</h2>"
        + _table(
            ["node", "peer", "down→up"],
            [[who(f["node"]), who(f["peer"]), f["flaps"]] for f in s["flapping_links"]],
        ),
        "<h2>Relay-only nodes</h2>"
        + _table(
            ["node", "relays used"],
            [
                [
                    who(n),
                    ", ".join(
                        who(x) for r in data.relay_rows if r["node"] == n for x in r["relays"]
                    ),
                ]
                for n in s["relay_only_nodes"]
            ],
        ),
        "<h2>Clock skew</h2>"
        + _table(
            ["node", "offset ms", "skewed"],
            [
                [who(n), v, "yes" if n in s["skewed_nodes"] else ""]
                for n, v in sorted(s["clock_skew_ms"].items(), key=lambda kv: -abs(kv[1]))
            ],
        ),
        "<h2>Availability</h2>"
        + _table(
            ["node", "share of windows up"],
            [
                [who(n), f"{v:.1%}"]
                for n, v in sorted(s["availability"].items(), key=lambda kv: kv[1])
            ],
        ),
    ]
    if s.get("propagation"):
        sections.append(
            "<h2>Propagation (live)</h2>"
            + _table(
                ["hops", "messages", "p50 ms", "p99 ms"],
                [[p["hops"], p["messages"], p["p50_ms"], p["p99_ms"]] for p in s["propagation"]],
            )
        )
    late = s.get("catch_up")
    if late:
        sections.append(
            "<h2>Catch-up</h2><p>Backlog a node received after being down, cut off or"
            " joining late: how long it was away, not how fast the mesh is; not in"
            f" propagation above. {late['inferred']} trace records carried no live/catch-up"
            " mark and were classified from the receiver's heartbeats.</p>"
            + _table(
                ["messages", "p50 ms", "p99 ms", "max ms"],
                [[late["messages"], late["p50_ms"], late["p99_ms"], late["max_ms"]]],
            )
            + _table(
                ["receiver", "messages"],
                [[who(n), m] for n, m in sorted(late["nodes"].items(), key=lambda kv: -kv[1])],
            )
        )
    images = "".join(f'<figure><img src="{c.name}" alt="{c.stem}"></figure>' for c in charts)
    cards = "".join(
        f"<div class=card><b>{html.escape(str(v))}</b><span>{html.escape(k)}</span></div>"
        for k, v in verdicts
    )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>HearthNet mesh health</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1200px; }}
.cards {{ display: flex; flex-wrap: wrap; gap: .8em; }}
.card {{ border: 1px solid #ccc; border-radius: 6px; padding: .5em .9em; }}
.card b {{ display: block; font-size: 1.2em; }} .card span {{ color: #666; font-size: .85em; }}
table {{ border-collapse: collapse; margin: .5em 0 1.5em; font-size: .9em; }}
td, th {{ border: 1px solid #ddd; padding: .25em .6em; text-align: left; }}
img {{ max-width: 100%; border: 1px solid #eee; }} .none {{ color: #888; }}
</style></head><body>
<h1>HearthNet mesh health</h1>
<div class=cards>{cards}</div>
{images}
{"".join(sections)}
<p class=none>Definitions: docs/mesh-health.md. Tables: tables/. Verdicts: summary.json.</p>
</body></html>
"""


# the charts in the report's order: name (the PNG's) -> drawing function
CHARTS: dict[str, Callable[[Path, ReportData], Path | None]] = {
    "availability": _availability_chart,
    "rtt": _rtt_chart,
    "partitions": _timeline_chart,
    "relays": _relay_chart,
}
