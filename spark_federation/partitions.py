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
its label's label) until no label changes. Each window's graph is one row (its
vertices and adjacency as arrays) and the rounds are array expressions on it, so
all windows' rounds are one Spark job rather than a few joins per round. The graph
is never collected to the driver.
"""

from __future__ import annotations

from collections.abc import Callable

from pyspark.sql import Column, DataFrame
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

    Each window's graph is one row (its sorted vertices, each vertex's neighbours as
    positions in that list), and min-label propagation with pointer jumping runs on
    it as array expressions, round after round until a round changes no label or the
    bound is reached: one Spark job for every window's rounds, where a join per round
    cost a few jobs each.

    Args:
        vertices: ``nid, win``.
        edges: ``a, b, win``; both ends must be vertices of that window.
        max_iterations: bound on rounds; reaching it without converging raises.
        on_round: called with (rounds taken, windows not converged) once they are known,
            for progress.

    Returns:
        (``nid, win, label`` checkpointed, rounds taken).

    Raises:
        MeshHealthError: labels still changed after ``max_iterations`` rounds.
    """
    graphs = (
        vertices.groupBy("win")
        .agg(sf.sort_array(sf.collect_set("nid")).alias("vs"))
        .join(
            edges.groupBy("win").agg(sf.collect_list(sf.struct("a", "b")).alias("es")),
            on="win",
            how="left",
        )
        .select("win", "vs", sf.coalesce("es", sf.array()).alias("es"))
    )
    # edges as 1-based positions into the window's vertices, then each vertex's neighbours
    at = graphs.select(
        "win",
        "vs",
        sf.transform(
            "es",
            lambda e: sf.struct(
                sf.array_position("vs", e["a"]).cast("int").alias("x"),
                sf.array_position("vs", e["b"]).cast("int").alias("y"),
            ),
        ).alias("ei"),
    )
    adjacent = at.select(
        "win",
        "vs",
        sf.transform(
            "vs",
            lambda _, i: sf.concat(
                sf.transform(sf.filter("ei", lambda e: e["x"] == i + 1), lambda e: e["y"]),
                sf.transform(sf.filter("ei", lambda e: e["y"] == i + 1), lambda e: e["x"]),
            ),
        ).alias("adj"),
    )

    def one_round(labels: Column) -> Column:
        # a vertex takes the smallest of its label, its label's label and its neighbours'
        # labels (labels are positions: the smallest position is the smallest node id)
        return sf.transform(
            labels,
            lambda x, i: sf.least(
                x,
                sf.element_at(labels, x),
                sf.array_min(
                    sf.transform(sf.element_at("adj", i + 1), lambda j: sf.element_at(labels, j))
                ),
            ),
        )

    def step(acc: Column, _: Column) -> Column:
        moved = sf.transform(
            sf.array(one_round(acc["l"])),
            lambda n: sf.struct(
                n.alias("l"), (n == acc["l"]).alias("done"), (acc["r"] + 1).alias("r")
            ),
        )[0]
        return sf.when(acc["done"], acc).otherwise(moved)

    start = sf.struct(
        sf.sequence(sf.lit(1), sf.size("vs")).alias("l"),
        sf.lit(False).alias("done"),
        sf.lit(0).alias("r"),
    )
    settled = adjacent.select(
        "win",
        "vs",
        sf.aggregate(sf.sequence(sf.lit(1), sf.lit(max_iterations)), start, step).alias("s"),
    ).localCheckpoint(eager=False)
    # this collect is the components' job: it computes the checkpoint the labels read
    [done] = settled.agg(
        sf.coalesce(sf.max(sf.col("s")["r"]), sf.lit(0)).alias("rounds"),
        sf.coalesce(sf.sum((~sf.col("s")["done"]).cast("long")), sf.lit(0)).alias("unsettled"),
    ).collect()
    rounds, unsettled = int(done["rounds"]), int(done["unsettled"])
    if on_round is not None:
        on_round(rounds, unsettled)
    if unsettled:
        raise MeshHealthError(
            f"connected components did not converge in {max_iterations} rounds;"
            " the mesh diameter is larger than expected: raise --max-iterations"
        )
    labels = settled.select("win", "vs", "s", sf.posexplode("vs").alias("p", "nid")).select(
        "nid",
        "win",
        sf.element_at("vs", sf.element_at(sf.col("s")["l"], sf.col("p") + 1)).alias("label"),
    )
    return labels, rounds


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
    # the representatives are a few rows: broadcast, so only their windows' vertices and
    # edges reach the shuffle that builds the graphs, not every window's
    only = sf.broadcast(reps)
    labels, rounds = connected_components(
        vertices.join(only, on="win", how="inner").select("nid", "win"),
        edges.join(only, on="win", how="inner").select("a", "b", "win"),
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
