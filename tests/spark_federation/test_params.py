"""Durations, times, window arithmetic and session sizing (pure; no Spark session)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_federation.errors import MeshHealthError
from spark_federation.params import (
    JobConfig,
    full_windows,
    parse_duration_ms,
    parse_time_ms,
    window_start_ms,
)
from spark_federation.session import LARGE_INPUT_JVM, SMALL_INPUT_JVM, local_cores, settings_for

WINDOWS = st.sampled_from([10_000, 15_000, 30_000, 60_000, 300_000, 3_600_000])
TIMES = st.integers(min_value=0, max_value=4_102_444_800_000)  # up to 2100


@given(st.integers(min_value=1, max_value=10_000), st.sampled_from(["ms", "s", "m", "h", "d"]))
def test_duration_units(n: int, unit: str) -> None:
    """An integer with a unit parses to that many milliseconds."""
    scale = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}[unit]
    assert n * scale == parse_duration_ms(f"{n}{unit}")


@pytest.mark.parametrize("text", ["", "0m", "5", "1.5h", "-1m", "1w"])
def test_bad_durations(text: str) -> None:
    """Zero, fractions, negatives, a missing or unknown unit are refused."""
    with pytest.raises(MeshHealthError):
        parse_duration_ms(text)


def test_time_forms() -> None:
    """A duration counts back from now; Unix ms and ISO-8601 (zone-less = UTC) are absolute."""
    assert parse_time_ms("1h", now_ms=1_000_000) == 1_000_000 - 3_600_000
    assert parse_time_ms("1763800000123") == 1_763_800_000_123
    assert parse_time_ms("2025-11-22T08:00:00") == 1_763_798_400_000
    assert parse_time_ms("2025-11-22T08:00:00Z") == 1_763_798_400_000


@given(TIMES, WINDOWS)
def test_window_start_holds_the_time(ts: int, window: int) -> None:
    """The window start is aligned and the time falls inside its window."""
    start = window_start_ms(ts, window)
    assert (start % window, start <= ts < start + window) == (0, True)


@given(TIMES, st.integers(min_value=0, max_value=10 * 86_400_000), WINDOWS)
def test_full_windows_are_covered(first: int, length: int, window: int) -> None:
    """Chosen windows are aligned, ordered, and inside the data (give or take one heartbeat)."""
    last = first + length
    lo, hi = full_windows(first, last, window)
    assert (lo % window, hi % window) == (0, 0)
    assert lo <= hi
    if length >= 2 * window:
        assert (lo + 5_000 >= first, hi + window - 5_000 <= last) == (True, True)


@pytest.mark.parametrize(
    ("window", "message"), [(1_000, "shorter than"), (7 * 60_000, "does not divide")]
)
def test_bad_windows(window: int, message: str) -> None:
    """Windows shorter than a heartbeat or not dividing an hour are refused with a reason."""
    with pytest.raises(MeshHealthError, match=message):
        JobConfig("in", "out", window_ms=window)


def test_generated_code_is_left_out_only_for_tiny_inputs() -> None:
    """Interpreted rows cost ~10x generated ones: a million records (~15 MB) keep the
    generated code and only get the quick JIT (and classes loaded unverified); a tiny
    input also runs without generated code; a large or unknown one keeps Spark's
    settings and gets the parallel collector."""
    no_codegen = "spark.sql.codegen.factoryMode"
    assert [
        (["-XX:TieredStopAtLevel=1", SMALL_INPUT_JVM], True),
        (["-XX:TieredStopAtLevel=1", SMALL_INPUT_JVM], False),
        ([LARGE_INPUT_JVM], False),
        ([LARGE_INPUT_JVM], False),
    ] == [
        (jit, no_codegen in conf)
        for jit, conf in map(settings_for, (300_000, 15_528_877, 131_000_000, None))
    ]


def test_large_input_is_read_in_even_tasks_a_core() -> None:
    """A large or unknown input is read in 8 tasks a core of the local master (Spark's own
    packing gave the benchmark's 100 files 5 tasks on 2 cores); a small one keeps Spark's."""
    split = "spark.sql.files.minPartitionNum"
    assert (["16", "32", "16", None], [1, 2, 3]) == (
        [
            settings_for(131_000_000, 2)[1].get(split),
            settings_for(131_000_000, 4)[1].get(split),
            settings_for(None, 2)[1].get(split),
            settings_for(15_528_877, 2)[1].get(split),
        ],
        [local_cores(m) for m in ("local", "local[2]", "local[3,2]")],
    )
