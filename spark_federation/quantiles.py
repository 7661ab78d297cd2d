"""Quantiles from histograms: counting into buckets is a plain hash aggregate.

``percentile_approx`` inserts every row into a sketch (an object aggregate, a
few µs a row); counting rows per (group, bucket) is fixed-width arithmetic, and
the histograms are small, so quantiles of any grouping (per link and hour, per
link over the whole span) come from them without another pass over records.

RTT uses log-spaced buckets, :data:`BUCKETS_PER_DOUBLING` per doubling: a
quantile is reported as its bucket's geometric middle, within ±2.2 % of the
true value. Clock offsets use 1 ms buckets (their threshold is 500 ms).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as sf

BUCKETS_PER_DOUBLING = 16  # bucket width 2^(1/16) = 4.4 %: ±2.2 % around the middle
MIN_RTT_MS = 0.001


def log_bucket(value: Column) -> Column:
    """The log-spaced bucket of a positive value (values below 1 µs share the lowest)."""
    return sf.floor(
        sf.log2(sf.greatest(value, sf.lit(MIN_RTT_MS))) * sf.lit(BUCKETS_PER_DOUBLING)
    ).cast("int")


def log_bucket_value(bucket: Column) -> Column:
    """The geometric middle of a log-spaced bucket."""
    return sf.pow(sf.lit(2.0), (bucket + sf.lit(0.5)) / sf.lit(BUCKETS_PER_DOUBLING))


def quantiles(hist: DataFrame, keys: list[str], qs: list[float]) -> DataFrame:
    """Per group, the bucket holding each quantile: ``keys..., q`` (array of bucket numbers).

    Args:
        hist: ``keys..., bucket, n`` with ``n`` rows in each bucket; no duplicate buckets.
        keys: the grouping columns.
        qs: quantiles in [0, 1].

    Returns:
        ``keys..., q``: for each quantile the smallest bucket whose cumulative count
        reaches ``q * total`` (the nearest-rank definition).
    """
    group = Window.partitionBy(*keys)
    ordered = group.orderBy("bucket").rowsBetween(Window.unboundedPreceding, Window.currentRow)
    whole = group.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    cum = hist.select(
        *keys,
        "bucket",
        sf.sum("n").over(ordered).alias("cum"),
        sf.sum("n").over(whole).alias("total"),
    )
    return (
        cum.groupBy(*keys)
        .agg(
            *[
                sf.min(
                    sf.when(sf.col("cum") >= sf.ceil(sf.lit(q) * sf.col("total")), sf.col("bucket"))
                ).alias(f"q{i}")
                for i, q in enumerate(qs)
            ]
        )
        .select(*keys, sf.array(*[sf.col(f"q{i}") for i in range(len(qs))]).alias("q"))
    )
