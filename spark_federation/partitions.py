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
is never collected to the driver. Checkpoints are lazy: the one job a round needs
(counting the labels that changed) computes and keeps them, instead of a job to
write each checkpoint and another to read it.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import DataFrame
from pyspark.sql import functions as sf

from spark_federation.errors import MeshHealthError
from spark_federation.params import MISSES_TO_DOWN
from spark_federation.timeline import runs


def window_edges(lw: DataFrame) -> DataFrame:
    """Undirected links that worked in each window: ``a, b, win`` with ``a < b``.

    Args:
        lw: per-link window counts (:func:`spark_federation.links.link_windows`).
    """
    return (
        lw.where(sf.col("pongs") + sf.col("ups") > 0)
        .select(
            sf.least("nid", "pid").alias("a"),
            sf.greatest("nid", "pid").alias("b"),
            "win",
        )
        .distinct()
        .select("a", "b", "win")
    )


def window_vertices(edges: DataFrame, evidence: DataFrame) -> DataFrame:
    """Nodes that are vertices of each window's graph: ``nid, win`` (see module docstring)."""
    endpoints = edges.select(sf.col("a").alias("nid"), "win").unionByName(
        edges.select(sf.col("b").alias("nid"), "win")
    )
    cut_off = evidence.where(
        (sf.col("downs") > 0) | (sf.col("misses") >= MISSES_TO_DOWN) | (sf.col("beacons") > 0)
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
        edges.select(sf.col("a").alias("src"), sf.col("b").alias("dst"), "win")
        .unionByName(edges.select(sf.col("b").alias("src"), sf.col("a").alias("dst"), "win"))
        .localCheckpoint(eager=False)
    )
    labels = vertices.select("nid", "win", sf.col("nid").alias("label")).localCheckpoint(
        eager=False
    )
    for rounds in range(1, max_iterations + 1):
        mine = labels.alias("m")
        from_neighbours = arcs.join(
            mine, (sf.col("src") == sf.col("m.nid")) & (arcs["win"] == sf.col("m.win")), how="inner"
        ).select(
            sf.col("dst").alias("nid"), arcs["win"].alias("win"), sf.col("m.label").alias("label")
        )
        hop = labels.alias("h")
        jumped = mine.join(
            hop,
            (sf.col("m.label") == sf.col("h.nid")) & (sf.col("m.win") == sf.col("h.win")),
            how="inner",
        ).select(
            sf.col("m.nid").alias("nid"),
            sf.col("m.win").alias("win"),
            sf.col("h.label").alias("label"),
        )
        best = (
            labels.unionByName(from_neighbours)
            .unionByName(jumped)
            .groupBy("nid", "win")
            .agg(sf.min("label").alias("label"))
        )
        updated = (
            best.join(labels.withColumnRenamed("label", "old"), on=["nid", "win"], how="inner")
            .select("nid", "win", "label", (sf.col("label") < sf.col("old")).alias("changed"))
            .localCheckpoint(eager=False)
        )
        # this count is the round's job: it computes the checkpoint the next round reads
        changed = updated.where(sf.col("changed")).count()
        labels = updated.select("nid", "win", "label")
        if on_round is not None:
            on_round(rounds, changed)
        if changed == 0:
            return labels, rounds
    raise MeshHealthError(
        f"connected components did not converge in {max_iterations} rounds;"
        " the mesh diameter is larger than expected: raise --max-iterations"
    )


def distinct_graphs(vertices: DataFrame, edges: DataFrame) -> DataFrame:
    """Map every window to a representative window with the very same graph: ``win, rep``.

    A window's graph is fingerprinted by the XOR and the count of its vertex ids'
    and its edges' hashes: order-independent, so it is a plain hash aggregate
    (no lists, no sorting). Windows with equal fingerprints share their
    components, so label propagation runs once per distinct graph instead of once
    per window (a steady mesh has a handful of distinct graphs in thousands of
    windows). Two different graphs sharing a 64-bit fingerprint is a ~1e-19 chance.
    """
    vsig = vertices.groupBy("win").agg(
        sf.bit_xor(sf.xxhash64("nid")).alias("vx"), sf.count(sf.lit(1)).alias("vn")
    )
    esig = edges.groupBy("win").agg(
        sf.bit_xor(sf.xxhash64("a", "b")).alias("ex"), sf.count(sf.lit(1)).alias("en")
    )
    sig = vsig.join(esig, on="win", how="left").select(
        "win",
        sf.xxhash64(
            "vx", "vn", sf.coalesce(sf.col("ex"), sf.lit(0)), sf.coalesce(sf.col("en"), sf.lit(0))
        ).alias("sig"),
    )
    reps = sig.groupBy("sig").agg(sf.min("win").alias("rep"))
    return sig.join(reps, on="sig", how="inner").select("win", "rep")


def window_components(
    vertices: DataFrame,
    edges: DataFrame,
    max_iterations: int,
    on_round: Callable[[int, int], None] | None = None,
) -> tuple[DataFrame, int, int]:
    """:func:`connected_components` of every window, computed once per distinct graph.

    Returns:
        (``nid, win, label``, rounds taken, number of distinct graphs).
    """
    rep = distinct_graphs(vertices, edges).localCheckpoint(eager=False)
    reps = rep.where(sf.col("win") == sf.col("rep")).select("win")
    graphs = reps.count()  # computes the checkpoint of ``rep``
    labels, rounds = connected_components(
        vertices.join(reps, on="win", how="inner").select("nid", "win"),
        edges.join(reps, on="win", how="inner").select("a", "b", "win"),
        max_iterations,
        on_round,
    )
    spread = rep.join(labels.withColumnRenamed("win", "rep"), on="rep", how="inner").select(
        "nid", "win", "label"
    )
    return spread, rounds, graphs


def components(labels: DataFrame) -> DataFrame:
    """Per window and component: ``win, label, size, members`` (members as node ids)."""
    return (
        labels.groupBy("win", "label")
        .agg(
            sf.count(sf.lit(1)).alias("size"),
            sf.sort_array(sf.collect_list("nid")).alias("members"),
        )
        .select("win", "label", "size", "members")
    )


def window_partitions(comps: DataFrame) -> DataFrame:
    """Per window: ``win, components, sizes`` (largest first), ``nodes_up``."""
    return (
        comps.groupBy("win")
        .agg(
            sf.count(sf.lit(1)).alias("components"),
            sf.sort_array(sf.collect_list("size"), asc=False).alias("sizes"),
            sf.sum("size").alias("nodes_up"),
        )
        .select("win", "components", "sizes", "nodes_up")
    )


def partition_events(per_window: DataFrame, window_ms: int) -> DataFrame:
    """Runs of partitioned windows: ``start_ms, end_ms, windows, components, sizes``.

    ``components`` is the most seen in the run and ``sizes`` those of its first
    window with that many, so a node going down mid-partition does not split the event.
    """
    split = per_window.where(sf.col("components") > 1)
    events = runs(split.select("win"), [], window_ms)
    detail = split.alias("w").join(
        events.alias("e"),
        (sf.col("w.win") >= sf.col("e.start_ms")) & (sf.col("w.win") < sf.col("e.end_ms")),
        how="inner",
    )
    return (
        detail.groupBy("e.start_ms", "e.end_ms", "e.windows")
        .agg(
            sf.max("w.components").alias("components"),
            sf.max_by("w.sizes", sf.struct(sf.col("w.components"), -sf.col("w.win"))).alias(
                "sizes"
            ),
        )
        .select("start_ms", "end_ms", "windows", "components", "sizes")
    )
