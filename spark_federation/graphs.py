"""Components of the window graphs and the partition rows, on the driver (spec §10).

Spark reduces the windows to a fingerprint each and collects the vertices and edges
of one window per distinct fingerprint: a few graphs of a few dozen nodes. Their
components are a union-find here, and every window's row (its components, their
sizes and members) is read off its representative's. No Spark in this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

Component = tuple[int, ...]  # node ids, ascending


def components_of(vertices: Iterable[int], edges: Iterable[tuple[int, int]]) -> list[Component]:
    """The connected components of one graph, each as its sorted node ids, ordered by
    their smallest id.

    Args:
        vertices: node ids of the graph.
        edges: pairs of node ids; both ends must be vertices.

    Raises:
        ValueError: an edge names a node that is not a vertex.
    """
    parent = {v: v for v in vertices}

    def root(v: int) -> int:
        top = v
        while parent[top] != top:
            top = parent[top]
        while parent[v] != top:  # path compression: every node on the way points at the root
            parent[v], v = top, parent[v]
        return top

    for a, b in edges:
        if a not in parent or b not in parent:
            raise ValueError(f"edge ({a}, {b}) has an end that is not a vertex")
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)  # the smallest id stays the root
    members: dict[int, list[int]] = {}
    for v in parent:
        members.setdefault(root(v), []).append(v)
    return [tuple(sorted(members[r])) for r in sorted(members)]


@dataclass(frozen=True, slots=True)
class WindowComponents:
    """One window's graph split into components (``components`` ordered by smallest id)."""

    win: int
    components: Sequence[Component]

    @property
    def sizes(self) -> list[int]:
        """Component sizes, largest first."""
        return sorted((len(c) for c in self.components), reverse=True)


def every_window(
    rep_of: Mapping[int, int], graphs: Mapping[int, Sequence[Component]]
) -> list[WindowComponents]:
    """Each window with its representative's components, ordered by window.

    Args:
        rep_of: window → the window whose graph it shares.
        graphs: representative window → its components (:func:`components_of`).
    """
    return [WindowComponents(w, graphs[rep_of[w]]) for w in sorted(rep_of)]


@dataclass(frozen=True, slots=True)
class PartitionEvent:
    """A run of consecutive partitioned windows, ``[start_ms, end_ms)``."""

    start_ms: int
    end_ms: int
    windows: int
    components: int
    sizes: list[int]


def partition_events(windows: Sequence[WindowComponents], window_ms: int) -> list[PartitionEvent]:
    """Runs of consecutive windows with more than one component.

    ``components`` is the most seen in the run and ``sizes`` those of its first window
    with that many, so a node going down mid-partition does not split the event.

    Args:
        windows: per window, ordered by window (:func:`every_window`).
        window_ms: window width; windows ``window_ms`` apart belong to one run.
    """
    events: list[PartitionEvent] = []
    run: list[WindowComponents] = []

    def close() -> None:
        if run:
            most = max(run, key=lambda w: (len(w.components), -w.win))
            events.append(
                PartitionEvent(
                    run[0].win,
                    run[-1].win + window_ms,
                    len(run),
                    len(most.components),
                    most.sizes,
                )
            )
            run.clear()

    for w in windows:
        if len(w.components) < 2:
            continue
        if run and w.win - run[-1].win > window_ms:
            close()
        run.append(w)
    close()
    return events
