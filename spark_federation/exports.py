"""Finding, reading, validating and deduplicating exported records (spec §7.5).

An input directory holds export dirs at any depth; each has ``heartbeats/``,
and optionally ``beacons/`` and ``traces/``, with ``*.jsonl``, ``*.jsonl.gz`` or
``*.parquet`` files. Files are listed through the Hadoop FileSystem of the
input URI, so ``file:``, ``hdfs:``, ``s3a:`` and the rest work alike.

Inside the pipeline a NodeID is its ``xxhash64`` (a long): shuffles and caches
carry 8 bytes instead of 51 characters, and :func:`node_dictionary` maps ids
back to NodeIDs for the outputs. Two of the few thousand NodeIDs of a
federation sharing a 64-bit hash is a chance of about 1e-12.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_federation.errors import MeshHealthError
from spark_federation.schema import CORRUPT, KIND_CODES, SCHEMAS, with_corrupt

KINDS = ("heartbeats", "beacons", "traces")
NODE_ID_LENGTH = 51  # spec §1.1: "ed25519:" + 43 base64url characters
OK, MALFORMED, OUT_OF_RANGE = 0, 1, 2


@dataclass(slots=True)
class ExportFiles:
    """Record files found under the input, by kind and format."""

    jsonl: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})
    parquet: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})
    exports: set[str] = field(default_factory=set)

    def count(self, kind: str) -> int:
        """How many files of this kind were found."""
        return len(self.jsonl[kind]) + len(self.parquet[kind])


def discover(spark: SparkSession, input_uri: str) -> ExportFiles:
    """List the record files of every export dir under ``input_uri`` (any depth).

    Raises:
        MeshHealthError: the input does not exist or holds no heartbeat files.
    """
    jvm: Any = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    root = jvm.org.apache.hadoop.fs.Path(input_uri)
    try:
        fs = root.getFileSystem(conf)
        exists = fs.exists(root)
    except Exception as exc:  # py4j wraps the Hadoop IOException
        raise MeshHealthError(f"cannot open input {input_uri}: {_java_message(exc)}") from exc
    if not exists:
        raise MeshHealthError(f"input {input_uri} does not exist")
    found = ExportFiles()
    listing = fs.listFiles(root, True)
    while listing.hasNext():
        path = listing.next().getPath()
        name = str(path.getName())
        parent = path.getParent()
        kind = str(parent.getName())
        if kind not in KINDS or name.startswith((".", "_")):
            continue
        uri = str(path.toString())
        if name.endswith((".jsonl", ".jsonl.gz")):
            found.jsonl[kind].append(uri)
        elif name.endswith(".parquet"):
            found.parquet[kind].append(uri)
        else:
            continue
        found.exports.add(str(parent.getParent().toString()))
    if found.count("heartbeats") == 0:
        raise MeshHealthError(
            f"no heartbeat files under {input_uri}: expected export dirs with"
            " heartbeats/*.jsonl or heartbeats/*.parquet (hearthnet heartbeat export)"
        )
    return found


def _java_message(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def read_raw(spark: SparkSession, files: ExportFiles, kind: str) -> DataFrame | None:
    """Read every file of one kind with its explicit schema; None when there are none.

    JSON lines are parsed PERMISSIVE: a line that is not JSON, is cut off, or
    has a field of the wrong type keeps its text in ``_corrupt_record`` and is
    counted as skipped later, never failing the job.
    """
    schema = SCHEMAS[kind]
    parts: list[DataFrame] = []
    if files.jsonl[kind]:
        parts.append(
            spark.read.schema(with_corrupt(schema))
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT)
            .json(files.jsonl[kind])
            .select(*schema.fieldNames(), CORRUPT)
        )
    if files.parquet[kind]:
        parts.append(
            spark.read.schema(schema)
            .parquet(*files.parquet[kind])
            .select(*schema.fieldNames(), F.lit(None).cast("string").alias(CORRUPT))
        )
    if not parts:
        return None
    raw = parts[0]
    for part in parts[1:]:
        raw = raw.unionByName(part)
    return raw


def node_ok(c: Column) -> Column:
    """A NodeID of the spec §1.1 form (never null: a missing id is not well formed)."""
    return F.coalesce((F.length(c) == NODE_ID_LENGTH) & c.startswith("ed25519:"), F.lit(False))


def node_key(c: Column) -> Column:
    """The long that stands for a NodeID inside the pipeline (null stays null)."""
    return F.when(c.isNotNull(), F.xxhash64(c))


def _status(well_formed: Column, ts: Column, since_ms: int | None, until_ms: int | None) -> Column:
    in_range = F.lit(True)
    if since_ms is not None:
        in_range = in_range & (ts >= F.lit(since_ms))
    if until_ms is not None:
        in_range = in_range & (ts < F.lit(until_ms))
    return (
        F.when(~F.coalesce(well_formed, F.lit(False)), F.lit(MALFORMED))
        .when(~in_range, F.lit(OUT_OF_RANGE))
        .otherwise(F.lit(OK))
        .cast("byte")
    )


def clean_heartbeats(
    raw: DataFrame, since_ms: int | None = None, until_ms: int | None = None
) -> DataFrame:
    """Classify each heartbeat row (ok, malformed, out of range) and encode the ok ones.

    Malformed: unparseable or mistyped line, missing ts/node/peer/kind, a kind
    or path outside spec §7.5, a malformed NodeID, a node pinging itself, or a
    negative RTT. Key columns of rows that are not ok are null, so the dedup
    step folds each such class into one group and counts it.
    """
    kind_code = F.lit(None).cast("byte")
    for name, code in reversed(KIND_CODES.items()):
        kind_code = F.when(F.col("kind") == name, F.lit(code).cast("byte")).otherwise(kind_code)
    well_formed = (
        F.col(CORRUPT).isNull()
        & F.col("ts").isNotNull()
        & (F.col("ts") > 0)
        & node_ok(F.col("node"))
        & node_ok(F.col("peer"))
        & (F.col("node") != F.col("peer"))
        & F.col("kind").isin(*KIND_CODES)
        & (F.col("path").isNull() | F.col("path").isin("direct", "relay"))
        & (F.col("via").isNull() | node_ok(F.col("via")))
        & (F.col("rtt_ms").isNull() | (F.col("rtt_ms") >= 0))
    )
    status = _status(well_formed, F.col("ts"), since_ms, until_ms)
    ok = status == F.lit(OK)
    return raw.select(
        status.alias("status"),
        F.when(ok, node_key(F.col("node"))).alias("nid"),
        F.when(ok, node_key(F.col("peer"))).alias("pid"),
        F.when(ok, kind_code).alias("kind"),
        F.when(ok, F.col("seq")).alias("seq"),
        F.when(ok, F.col("ts")).alias("ts"),
        F.when(ok, F.col("rtt_ms")).alias("rtt_ms"),
        F.when(ok, F.col("path") == "relay").alias("relay"),
        F.when(ok, node_key(F.col("via"))).alias("vid"),
        F.when(ok, F.col("clock_offset_ms")).alias("clock_offset_ms"),
        F.when(ok, node_key(F.col("community"))).alias("cid"),
    )


def dedup_heartbeats(clean: DataFrame) -> DataFrame:
    """One row per observation (node, peer, kind, seq, ts), with how many copies were read.

    Rows that are not ok collapse into one row per status, whose ``copies`` is
    their count; ``status`` tells them apart downstream.
    """
    return clean.groupBy("status", "nid", "pid", "kind", "seq", "ts").agg(
        F.first("rtt_ms", ignorenulls=True).alias("rtt_ms"),
        F.first("relay", ignorenulls=True).alias("relay"),
        F.first("vid", ignorenulls=True).alias("vid"),
        F.first("clock_offset_ms", ignorenulls=True).alias("clock_offset_ms"),
        F.first("cid", ignorenulls=True).alias("cid"),
        F.count(F.lit(1)).alias("copies"),
    ).select(
        "status", "nid", "pid", "kind", "seq", "ts", "rtt_ms", "relay", "vid",
        "clock_offset_ms", "cid", "copies",
    )


def ok_rows(dedup: DataFrame) -> DataFrame:
    """The observations the analysis uses: well formed, in range, one row each."""
    return dedup.where(F.col("status") == F.lit(OK)).select(
        "nid", "pid", "kind", "seq", "ts", "rtt_ms", "relay", "vid", "clock_offset_ms", "cid",
    )


def clean_beacons(
    raw: DataFrame, since_ms: int | None = None, until_ms: int | None = None
) -> DataFrame:
    """Classify beacon rows and deduplicate them on (node, ts): every node holds every beacon."""
    well_formed = F.col(CORRUPT).isNull() & F.col("ts").isNotNull() & node_ok(F.col("node"))
    status = _status(well_formed, F.col("ts"), since_ms, until_ms)
    ok = status == F.lit(OK)
    return (
        raw.select(
            status.alias("status"),
            F.when(ok, node_key(F.col("node"))).alias("nid"),
            F.when(ok, F.col("ts")).alias("ts"),
            F.when(ok, F.col("name")).alias("name"),
            F.when(ok, F.col("uptime_s")).alias("uptime_s"),
        )
        .groupBy("status", "nid", "ts")
        .agg(
            F.first("name", ignorenulls=True).alias("name"),
            F.first("uptime_s", ignorenulls=True).alias("uptime_s"),
            F.count(F.lit(1)).alias("copies"),
        )
        .select("status", "nid", "ts", "name", "uptime_s", "copies")
    )


def clean_traces(
    raw: DataFrame, since_ms: int | None = None, until_ms: int | None = None
) -> DataFrame:
    """Classify trace rows and deduplicate them on (node, msg_id)."""
    well_formed = (
        F.col(CORRUPT).isNull()
        & F.col("ts").isNotNull()
        & node_ok(F.col("node"))
        & node_ok(F.col("origin"))
        & F.col("msg_id").isNotNull()
        & F.col("published_ms").isNotNull()
        & F.coalesce(F.col("hops") >= 1, F.lit(False))
    )
    status = _status(well_formed, F.col("ts"), since_ms, until_ms)
    ok = status == F.lit(OK)
    return (
        raw.select(
            status.alias("status"),
            F.when(ok, node_key(F.col("node"))).alias("nid"),
            F.when(ok, F.col("msg_id")).alias("msg_id"),
            F.when(ok, node_key(F.col("origin"))).alias("oid"),
            F.when(ok, F.col("published_ms")).alias("published_ms"),
            F.when(ok, F.col("hops")).alias("hops"),
            F.when(ok, F.col("ts")).alias("ts"),
        )
        .groupBy("status", "nid", "msg_id")
        .agg(
            F.first("oid", ignorenulls=True).alias("oid"),
            F.first("published_ms", ignorenulls=True).alias("published_ms"),
            F.first("hops", ignorenulls=True).alias("hops"),
            F.first("ts", ignorenulls=True).alias("ts"),
            F.count(F.lit(1)).alias("copies"),
        )
        .select("status", "nid", "msg_id", "oid", "published_ms", "hops", "ts", "copies")
    )


def record_counts(dedup: DataFrame) -> dict[str, int]:
    """``records`` (unique ok), ``duplicates``, ``skipped`` (malformed), ``out_of_range``.

    One small aggregate over the deduplicated rows; call it on a cached frame.
    """
    rows = dedup.groupBy("status").agg(
        F.count(F.lit(1)).alias("rows"), F.sum("copies").alias("copies")
    ).collect()
    counts = {"records": 0, "duplicates": 0, "skipped": 0, "out_of_range": 0}
    for row in rows:
        if row["status"] == OK:
            counts["records"] = int(row["rows"])
            counts["duplicates"] = int(row["copies"]) - int(row["rows"])
        elif row["status"] == MALFORMED:
            counts["skipped"] = int(row["copies"])
        else:
            counts["out_of_range"] = int(row["copies"])
    return counts


def node_dictionary(raws: list[DataFrame]) -> DataFrame:
    """``(id, node)`` for every well-formed NodeID named anywhere in the raw inputs."""
    names: DataFrame | None = None
    for raw in raws:
        cols = [c for c in ("node", "peer", "via", "community", "origin") if c in raw.columns]
        part = raw.select(F.explode(F.array(*[F.col(c) for c in cols])).alias("node"))
        names = part if names is None else names.unionByName(part)
    if names is None:
        raise MeshHealthError("no inputs to build the node dictionary from")
    return (
        names.where(node_ok(F.col("node")))
        .distinct()
        .select(node_key(F.col("node")).alias("id"), F.col("node"))
    )
