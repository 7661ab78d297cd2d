"""Explicit schemas of the three export record kinds (spec §7.5; traces: docs/mesh-health.md).

The job never infers a schema: a node writing a field with a new type must not
silently change what every later query means. JSON lines that do not fit are
kept in :data:`CORRUPT` and counted as skipped.
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

CORRUPT = "_corrupt_record"

# kind codes used inside the pipeline (a byte per record instead of a string)
KIND_CODES: dict[str, int] = {"pong": 0, "miss": 1, "link_up": 2, "link_down": 3}
PONG, MISS, LINK_UP, LINK_DOWN = 0, 1, 2, 3


def _struct(fields: list[tuple[str, DataType]]) -> StructType:
    return StructType([StructField(name, dtype, nullable=True) for name, dtype in fields])


HEARTBEAT = _struct(
    [
        ("ts", LongType()),
        ("node", StringType()),
        ("peer", StringType()),
        ("community", StringType()),
        ("kind", StringType()),
        ("seq", LongType()),
        ("rtt_ms", DoubleType()),
        ("path", StringType()),
        ("via", StringType()),
        ("clock_offset_ms", DoubleType()),
        ("peers_linked", LongType()),
        ("log_head", LongType()),
        ("subscribers", LongType()),
        ("version", StringType()),
    ]
)

BEACON_PEER = _struct(
    [
        ("peer", StringType()),
        ("rtt_ms_p50", DoubleType()),
        ("loss_pct", DoubleType()),
        ("path", StringType()),
    ]
)

BEACON = _struct(
    [
        ("ts", LongType()),
        ("node", StringType()),
        ("name", StringType()),
        ("uptime_s", LongType()),
        ("peers", ArrayType(BEACON_PEER)),
        ("log_head", LongType()),
        ("subscribers", LongType()),
        ("cpu_pct", DoubleType()),
        ("rss_mb", DoubleType()),
        ("version", StringType()),
    ]
)

TRACE = _struct(
    [
        ("ts", LongType()),
        ("node", StringType()),
        ("msg_id", StringType()),
        ("origin", StringType()),
        ("published_ms", LongType()),
        ("hops", LongType()),
        ("catch_up", BooleanType()),  # null in records written before it existed
    ]
)

SCHEMAS: dict[str, StructType] = {"heartbeats": HEARTBEAT, "beacons": BEACON, "traces": TRACE}


def with_corrupt(schema: StructType) -> StructType:
    """The schema plus the string column that PERMISSIVE JSON parsing fills for bad lines."""
    return StructType([*schema.fields, StructField(CORRUPT, StringType(), nullable=True)])
