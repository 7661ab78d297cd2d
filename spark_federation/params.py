"""Job parameters and the pure arithmetic the pipeline relies on (no Spark here).

Durations are written like the node's CLI flags (``--since 24h``): an integer
followed by ``ms``, ``s``, ``m``, ``h`` or ``d``. Times on the wire are Unix
milliseconds (spec §1.1), and so is every ``*_ms`` value here.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from spark_federation.errors import MeshHealthError

HOUR_MS = 3_600_000
HEARTBEAT_MS = 5_000  # spec §7.5: a ping every 5 s per link
MISSES_TO_DOWN = 3  # spec §7.5: three missed pongs mark a link down

_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": HOUR_MS, "d": 24 * HOUR_MS}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")


def parse_duration_ms(text: str) -> int:
    """Parse ``"90s"``, ``"1m"``, ``"24h"`` into milliseconds.

    Raises:
        MeshHealthError: the text is not a positive integer with a unit.
    """
    match = _DURATION.match(text)
    if match is None or int(match.group(1)) == 0:
        raise MeshHealthError(
            f"bad duration {text!r}: expected a positive integer with a unit ms|s|m|h|d, e.g. 1m"
        )
    return int(match.group(1)) * _UNIT_MS[match.group(2)]


def parse_time_ms(text: str, *, now_ms: int | None = None) -> int:
    """Parse a point in time: a duration back from now (``24h``), Unix ms, or ISO-8601.

    ISO-8601 without a zone is taken as UTC, so the same flag means the same
    instant on every machine of a cluster.

    Raises:
        MeshHealthError: the text is none of the three forms.
    """
    stripped = text.strip()
    if _DURATION.match(stripped):
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return now - parse_duration_ms(stripped)
    if stripped.isdigit():
        return int(stripped)
    try:
        parsed = datetime.fromisoformat(stripped.replace("Z", "+00:00"))
    except ValueError:
        raise MeshHealthError(
            f"bad time {text!r}: expected a duration back from now (24h), Unix ms or ISO-8601"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


def window_start_ms(ts_ms: int, window_ms: int) -> int:
    """The start of the window holding ``ts_ms``: the Python twin of the Spark expression.

    Windows are aligned to the Unix epoch, so every node and every run cut time
    the same way; ``pmod`` in Spark and ``%`` here both floor towards minus infinity.
    """
    return ts_ms - ts_ms % window_ms


def full_windows(
    first_ts_ms: int, last_ts_ms: int, window_ms: int, slack_ms: int = HEARTBEAT_MS
) -> tuple[int, int]:
    """The first and the last window start covered by ``[first_ts_ms, last_ts_ms]``.

    Windows cut by the start or the end of the data hold a sliver of evidence,
    which would read as an outage or a partition; the job leaves them out of
    availability and partition verdicts. A window counts as covered when the data
    reaches to within ``slack_ms`` (one heartbeat) of its edges, since no record
    can be expected closer than that. When the data covers no whole window, the
    windows it touches are used instead, so short inputs still give answers.
    """
    first = window_start_ms(first_ts_ms, window_ms)
    if first + slack_ms < first_ts_ms:
        first += window_ms
    last = window_start_ms(last_ts_ms, window_ms)
    if last + window_ms - slack_ms > last_ts_ms:
        last -= window_ms
    if last < first:
        return window_start_ms(first_ts_ms, window_ms), window_start_ms(last_ts_ms, window_ms)
    return first, last


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Verdict thresholds; each default is argued in docs/mesh-health.md.

    Attributes:
        flap_threshold: down→up cycles of one link within any hour that make it flapping.
        skew_threshold_ms: |estimated clock offset| above which a node is reported skewed.
    """

    flap_threshold: int = 3
    skew_threshold_ms: float = 500.0


@dataclass(frozen=True, slots=True)
class JobConfig:
    """What one run of the job reads, how it cuts time, and where it writes.

    Attributes:
        input_uri: directory (local path or Hadoop-compatible URI) holding export dirs.
        out_dir: local directory for summary.json, report.html and charts.
        tables_uri: where the Parquet tables go; defaults to ``out_dir/tables``.
        window_ms: width of the analysis window (default one minute).
        since_ms: ignore records before this time (None: no lower bound).
        until_ms: ignore records at or after this time (None: no upper bound).
        thresholds: verdict thresholds.
        report: whether to draw report.html and its charts.
    """

    input_uri: str
    out_dir: str
    tables_uri: str | None = None
    window_ms: int = 60_000
    since_ms: int | None = None
    until_ms: int | None = None
    thresholds: Thresholds = Thresholds()
    report: bool = True

    def __post_init__(self) -> None:
        if self.window_ms < HEARTBEAT_MS:
            raise MeshHealthError(
                f"window {self.window_ms} ms is shorter than the {HEARTBEAT_MS} ms heartbeat:"
                " every window would look like an outage; use --window 10s or more"
            )
        if HOUR_MS % self.window_ms != 0:
            raise MeshHealthError(
                f"window {self.window_ms} ms does not divide an hour; hourly tables need"
                " whole windows (use 10s, 15s, 30s, 1m, 2m, 5m, 10m, 15m, 30m or 1h)"
            )
        if (
            self.since_ms is not None
            and self.until_ms is not None
            and self.since_ms >= self.until_ms
        ):
            raise MeshHealthError("--since must be before --until")
        if self.thresholds.flap_threshold < 1:
            raise MeshHealthError("--flap-threshold must be at least 1")
