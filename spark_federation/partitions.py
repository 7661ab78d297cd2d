"""Connected components of the up-link graph per window, and partition events (spec §10).

Per window, the vertices are the nodes up in it and the edges the links that
worked in it (a pong, or a link coming up, in either direction). The mesh is
*partitioned* in a window when that graph has more than one component; a node
that is down is not a vertex, so an outage is never a partition. A node with no
working link is a vertex only if it showed it was cut off (a link closed, three
misses, or a beacon): a node with a sliver of records at the edge of its export
is left out rather than reported as a partition of one.

Spark builds every window's vertices and edges and a fingerprint of each window's
graph; only one window per distinct fingerprint has its graph collected (a few
dozen nodes and links each), and the driver finds its components with a
union-find (:mod:`spark_federation.graphs`). A steady mesh has a handful of
distinct graphs in thousands of windows.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf
from pyspark.sql.types import ArrayType, LongType, StructField, StructType

from spark_federation import graphs
from spark_federation.params import MISSES_TO_DOWN


def working_links(lw: DataFrame) -> DataFrame:
    """Undirected links that worked in each window, as often as the link windows' rows
    show it (both directions, a window split across rows): ``a, b, win`` with ``a < b``.

    Args:
        lw: per-link window counts (:func:`spark_federation.links.link_windows`).
    """
    return lw.where(sf.col("pongs") + sf.col("ups") > 0).select(
        sf.least("nid", "pid").alias("a"),
        sf.greatest("nid", "pid").alias("b"),
        "win",
    )


def window_vertices(evidence: DataFrame) -> DataFrame:
    """Nodes that are vertices of each window's graph: ``nid, win`` (see module docstring).

    From the evidence (a row per node and window), so no deduplication: a node is an end
    of a working link when it recorded a pong or link_up (``linked``) or a peer recorded
    one from it (``seen``).

    Args:
        evidence: :func:`spark_federation.availability.node_evidence`.
    """
    return evidence.where(
        (sf.col("linked") > 0)
        | (sf.col("seen") > 0)
        | (sf.col("downs") > 0)
        | (sf.col("misses") >= MISSES_TO_DOWN)
        | (sf.col("beacons") > 0)
    ).select("nid", "win")


def window_signatures(vertices: DataFrame, edges: DataFrame) -> DataFrame:
    """A fingerprint of every window's graph: ``win, sig``.

    The XOR and the count of its vertex ids' and its edges' hashes: order-independent,
    so it is a plain hash aggregate (no lists, no sorting). Windows with equal
    fingerprints share their components, so they are found once per distinct graph
    (a steady mesh has a handful of distinct graphs in thousands of windows). Two
    different graphs sharing a 64-bit fingerprint is a ~1e-19 chance.
    """
    vsig = vertices.groupBy("win").agg(
        sf.bit_xor(sf.xxhash64("nid")).alias("vx"), sf.count(sf.lit(1)).alias("vn")
    )
    esig = edges.groupBy("win").agg(
        sf.bit_xor(sf.xxhash64("a", "b")).alias("ex"), sf.count(sf.lit(1)).alias("en")
    )
    # shuffled (hint), not broadcast: broadcasting an aggregate is a Spark job of its own
    return vsig.join(esig.hint("shuffle_hash"), on="win", how="left").select(
        "win",
        sf.xxhash64(
            "vx", "vn", sf.coalesce(sf.col("ex"), sf.lit(0)), sf.coalesce(sf.col("en"), sf.lit(0))
        ).alias("sig"),
    )


def graphs_of(vertices: DataFrame, edges: DataFrame, wins: list[int]) -> DataFrame:
    """The vertices and edges of the windows ``wins``, for one collect: ``win, a, b``
    (a vertex ``a`` has ``b`` null; an edge joins ``a`` and ``b``; an edge may repeat)."""
    chosen = sf.col("win").isin(wins)
    return (
        vertices.where(chosen)
        .select("win", sf.col("nid").alias("a"), sf.lit(None).cast("long").alias("b"))
        .unionByName(edges.where(chosen).select("win", "a", "b"))
    )


def window_components(
    vertices: DataFrame, links: DataFrame
) -> tuple[list[graphs.WindowComponents], int]:
    """Every window's components: the windows' fingerprints and the vertices and edges
    of one window per distinct fingerprint are collected (two small collects), and
    their components found on the driver (:mod:`spark_federation.graphs`).

    Args:
        vertices: :func:`window_vertices`.
        links: :func:`working_links` (deduplicated for the fingerprints only: the few
            windows collected are deduplicated on the driver, with no second shuffle).

    Returns:
        (per window with a vertex, ordered by window; the number of distinct graphs).
    """
    edges = links.distinct().select("a", "b", "win")
    sigs = {int(r["win"]): int(r["sig"]) for r in window_signatures(vertices, edges).collect()}
    first: dict[int, int] = {}
    for win in sorted(sigs):
        first.setdefault(sigs[win], win)
    rep_of = {win: first[sig] for win, sig in sigs.items()}
    nodes: dict[int, list[int]] = {rep: [] for rep in first.values()}
    ends: dict[int, set[tuple[int, int]]] = {rep: set() for rep in first.values()}
    for r in graphs_of(vertices, links, sorted(nodes)).collect():
        if r["b"] is None:
            nodes[int(r["win"])].append(int(r["a"]))
        else:
            ends[int(r["win"])].add((int(r["a"]), int(r["b"])))
    found = {rep: graphs.components_of(nodes[rep], sorted(ends[rep])) for rep in nodes}
    return graphs.every_window(rep_of, found), len(found)


_LONG = LongType()
_SIZES = ArrayType(_LONG, containsNull=False)
PER_WINDOW = StructType(
    [
        StructField("window_start_ms", _LONG),
        StructField("components", _LONG, nullable=False),
        StructField("sizes", _SIZES, nullable=False),
        StructField("nodes_up", _LONG),
    ]
)
MEMBERS = StructType(
    [
        StructField("window_start_ms", _LONG),
        StructField("size", _LONG, nullable=False),
        StructField("members", _SIZES, nullable=False),
    ]
)
EVENTS = StructType(
    [
        StructField("start_ms", _LONG),
        StructField("end_ms", _LONG),
        StructField("windows", _LONG, nullable=False),
        StructField("components", _LONG),
        StructField("sizes", _SIZES),
    ]
)


def partition_frames(
    spark: SparkSession, windows: list[graphs.WindowComponents], window_ms: int
) -> tuple[DataFrame, DataFrame, DataFrame]:
    """The driver's rows as the three tables' frames (local relations, no Spark job):
    ``partitions`` (every window with a vertex), the components of the partitioned
    windows (``members`` as node ids) and ``partition_events``."""
    per_window = spark.createDataFrame(
        [(w.win, len(w.components), w.sizes, sum(w.sizes)) for w in windows], PER_WINDOW
    )
    members = spark.createDataFrame(
        [(w.win, len(c), list(c)) for w in windows if len(w.components) > 1 for c in w.components],
        MEMBERS,
    )
    events = spark.createDataFrame(
        [
            (e.start_ms, e.end_ms, e.windows, e.components, e.sizes)
            for e in graphs.partition_events(windows, window_ms)
        ],
        EVENTS,
    )
    return per_window, members, events
