"""/metrics (spec §9): labelled histograms, the process series, and the Grafana dashboard
in docs/grafana, whose every series a real node exports."""

from __future__ import annotations

import json
import os
import platform
import re
import time
from pathlib import Path
from typing import Any

import aiohttp

from hearthnet import __version__
from hearthnet.metrics import LabelSet, MetricsRegistry
from hearthnet.node import Node
from hearthnet.process_metrics import register_process_metrics
from tests.conftest import MakeConfig

DASHBOARD = Path(__file__).resolve().parents[1] / "docs" / "grafana" / "hearthnet.json"
UNREACHABLE_RELAY = "http://127.0.0.1:9"  # discard port: the member's dials fail, in background

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")
# words in PromQL that are not series: aggregation modifiers, operators, keywords
_NOT_SERIES = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or"}
_NOT_SERIES |= {"unless", "bool", "offset", "inf", "nan"}


def samples(text: str) -> dict[str, list[tuple[str, float]]]:
    """Exposition text as ``{series name: [(labels, value)]}``."""
    out: dict[str, list[tuple[str, float]]] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            m = _SAMPLE.match(line)
            assert m is not None, line
            out.setdefault(m[1], []).append((m[2] or "", float(m[3])))
    return out


def families(text: str) -> set[str]:
    """Every series name the exposition declares (``# TYPE``; a histogram's ``_bucket``,
    ``_sum`` and ``_count``) or has a sample of: a labelled counter nothing has counted
    yet is declared, with no sample."""
    names = set(samples(text))
    for m in re.finditer(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE):
        suffixes = ("_bucket", "_sum", "_count") if m[2] == "histogram" else ("",)
        names.update(m[1] + s for s in suffixes)
    return names


def series_in(expr: str) -> set[str]:
    """The series names a PromQL expression reads: identifiers that are not functions,
    keywords, label names (in ``{}`` or ``by (...)``), strings, durations or variables."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\$\w+", "", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\(?)", expr):
        if not m[2] and m[1].lower() not in _NOT_SERIES:
            names.add(m[1])
    return names


# labels every scraped series has (Prometheus adds them), and a histogram bucket's bound
_SCRAPE_LABELS = {"instance", "job", "le"}


def labels_in(expr: str) -> set[str]:
    """The label names an expression groups by (``by (...)``) or matches (``{...}``)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    names = {
        label.strip()
        for m in re.finditer(r"\bby\s*\(([^)]*)\)", expr)
        for label in m[1].split(",")
        if label.strip()
    }
    for m in re.finditer(r"\{([^}]*)\}", expr):
        names.update(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", m[1]))
    return names - _SCRAPE_LABELS


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and variable queries."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        text = query.get("query", "") if isinstance(query, dict) else str(query or "")
        exprs.extend(re.findall(r"label_values\(([^,)]+)", text))
    return exprs


def test_series_in_promql() -> None:
    """Series names come out of aggregations, quantiles, selectors and arithmetic."""
    expr = (
        'histogram_quantile(0.99, sum by (le, capability) (rate(a_b_bucket{x=~"$i",'
        ' y="sum(z)"}[$__rate_interval]))) / on (instance) c_total offset 5m - time() + 1e3'
    )
    assert {"a_b_bucket", "c_total"} == series_in(expr)


def test_labelled_histogram_renders_one_set_of_buckets_per_label() -> None:
    """Each label value gets cumulative buckets, +Inf, sum and count of its own."""
    reg = MetricsRegistry()
    h = reg.histogram("d_seconds", "help", buckets=(0.1, 1.0), labelnames=("capability",))
    for value, cap in ((0.05, "echo"), (0.5, "echo"), (5.0, "other")):
        h.observe(value, cap)
    got = samples(reg.render())
    assert (
        [
            ('{capability="echo",le="0.1"}', 1.0),
            ('{capability="echo",le="1"}', 2.0),
            ('{capability="echo",le="+Inf"}', 2.0),
            ('{capability="other",le="0.1"}', 0.0),
            ('{capability="other",le="1"}', 0.0),
            ('{capability="other",le="+Inf"}', 1.0),
        ],
        [('{capability="echo"}', 0.55), ('{capability="other"}', 5.0)],
        [('{capability="echo"}', 2.0), ('{capability="other"}', 1.0)],
    ) == (got["d_seconds_bucket"], got["d_seconds_sum"], got["d_seconds_count"])


def test_labels_in_promql() -> None:
    """Grouping and matched labels, not those Prometheus adds or a string's contents."""
    expr = (
        'histogram_quantile(0.99, sum by (le, capability) (rate(a_bucket{instance=~"$i",'
        ' code!="x{y=1}"}[5m]))) / sum by(instance) (b)'
    )
    assert {"capability", "code"} == labels_in(expr)


def test_label_set_maps_unknown_values_to_other() -> None:
    """Known values label themselves; everything else is `other`."""
    known = LabelSet({"echo", "llm.chat"}.__contains__)
    assert ["echo", "other", "other"] == [known("echo"), known("echo2"), known("")]


def test_process_series_describe_this_process() -> None:
    """CPU, RSS, open fds, start time and build read what the kernel says of this process."""
    reg = MetricsRegistry()
    register_process_metrics(reg)
    got = {name: values[0] for name, values in samples(reg.render()).items()}
    started = got["process_start_time_seconds"][1]
    assert (
        True,
        True,
        len(os.listdir("/proc/self/fd")),
        True,
        (f'{{version="{__version__}",python="{platform.python_version()}"}}', 1.0),
    ) == (
        0 < got["process_cpu_seconds_total"][1] <= time.process_time() + 1,
        got["process_resident_memory_bytes"][1] > 10 * 2**20,
        int(got["process_open_fds"][1]),  # both listings count their own descriptor
        time.time() - 86_400 * 7 < started <= time.time(),
        got["hearthnet_build_info"],
    )


async def test_every_dashboard_series_is_exported(make_config: MakeConfig) -> None:
    """Each series the Grafana dashboard queries is in a real node's /metrics, on a relay
    that is also a relayed member after one call: no panel reads a name we do not export,
    groups by a label the series lacks, or takes the rate of a series not a counter."""
    wanted = set().union(*map(series_in, dashboard_queries(json.loads(DASHBOARD.read_text()))))
    config = make_config(mesh={"relay": True, "relay_urls": [UNREACHABLE_RELAY]})
    async with Node(config) as node, aiohttp.ClientSession() as http:
        from hearthnet.client import Client  # noqa: PLC0415 - only this test calls

        async with Client(node.url, keys=node.keys) as client:
            await client.call("echo@1.0", 1)
        async with http.get(node.url + "/metrics") as resp:
            text = await resp.text()
            exported = families(text)
        # each panel groups by (or matches) labels its series have
        unlabelled = []
        for expr in dashboard_queries(json.loads(DASHBOARD.read_text())):
            have: set[str] = set()
            for name in series_in(expr):
                base = re.sub(r"_(?:bucket|sum|count)$", "", name)
                have.update(node.metrics.labelnames(name) or node.metrics.labelnames(base) or ())
            unlabelled += [(expr, label) for label in sorted(labels_in(expr) - have)]
    # rate() and increase() are for counters: each such series is declared one (a
    # histogram's _bucket, _sum and _count are counters too)
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))
    rated = {
        m[1]
        for expr in dashboard_queries(json.loads(DASHBOARD.read_text()))
        for m in re.finditer(r"\b(?:rate|irate|increase)\(\s*([a-zA-Z_:][\w:]*)", expr)
    }
    not_counters = sorted(
        name
        for name in rated
        if types.get(name) != "counter"
        and types.get(re.sub(r"_(?:bucket|sum|count)$", "", name)) != "histogram"
    )
    assert set() == wanted - exported
    assert len(wanted) > 25
    assert [] == unlabelled
    assert [] == not_counters
