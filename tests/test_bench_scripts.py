"""The in-process benchmarks still run against the current log, at a tiny size.

Their numbers are quoted in docs/benchmarks.md; these checks only keep the scripts
working as the code under them changes (a timing is never asserted).
"""

from __future__ import annotations

import argparse

from bench import bench_publish_cost, bench_read_last


async def test_publish_cost_measures_every_publish_through_the_log() -> None:
    opts = argparse.Namespace(messages=120, batch=40, sync=["full", "normal"])
    result = await bench_publish_cost.run(opts)
    assert [(r["sync"], r["messages"], r["batch"]) for r in result["log"]] == [
        ("full", 120, 40),
        ("normal", 120, 40),
    ]
    assert result["sign_cpu_us"] > 0
    assert result["envelope_cpu_us"] > 0
    assert all(r["cpu_us_per_message"] > 0 for r in result["log"])


async def test_read_last_finds_the_newest_rooms() -> None:
    opts = argparse.Namespace(rooms=30, busy=500, last=[5, 30, 100], repeat=1)
    result = await bench_read_last.run(opts)
    assert result["log_messages"] == 530
    assert [r["rows"] for r in result["runs"]] == [5, 30, 30]
