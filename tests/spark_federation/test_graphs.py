"""Components of window graphs and partition events on the driver: known answers, no Spark."""

from __future__ import annotations

import random

import pytest

from spark_federation.graphs import (
    PartitionEvent,
    WindowComponents,
    components_of,
    every_window,
    partition_events,
)

W = 60_000


def test_a_path_is_one_component_and_a_split_graph_three() -> None:
    """A path 6-5-4-3-2-1 is one component; two pairs and a loner are three."""
    path = components_of(range(1, 7), [(6, 5), (5, 4), (4, 3), (3, 2), (2, 1)])
    split = components_of([1, 2, 3, 4, 9], [(3, 4), (1, 2)])
    assert ([(1, 2, 3, 4, 5, 6)], [(1, 2), (3, 4), (9,)]) == (path, split)


def test_negative_ids_order_like_spark_longs() -> None:
    """Node ids are signed 64-bit hashes: members and components sort numerically."""
    assert [(-(2**63), 5), (-7, 2**63 - 1)] == components_of(
        [5, 2**63 - 1, -7, -(2**63)], [(5, -(2**63)), (2**63 - 1, -7)]
    )


def test_an_edge_to_a_missing_vertex_is_refused() -> None:
    with pytest.raises(ValueError, match="not a vertex"):
        components_of([1, 2], [(1, 3)])


def test_random_graphs_match_a_search() -> None:
    """Random graphs (isolated nodes, several components, long chains) give the
    components a breadth-first search finds."""
    rnd = random.Random(3)
    for _ in range(200):
        nodes = rnd.sample(range(-500, 500), rnd.randint(1, 40))
        edges: list[tuple[int, int]] = []
        for _ in range(rnd.randint(0, len(nodes)) if len(nodes) > 1 else 0):
            a, b = rnd.sample(nodes, 2)
            edges.append((a, b))
        near: dict[int, set[int]] = {n: set() for n in nodes}
        for a, b in edges:
            near[a].add(b)
            near[b].add(a)
        seen: set[int] = set()
        expected = []
        for n in sorted(nodes):
            if n in seen:
                continue
            todo, comp = [n], {n}
            while todo:
                for m in near[todo.pop()] - comp:
                    comp.add(m)
                    todo.append(m)
            seen |= comp
            expected.append(tuple(sorted(comp)))
        assert expected == components_of(nodes, edges)


def _w(win: int, *sizes: int) -> WindowComponents:
    start = 0
    comps = []
    for s in sizes:
        comps.append(tuple(range(start, start + s)))
        start += s
    return WindowComponents(win * W, comps)


def test_every_window_takes_its_representatives_components() -> None:
    found: dict[int, list[tuple[int, ...]]] = {0: [(1, 2)], 3 * W: [(1,), (2,)]}
    windows = every_window({5 * W: 0, 0: 0, 3 * W: 3 * W, 4 * W: 3 * W}, found)
    assert [(0, [2]), (3 * W, [1, 1]), (4 * W, [1, 1]), (5 * W, [2])] == [
        (w.win, w.sizes) for w in windows
    ]


def test_events_merge_consecutive_split_windows() -> None:
    """Windows 1-3 split (three components at 2, the first such window), 4 whole, 5 split,
    7 split after a window without a vertex: three events."""
    windows = [
        _w(0, 5),
        _w(1, 3, 2),
        _w(2, 2, 2, 1),
        _w(3, 1, 2, 2),
        _w(4, 5),
        _w(5, 4, 1),
        _w(7, 4, 1),
    ]
    assert [
        PartitionEvent(1 * W, 4 * W, 3, 3, [2, 2, 1]),
        PartitionEvent(5 * W, 6 * W, 1, 2, [4, 1]),
        PartitionEvent(7 * W, 8 * W, 1, 2, [4, 1]),
    ] == partition_events(windows, W)


def test_no_split_window_no_event() -> None:
    assert [] == partition_events([_w(0, 5), _w(1, 5)], W)
