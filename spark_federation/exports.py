"""Finding, reading, validating and deduplicating exported records (spec §7.5).

An input directory holds export dirs at any depth; each has ``heartbeats/``,
and optionally ``beacons/`` and ``traces/``, with ``*.jsonl``, ``*.jsonl.gz`` or
``*.parquet`` files. Files are listed through the Hadoop FileSystem of the
input URI, so ``file:``, ``hdfs:``, ``s3a:`` and the rest work alike; a directory on
the local file system is listed by Python instead, in the same order and with the
same paths (Hadoop's local listing runs ``ls -ld`` in a process of its own for every
file and directory it finds: 300 processes, seconds, for 50 exports).

Inside the pipeline a NodeID is its ``xxhash64`` (a long): shuffles and caches
carry 8 bytes instead of 51 characters, and :func:`node_names` maps ids
back to NodeIDs for the outputs. Two of the few thousand NodeIDs of a
federation sharing a 64-bit hash is a chance of about 1e-12.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as sf

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
    found = ExportFiles()
    for uri in _listing(spark, input_uri):
        _add(found, uri)
    if found.count("heartbeats") == 0:
        raise MeshHealthError(
            f"no heartbeat files under {input_uri}: expected export dirs with"
            " heartbeats/*.jsonl or heartbeats/*.parquet (hearthnet heartbeat export)"
        )
    return found


def _listing(spark: SparkSession, input_uri: str) -> Iterator[str]:
    """Every file under the input, as Hadoop path strings (``file:/...`` when local)."""
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    local = local_root(input_uri, str(conf.get("fs.defaultFS")))
    if local is not None:
        if not os.path.exists(local):
            raise MeshHealthError(f"input {input_uri} does not exist")
        try:
            yield from ("file:" + path for path in _walk(local))
        except OSError as exc:
            raise MeshHealthError(f"cannot read input {input_uri}: {exc}") from exc
        return
    yield from hadoop_files(spark, input_uri)


def hadoop_files(spark: SparkSession, input_uri: str) -> Iterator[str]:
    """Every file under the input as the input's Hadoop FileSystem lists them."""
    jvm: Any = spark.sparkContext._jvm
    root = jvm.org.apache.hadoop.fs.Path(input_uri)
    try:
        fs = root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
        exists = fs.exists(root)
    except Exception as exc:  # py4j wraps the Hadoop IOException
        raise MeshHealthError(f"cannot open input {input_uri}: {_java_message(exc)}") from exc
    if not exists:
        raise MeshHealthError(f"input {input_uri} does not exist")
    listing = fs.listFiles(root, True)
    while listing.hasNext():
        yield str(listing.next().getPath().toString())


def _add(found: ExportFiles, uri: str) -> None:
    """Count one listed file (a Hadoop path string) in, if it is a record file."""
    parent, _, name = uri.rpartition("/")
    export, _, kind = parent.rpartition("/")
    if kind not in KINDS or name.startswith((".", "_")):
        return
    if name.endswith((".jsonl", ".jsonl.gz")):
        found.jsonl[kind].append(uri)
    elif name.endswith(".parquet"):
        found.parquet[kind].append(uri)
    else:
        return
    found.exports.add(export)


def local_root(input_uri: str, default_fs: str = "file:///") -> str | None:
    """The absolute, normalised local path of an input on the local file system (a
    ``file:`` URI without a host, or a path when Hadoop's default file system is the
    local one), as Hadoop would name it; None for any other file system."""
    scheme, colon, rest = input_uri.partition(":")
    if not colon or "/" in scheme:  # no scheme: a path on the default file system
        if not default_fs.startswith("file:"):
            return None
        path = input_uri
    elif scheme != "file":
        return None
    elif rest.startswith("//"):  # file:///path (file://host/path is not local)
        path = rest[2:]
        if not path.startswith("/"):
            return None
    else:
        path = rest
    return os.path.abspath(path) if path else None


def _walk(directory: str) -> Iterator[str]:
    """Every file under ``directory`` as Hadoop's recursive ``listFiles`` gives them:
    depth first, each directory's entries in the order the directory lists them,
    following links to directories (but not back into a directory being listed); a
    file as itself."""
    if not os.path.isdir(directory):
        yield directory
        return

    def walk(d: str, above: frozenset[str]) -> Iterator[str]:
        real = os.path.realpath(d)
        if real in above:
            return
        with os.scandir(d) as entries:
            listed = list(entries)
        for entry in listed:
            if entry.name.startswith(".") and entry.name.endswith(".crc"):
                continue  # Hadoop's local file system hides its checksum files
            if entry.is_dir():
                yield from walk(entry.path, above | {real})
            elif entry.is_file():
                yield entry.path

    yield from walk(directory, frozenset())


def _java_message(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def read_raw(
    spark: SparkSession, files: ExportFiles, kind: str, *, with_file: bool = True
) -> DataFrame | None:
    """Read every file of one kind with its explicit schema; None when there are none.

    The columns are the schema's, ``_corrupt_record`` and, ``with_file``, ``file`` (the
    path the row came from). Spark does not prune the file metadata from a plan
    that never uses it: every row would carry it through the scan, so the frames
    the job classifies are read without it.

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
            .select(*schema.fieldNames(), CORRUPT, *_file_column(with_file))
        )
    if files.parquet[kind]:
        parts.append(
            spark.read.schema(schema)
            .parquet(*files.parquet[kind])
            .select(
                *schema.fieldNames(),
                sf.lit(None).cast("string").alias(CORRUPT),
                *_file_column(with_file),
            )
        )
    if not parts:
        return None
    raw = parts[0]
    for part in parts[1:]:
        raw = raw.unionByName(part)
    return raw


def _file_column(with_file: bool) -> list[Column]:
    return [sf.col("_metadata.file_path").alias("file")] if with_file else []


def node_ok(c: Column) -> Column:
    """A NodeID of the spec §1.1 form (never null: a missing id is not well formed)."""
    # the length in bytes first: read from the string's header, and equal to the length
    # in characters for an all-ASCII id, as every well-formed one is; the length in
    # characters (a scan of every byte) only when they differ, so the test is the same
    length_ok = (sf.octet_length(c) == NODE_ID_LENGTH) | (sf.length(c) == NODE_ID_LENGTH)
    return sf.coalesce(length_ok & c.startswith("ed25519:"), sf.lit(False))


def node_key(c: Column) -> Column:
    """The long that stands for a NodeID inside the pipeline (null stays null)."""
    return sf.when(c.isNotNull(), sf.xxhash64(c))


def _status(well_formed: Column, ts: Column, since_ms: int | None, until_ms: int | None) -> Column:
    in_range = sf.lit(True)
    if since_ms is not None:
        in_range = in_range & (ts >= sf.lit(since_ms))
    if until_ms is not None:
        in_range = in_range & (ts < sf.lit(until_ms))
    return (
        sf.when(~sf.coalesce(well_formed, sf.lit(False)), sf.lit(MALFORMED))
        .when(~in_range, sf.lit(OUT_OF_RANGE))
        .otherwise(sf.lit(OK))
        .cast("byte")
    )


def classify_heartbeats(
    raw: DataFrame, since_ms: int | None = None, until_ms: int | None = None
) -> DataFrame:
    """Classify each heartbeat row (ok, malformed, out of range), NodeIDs as read.

    Malformed: unparseable or mistyped line, missing ts/node/peer/kind, a kind
    or path outside spec §7.5, a malformed NodeID, a node pinging itself, or a
    negative RTT. Every column but ``status`` is null in rows that are not ok, so
    a grouping folds each such class into one group and counts it.

    Returns:
        ``status, node, peer, kind`` (a byte, :data:`KIND_CODES`), ``seq, ts, rtt_ms,
        relay, via, clock_offset_ms``, and ``file`` when ``raw`` has it.
    """
    kind_code = sf.lit(None).cast("byte")
    for name, code in reversed(KIND_CODES.items()):
        kind_code = sf.when(sf.col("kind") == name, sf.lit(code).cast("byte")).otherwise(kind_code)
    well_formed = (
        sf.col(CORRUPT).isNull()
        & sf.col("ts").isNotNull()
        & (sf.col("ts") > 0)
        & node_ok(sf.col("node"))
        & node_ok(sf.col("peer"))
        & (sf.col("node") != sf.col("peer"))
        & sf.col("kind").isin(*KIND_CODES)
        & (sf.col("path").isNull() | sf.col("path").isin("direct", "relay"))
        & (sf.col("via").isNull() | node_ok(sf.col("via")))
        & (sf.col("rtt_ms").isNull() | (sf.col("rtt_ms") >= 0))
    )
    status = _status(well_formed, sf.col("ts"), since_ms, until_ms)
    ok = status == sf.lit(OK)
    return raw.select(
        status.alias("status"),
        sf.when(ok, sf.col("node")).alias("node"),
        sf.when(ok, sf.col("peer")).alias("peer"),
        sf.when(ok, kind_code).alias("kind"),
        sf.when(ok, sf.col("seq")).alias("seq"),
        sf.when(ok, sf.col("ts")).alias("ts"),
        sf.when(ok, sf.col("rtt_ms")).alias("rtt_ms"),
        sf.when(ok, sf.col("path") == "relay").alias("relay"),
        sf.when(ok, sf.col("via")).alias("via"),
        sf.when(ok, sf.col("clock_offset_ms")).alias("clock_offset_ms"),
        *([sf.when(ok, sf.col("file")).alias("file")] if "file" in raw.columns else []),
    )


def clean_heartbeats(
    raw: DataFrame, since_ms: int | None = None, until_ms: int | None = None
) -> DataFrame:
    """:func:`classify_heartbeats` with the NodeIDs as ids (:func:`node_key`): ``status, nid,
    pid, kind, seq, ts, rtt_ms, relay, vid, clock_offset_ms``."""
    return classify_heartbeats(raw, since_ms, until_ms).select(
        "status",
        node_key(sf.col("node")).alias("nid"),
        node_key(sf.col("peer")).alias("pid"),
        "kind",
        "seq",
        "ts",
        "rtt_ms",
        "relay",
        node_key(sf.col("via")).alias("vid"),
        "clock_offset_ms",
    )


_DEDUP_COLUMNS = (
    "status",
    "nid",
    "pid",
    "kind",
    "seq",
    "ts",
    "rtt_ms",
    "relay",
    "vid",
    "clock_offset_ms",
    "copies",
)


@dataclass(frozen=True, slots=True)
class NodeNames:
    """What one pass over the raw NodeID columns finds (:func:`node_names`).

    Attributes:
        ids: id → NodeID for every well-formed NodeID named anywhere in the inputs.
        multi_export: ids of nodes whose heartbeat records come from more than one
            export dir (the only ones whose records can hold copies).
    """

    ids: dict[int, str]
    multi_export: list[int]


def node_names(raws: dict[str, DataFrame | None]) -> NodeNames:
    """The node dictionary and the multi-export nodes, from one pass over the NodeID columns.

    The heartbeat frame must have its ``file`` column (:func:`read_raw` ``with_file``).

    A node's heartbeat log holds only its own observations (spec §7.5), so the
    same observation can be read twice only from two exports of one node (an
    admin collected overlapping exports): the heartbeat ``node`` column is kept
    with the file it came from, every other NodeID column (``peer``, ``via``,
    ``origin``, the beacons' and traces' ``node``) alone. Each kind's files are
    scanned once, and each task reduces its rows to the distinct combinations of
    those columns before anything moves (per file a few dozen: a node, its peers,
    their relays); only then are the combinations split into single NodeIDs.
    """
    parts: list[DataFrame] = []
    for kind, raw in raws.items():
        if raw is None:
            continue
        present = [c for c in ("node", "peer", "via", "origin") if c in raw.columns]
        own = kind == "heartbeats"
        combos = raw.select(*present, *(["file"] if own else [])).distinct()
        for c in present:
            mine = own and c == "node"
            parts.append(
                combos.select(
                    sf.col(c).alias("node"),
                    (sf.col("file") if mine else sf.lit(None).cast("string")).alias("file"),
                )
            )
    if not parts:
        raise MeshHealthError("no inputs to build the node dictionary from")
    names = parts[0]
    for part in parts[1:]:
        names = names.unionByName(part)
    rows = (
        names.where(node_ok(sf.col("node")))
        .distinct()
        .select(node_key(sf.col("node")).alias("id"), "node", "file")
        .collect()
    )
    ids: dict[int, str] = {}
    exports_of: dict[int, set[str]] = {}
    for row in rows:
        nid = int(row["id"])
        ids[nid] = str(row["node"])
        if row["file"] is not None:
            exports_of.setdefault(nid, set()).add(str(row["file"]).rsplit("/", 2)[0])
    multi = sorted(n for n, dirs in exports_of.items() if len(dirs) > 1)
    return NodeNames(ids, multi)


def dedup_heartbeats(clean: DataFrame, multi_export: list[int] | None = None) -> DataFrame:
    """One row per observation (node, peer, kind, seq, ts), with how many copies were read.

    Args:
        clean: :func:`clean_heartbeats`.
        multi_export: ids of nodes seen in several exports (:attr:`NodeNames.multi_export`);
            None deduplicates every node.

    Only the records of ``multi_export`` nodes are shuffled and aggregated; the
    rest cannot hold copies and pass through with ``copies`` 1 (with no such node,
    the common case, every record does, and the input is scanned once rather than
    once for each branch). Rows that are not ok keep their status and are counted
    downstream.
    """
    if multi_export is not None and not multi_export:
        # no node has two exports: nothing can be a copy, and the records are read once
        return clean.select(*_DEDUP_COLUMNS[:-1], sf.lit(1).cast("long").alias("copies"))
    suspect = sf.col("status") == sf.lit(OK)
    if multi_export is not None:
        suspect = suspect & sf.col("nid").isin(multi_export)
    deduped = (
        clean.where(suspect)
        .groupBy("status", "nid", "pid", "kind", "seq", "ts")
        .agg(
            sf.first("rtt_ms", ignorenulls=True).alias("rtt_ms"),
            sf.first("relay", ignorenulls=True).alias("relay"),
            sf.first("vid", ignorenulls=True).alias("vid"),
            sf.first("clock_offset_ms", ignorenulls=True).alias("clock_offset_ms"),
            sf.count(sf.lit(1)).alias("copies"),
        )
        .select(*_DEDUP_COLUMNS)
    )
    single = clean.where(~suspect).select(
        *_DEDUP_COLUMNS[:-1], sf.lit(1).cast("long").alias("copies")
    )
    return deduped.unionByName(single).select(*_DEDUP_COLUMNS)


def ok_rows(dedup: DataFrame) -> DataFrame:
    """The observations the analysis uses: well formed, in range, one row each."""
    return dedup.where(sf.col("status") == sf.lit(OK)).select(
        "nid",
        "pid",
        "kind",
        "seq",
        "ts",
        "rtt_ms",
        "relay",
        "vid",
        "clock_offset_ms",
    )


def clean_beacons(
    raw: DataFrame, since_ms: int | None = None, until_ms: int | None = None
) -> DataFrame:
    """Classify beacon rows and deduplicate them on (node, ts): every node holds every beacon."""
    well_formed = sf.col(CORRUPT).isNull() & sf.col("ts").isNotNull() & node_ok(sf.col("node"))
    status = _status(well_formed, sf.col("ts"), since_ms, until_ms)
    ok = status == sf.lit(OK)
    return (
        raw.select(
            status.alias("status"),
            sf.when(ok, node_key(sf.col("node"))).alias("nid"),
            sf.when(ok, sf.col("ts")).alias("ts"),
            sf.when(ok, sf.col("name")).alias("name"),
            sf.when(ok, sf.col("uptime_s")).alias("uptime_s"),
        )
        .groupBy("status", "nid", "ts")
        .agg(
            sf.first("name", ignorenulls=True).alias("name"),
            sf.first("uptime_s", ignorenulls=True).alias("uptime_s"),
            sf.count(sf.lit(1)).alias("copies"),
        )
        .select("status", "nid", "ts", "name", "uptime_s", "copies")
    )


def clean_traces(
    raw: DataFrame, since_ms: int | None = None, until_ms: int | None = None
) -> DataFrame:
    """Classify trace rows and deduplicate them on (node, msg_id)."""
    well_formed = (
        sf.col(CORRUPT).isNull()
        & sf.col("ts").isNotNull()
        & node_ok(sf.col("node"))
        & node_ok(sf.col("origin"))
        & sf.col("msg_id").isNotNull()
        & sf.col("published_ms").isNotNull()
        & sf.coalesce(sf.col("hops") >= 1, sf.lit(False))
    )
    status = _status(well_formed, sf.col("ts"), since_ms, until_ms)
    ok = status == sf.lit(OK)
    return (
        raw.select(
            status.alias("status"),
            sf.when(ok, node_key(sf.col("node"))).alias("nid"),
            sf.when(ok, sf.col("msg_id")).alias("msg_id"),
            sf.when(ok, node_key(sf.col("origin"))).alias("oid"),
            sf.when(ok, sf.col("published_ms")).alias("published_ms"),
            sf.when(ok, sf.col("hops")).alias("hops"),
            sf.when(ok, sf.col("ts")).alias("ts"),
            sf.when(ok, sf.col("catch_up")).alias("catch_up"),
        )
        .groupBy("status", "nid", "msg_id")
        .agg(
            sf.first("oid", ignorenulls=True).alias("oid"),
            sf.first("published_ms", ignorenulls=True).alias("published_ms"),
            sf.first("hops", ignorenulls=True).alias("hops"),
            sf.first("ts", ignorenulls=True).alias("ts"),
            sf.first("catch_up", ignorenulls=True).alias("catch_up"),
            sf.count(sf.lit(1)).alias("copies"),
        )
        .select(
            "status", "nid", "msg_id", "oid", "published_ms", "hops", "ts", "catch_up", "copies"
        )
    )


def record_counts(dedup: DataFrame) -> dict[str, int]:
    """``records`` (unique ok), ``duplicates``, ``skipped`` (malformed), ``out_of_range``.

    One small aggregate over the deduplicated rows; call it on a cached frame.
    """
    return counts_and(dedup)[0]


def counts_and(
    dedup: DataFrame, key: str | None = None, **extra: Column
) -> tuple[dict[str, int], list[Row]]:
    """:func:`record_counts` and, from the same query, aggregates ``extra`` per ``key``:
    the rows (``status``, ``key``, the ``extra`` columns) besides the counts.

    One collect instead of one for the counts and one for each further figure.
    """
    keys = ["status"] if key is None else ["status", key]
    rows = (
        dedup.groupBy(*keys)
        .agg(
            sf.count(sf.lit(1)).alias("_rows"),
            sf.sum("copies").alias("_copies"),
            *[c.alias(name) for name, c in extra.items()],
        )
        .collect()
    )
    per_status: dict[int, tuple[int, int]] = {}
    for row in rows:
        n, copies = per_status.get(row["status"], (0, 0))
        per_status[row["status"]] = (n + int(row["_rows"]), copies + int(row["_copies"]))
    counts = {"records": 0, "duplicates": 0, "skipped": 0, "out_of_range": 0}
    for status, (n, copies) in per_status.items():
        if status == OK:
            counts["records"] = n
            counts["duplicates"] = copies - n
        elif status == MALFORMED:
            counts["skipped"] = copies
        else:
            counts["out_of_range"] = copies
    return counts, rows
