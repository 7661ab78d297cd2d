"""Prometheus text-format metrics (spec §9), kept deliberately small and cheap.

Counters are plain dict increments; gauges read a callback at scrape time;
histograms keep cumulative buckets. ``MetricsRegistry.render()`` writes the
exposition format for ``GET /metrics``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable

LabelValues = tuple[str, ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: tuple[str, ...], values: LabelValues, extra: str = "") -> str:
    parts = [f'{n}="{_escape(v)}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _fmt(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


class Counter:
    """A monotonically increasing count, optionally labelled."""

    def __init__(self, name: str, help_text: str, labelnames: tuple[str, ...] = ()) -> None:
        self.name = name
        self.help = help_text
        self.labelnames = labelnames
        self.values: dict[LabelValues, float] = {} if labelnames else {(): 0.0}

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        """Add ``amount`` to the series with these label values."""
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def get(self, *labels: str) -> float:
        """Current value of one series."""
        return self.values.get(labels, 0.0)

    def total(self) -> float:
        """Sum over all series."""
        return sum(self.values.values())

    def render(self) -> Iterable[str]:
        """Exposition lines."""
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} counter"
        for labels, value in sorted(self.values.items()):
            yield f"{self.name}{_labels(self.labelnames, labels)} {_fmt(value)}"


class Gauge:
    """A value read from a callback at scrape time (one series per returned label tuple)."""

    TYPE = "gauge"

    def __init__(
        self,
        name: str,
        help_text: str,
        read: Callable[[], float | dict[LabelValues, float]],
        labelnames: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.help = help_text
        self.read = read
        self.labelnames = labelnames

    def render(self) -> Iterable[str]:
        """Exposition lines."""
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} {self.TYPE}"
        value = self.read()
        if isinstance(value, dict):
            for labels, v in sorted(value.items()):
                yield f"{self.name}{_labels(self.labelnames, labels)} {_fmt(v)}"
        else:
            yield f"{self.name} {_fmt(value)}"


class ReadCounter(Gauge):
    """A counter kept elsewhere (the kernel's CPU time, say), read at scrape time."""

    TYPE = "counter"


class Histogram:
    """Cumulative-bucket histogram of observations (seconds, by convention), optionally
    labelled: one set of buckets per label tuple, so the caller must keep the label values
    bounded (see :class:`LabelSet`)."""

    DEFAULT_BUCKETS = (
        0.0005,
        0.001,
        0.0025,
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        1,
        2.5,
        5,
        10,
        30,
    )

    def __init__(
        self,
        name: str,
        help_text: str,
        buckets: tuple[float, ...] = DEFAULT_BUCKETS,
        labelnames: tuple[str, ...] = (),
    ) -> None:
        self.name = name
        self.help = help_text
        self.bounds = tuple(sorted(buckets))
        self.labelnames = labelnames
        self.series: dict[LabelValues, _Buckets] = {}
        if not labelnames:
            self.series[()] = _Buckets(len(self.bounds))

    def observe(self, value: float, *labels: str) -> None:
        """Record one observation in the series with these label values."""
        series = self.series.get(labels)
        if series is None:
            series = self.series[labels] = _Buckets(len(self.bounds))
        series.counts[bisect.bisect_left(self.bounds, value)] += 1
        series.sum += value
        series.count += 1

    @property
    def count(self) -> int:
        """Observations over all series."""
        return sum(s.count for s in self.series.values())

    def render(self) -> Iterable[str]:
        """Exposition lines."""
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        for labels, series in sorted(self.series.items()):
            running = 0
            for bound, count in zip(self.bounds, series.counts, strict=False):
                running += count
                le = f'le="{_fmt(bound)}"'
                yield f"{self.name}_bucket{_labels(self.labelnames, labels, le)} {running}"
            inf = _labels(self.labelnames, labels, 'le="+Inf"')
            yield f"{self.name}_bucket{inf} {series.count}"
            plain = _labels(self.labelnames, labels)
            yield f"{self.name}_sum{plain} {_fmt(series.sum)}"
            yield f"{self.name}_count{plain} {series.count}"


class _Buckets:
    """One histogram series: per-bucket counts (the last is above every bound), sum, count."""

    __slots__ = ("count", "counts", "sum")

    def __init__(self, bounds: int) -> None:
        self.counts = [0] * (bounds + 1)
        self.sum = 0.0
        self.count = 0


class LabelSet:
    """Keeps a label's values bounded: a value in ``known()`` is itself, anything else is
    ``other``. Callers label series with names they read from a request (a capability,
    say); without this, each new name a caller sends would add a series forever."""

    OTHER = "other"

    def __init__(self, known: Callable[[str], bool]) -> None:
        self.known = known

    def __call__(self, value: str) -> str:
        """The label value to record for ``value``."""
        return value if self.known(value) else self.OTHER


class MetricsRegistry:
    """All metrics of one node, rendered in registration order."""

    def __init__(self) -> None:
        self._metrics: dict[str, Counter | Gauge | Histogram] = {}

    def counter(self, name: str, help_text: str, labelnames: tuple[str, ...] = ()) -> Counter:
        """Register (or return the existing) counter."""
        existing = self._metrics.get(name)
        if isinstance(existing, Counter):
            return existing
        metric = Counter(name, help_text, labelnames)
        self._metrics[name] = metric
        return metric

    def gauge(
        self,
        name: str,
        help_text: str,
        read: Callable[[], float | dict[LabelValues, float]],
        labelnames: tuple[str, ...] = (),
    ) -> Gauge:
        """Register a callback gauge (replacing one of the same name)."""
        metric = Gauge(name, help_text, read, labelnames)
        self._metrics[name] = metric
        return metric

    def read_counter(
        self,
        name: str,
        help_text: str,
        read: Callable[[], float | dict[LabelValues, float]],
        labelnames: tuple[str, ...] = (),
    ) -> ReadCounter:
        """Register a counter read from a callback (replacing one of the same name)."""
        metric = ReadCounter(name, help_text, read, labelnames)
        self._metrics[name] = metric
        return metric

    def histogram(
        self,
        name: str,
        help_text: str,
        buckets: tuple[float, ...] = Histogram.DEFAULT_BUCKETS,
        labelnames: tuple[str, ...] = (),
    ) -> Histogram:
        """Register (or return the existing) histogram."""
        existing = self._metrics.get(name)
        if isinstance(existing, Histogram):
            return existing
        metric = Histogram(name, help_text, buckets, labelnames)
        self._metrics[name] = metric
        return metric

    def labelnames(self, name: str) -> tuple[str, ...] | None:
        """The label names of metric ``name`` (a histogram's own name, not its
        ``_bucket``), or None when no such metric is registered."""
        metric = self._metrics.get(name)
        return None if metric is None else metric.labelnames

    def render(self) -> str:
        """The whole exposition document."""
        lines: list[str] = []
        for metric in self._metrics.values():
            lines.extend(metric.render())
        return "\n".join(lines) + "\n"
