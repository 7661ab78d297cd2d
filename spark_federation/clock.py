"""Whose clock is off (spec §10).

Each pong carries ``clock_offset_ms``: the observer's estimate of the peer's
clock minus its own. For a node X, every pong *about* X is a sample of
"X minus that observer", and every pong *by* X, negated, is a sample of "X minus
that peer". The median of all of them estimates X's offset from the mesh: it
stays right while fewer than half of X's peers are skewed themselves. Samples
are counted in 1 ms buckets (:mod:`spark_federation.quantiles`), so the median
is exact to the millisecond.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

from spark_federation.quantiles import histogram_quantiles


def offset_histogram(pongs: DataFrame) -> DataFrame:
    """Pongs per directed link and clock-offset millisecond, from
    :func:`spark_federation.links.pong_histogram`: ``nid, pid, offset_ms, n`` (pongs
    without an offset left out)."""
    return (
        pongs.where(sf.col("offset_ms").isNotNull())
        .groupBy("nid", "pid", "offset_ms")
        .agg(sf.sum("n").alias("n"))
        .select("nid", "pid", "offset_ms", "n")
    )


@dataclass(frozen=True, slots=True)
class OffsetHistogram:
    """Pongs per directed link and clock-offset millisecond (:func:`offset_histogram`'s
    rows: a few thousand at 10 M records), collected to the driver as arrays."""

    nid: npt.NDArray[np.int64]
    pid: npt.NDArray[np.int64]
    offset_ms: npt.NDArray[np.int64]
    n: npt.NDArray[np.int64]


SKEW_SCHEMA = pa.schema(
    [
        ("nid", pa.int64()),
        ("skew_ms", pa.float64()),
        ("p10_ms", pa.float64()),
        ("p90_ms", pa.float64()),
        ("samples", pa.int64()),
        ("skewed", pa.bool_()),
    ]
)


def clock_skew(spark: SparkSession, pongs: OffsetHistogram, threshold_ms: float) -> DataFrame:
    """Per node: ``nid, skew_ms, p10_ms, p90_ms, samples, skewed`` (|skew| > threshold).

    The per-node quantiles are found on the driver (a few thousand histogram rows)
    and handed to Spark as a local relation, for the table and for propagation.

    Args:
        spark: the session.
        pongs: pong counts per link and offset millisecond.
        threshold_ms: |offset| above which a node is skewed.
    """
    # pongs about X sample "X minus observer"; X's own pongs, negated, "X minus peer"
    nid = np.concatenate([pongs.pid, pongs.nid])
    bucket = np.concatenate([pongs.offset_ms, -pongs.offset_ms])
    n = np.concatenate([pongs.n, pongs.n])
    keys, at, total = histogram_quantiles([nid], bucket, n, [0.1, 0.5, 0.9])
    median = at[:, 1].astype(np.float64)
    table = pa.Table.from_arrays(
        [
            pa.array(keys[0]),
            pa.array(median),
            pa.array(at[:, 0].astype(np.float64)),
            pa.array(at[:, 2].astype(np.float64)),
            pa.array(total),
            pa.array(np.abs(median) > threshold_ms),
        ],
        schema=SKEW_SCHEMA,
    )
    return spark.createDataFrame(table)
