"""Comparing the job's verdicts with the generator's injected events, to the window."""

from __future__ import annotations

from typing import Any

from spark_federation.synth import InjectedEvent, SynthResult


def within_window(detected_ms: int, true_ms: int, window_ms: int) -> bool:
    """Whether a detected edge is within one window of the true time."""
    return abs(detected_ms - true_ms) <= window_ms


def expected_flaps(synth: SynthResult, a: str, b: str) -> int:
    """Down→up cycles of link a-b: its injected flaps plus those its ends' outages and
    partitions that cut it forced (each closes and reopens the link once)."""
    flap = [e for e in synth.of_kind("flapping_link") if set(e.nodes) == {a, b}]
    total = int(flap[0].value or 0) if flap else 0
    total += sum(1 for e in synth.of_kind("node_down") if e.nodes[0] in (a, b))
    for p in synth.of_kind("partition"):
        side = set(p.groups[0])
        if (a in side) != (b in side):
            total += 1
    return total


def match_outage(event: InjectedEvent, outages: list[dict[str, Any]], window_ms: int) -> bool:
    """Whether exactly one reported outage of the event's node matches its start and end."""
    mine = [o for o in outages if o["node"] == event.nodes[0]]
    assert event.start_ms is not None
    assert event.end_ms is not None
    return len(mine) == 1 and (
        within_window(mine[0]["start_ms"], event.start_ms, window_ms)
        and within_window(mine[0]["end_ms"], event.end_ms, window_ms)
    )
