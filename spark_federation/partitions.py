"""Connected components of the up-link graph per window, and partition events (spec §10).

Per window, the vertices are the nodes up in it and the edges the links that
worked in it (a pong, or a link coming up, in either direction). The mesh is
*partitioned* in a window when that graph has more than one component; a node
that is down is not a vertex, so an outage is never a partition. A node with no
working link is a vertex only if it showed it was cut off (a link closed, three
misses, or a beacon): a node with a sliver of records at the edge of its export
is left out rather than reported as a partition of one.

Components are computed in Spark by min-label propagation with pointer jumping
(each round a vertex takes the smallest label among itself, its neighbours and
its label's label), checkpointed each round, until no label changes. The graph
is never collected to the driver.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_federation.errors import MeshHealthError
from spark_federation.params import MISSES_TO_DOWN
from spark_federation.schema import LINK_UP, PONG
from spark_federation.timeline import runs, window_of


def window_edges(hb: DataFrame, window_ms: int) -> DataFrame:
    """Undirected links that worked in each window: ``a, b, win`` with ``a < b``."""
    return (
        hb.where(F.col("kind").isin(PONG, LINK_UP))
        .select(
            F.least("nid", "pid").alias("a"),
            F.greatest("nid", "pid").alias("b"),
            window_of(F.col("ts"), window_ms).alias("win"),
        )
        .distinct()
        .select("a", "b", "win")
    )


def window_vertices(edges: DataFrame, evidence: DataFrame) -> DataFrame:
    """Nodes that are vertices of each window's graph: ``nid, win`` (see module docstring)."""
    endpoints = edges.select(F.col("a").alias("nid"), "win").unionByName(
        edges.select(F.col("b").alias("nid"), "win")
    )
    cut_off = evidence.where(
        (F.col("downs") > 0) | (F.col("misses") >= MISSES_TO_DOWN) | (F.col("beacons") > 0)
    ).select("nid", "win")
    return endpoints.unionByName(cut_off).distinct().select("nid", "win")


def connected_components(
    vertices: DataFrame,
    edges: DataFrame,
    max_iterations: int,
    on_round: Callable[[int, int], None] | None = None,
) -> tuple[DataFrame, int]:
    """Label every (node, window) with the smallest node id of its component.

    Args:
        vertices: ``nid, win``.
        edges: ``a, b, win``; both ends must be vertices of that window.
        max_iterations: bound on rounds; reaching it without converging raises.
        on_round: called with (round, labels changed) after each round, for progress.

    Returns:
        (``nid, win, label`` checkpointed, rounds taken).

    Raises:
        MeshHealthError: labels still changed after ``max_iterations`` rounds.
    """
    arcs = (
        edges.select(F.col("a").alias("src"), F.col("b").alias("dst"), "win")
        .unionByName(edges.select(F.col("b").alias("src"), F.col("a").alias("dst"), "win"))
        .localCheckpoint(eager=True)
    )
    labels = vertices.select("nid", "win", F.col("nid").alias("label")).localCheckpoint(eager=True)
    for rounds in range(1, max_iterations + 1):
        mine = labels.alias("m")
        from_neighbours = arcs.join(
            mine, (F.col("src") == F.col("m.nid")) & (arcs["win"] == F.col("m.win")), how="inner"
        ).select(F.col("dst").alias("nid"), arcs["win"].alias("win"), F.col("m.label").alias("label"))
        hop = labels.alias("h")
        jumped = mine.join(
            hop, (F.col("m.label") == F.col("h.nid")) & (F.col("m.win") == F.col("h.win")), how="inner"
        ).select(F.col("m.nid").alias("nid"), F.col("m.win").alias("win"), F.col("h.label").alias("label"))
        best = (
            labels.unionByName(from_neighbours)
            .unionByName(jumped)
            .groupBy("nid", "win")
            .agg(F.min("label").alias("label"))
        )
        updated = (
            best.join(labels.withColumnRenamed("label", "old"), on=["nid", "win"], how="inner")
            .select("nid", "win", "label", (F.col("label") < F.col("old")).alias("changed"))
            .localCheckpoint(eager=True)
        )
        changed = updated.where(F.col("changed")).count()
        labels = updated.select("nid", "win", "label")
        if on_round is not None:
            on_round(rounds, changed)
        if changed == 0:
            return labels, rounds
    raise MeshHealthError(
        f"connected components did not converge in {max_iterations} rounds;"
        " the mesh diameter is larger than expected: raise --max-iterations"
    )


def components(labels: DataFrame) -> DataFrame:
    """Per window and component: ``win, label, size, members`` (members as node ids)."""
    return (
        labels.groupBy("win", "label")
        .agg(F.count(F.lit(1)).alias("size"), F.sort_array(F.collect_list("nid")).alias("members"))
        .select("win", "label", "size", "members")
    )


def window_partitions(comps: DataFrame) -> DataFrame:
    """Per window: ``win, components, sizes`` (largest first), ``nodes_up``."""
    return (
        comps.groupBy("win")
        .agg(
            F.count(F.lit(1)).alias("components"),
            F.sort_array(F.collect_list("size"), asc=False).alias("sizes"),
            F.sum("size").alias("nodes_up"),
        )
        .select("win", "components", "sizes", "nodes_up")
    )


def partition_events(per_window: DataFrame, window_ms: int) -> DataFrame:
    """Runs of partitioned windows: ``start_ms, end_ms, windows, components, sizes``.

    ``components`` is the most seen in the run and ``sizes`` those of its first
    window with that many, so a node going down mid-partition does not split the event.
    """
    split = per_window.where(F.col("components") > 1)
    events = runs(split.select("win"), [], window_ms)
    detail = split.alias("w").join(
        events.alias("e"),
        (F.col("w.win") >= F.col("e.start_ms")) & (F.col("w.win") < F.col("e.end_ms")),
        how="inner",
    )
    return (
        detail.groupBy("e.start_ms", "e.end_ms", "e.windows")
        .agg(
            F.max("w.components").alias("components"),
            F.max_by("w.sizes", F.struct(F.col("w.components"), -F.col("w.win"))).alias("sizes"),
        )
        .select("start_ms", "end_ms", "windows", "components", "sizes")
    )
