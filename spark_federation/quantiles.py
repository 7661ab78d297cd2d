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

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from pyspark.sql import Column
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


def bucket_value(bucket: int) -> float:
    """:func:`log_bucket_value` on the driver (for the report's charts)."""
    return float(2.0 ** ((bucket + 0.5) / BUCKETS_PER_DOUBLING))


def histogram_quantiles(
    keys: Sequence[npt.NDArray[np.int64]],
    bucket: npt.NDArray[np.int64],
    n: npt.NDArray[np.int64],
    qs: Sequence[float],
) -> tuple[list[npt.NDArray[np.int64]], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per group, the bucket holding each quantile (nearest rank), on the driver, for a
    histogram collected as arrays (Spark's window over a histogram sorted it per table).

    Args:
        keys: the grouping columns, one array each.
        bucket: each row's bucket (a bucket may repeat within a group).
        n: rows in each bucket (at least 1).
        qs: quantiles in (0, 1].

    Returns:
        (the groups' keys, ordered by them; per group and quantile the smallest bucket
        whose cumulative count reaches ``q * total``, shape groups x quantiles; per group
        the total count).
    """
    order = np.lexsort((bucket, *reversed(keys)))
    sorted_keys = [k[order] for k in keys]
    cum = np.cumsum(n[order])
    if len(cum) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return sorted_keys, np.zeros((0, len(qs)), dtype=np.int64), empty
    new = np.zeros(len(cum), dtype=bool)
    new[0] = True
    for k in sorted_keys:
        new[1:] |= k[1:] != k[:-1]
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], len(cum)) - 1
    before = np.where(starts > 0, cum[starts - 1], 0)
    total = cum[ends] - before
    # the nearest rank: the first row of the group whose running count reaches ceil(q * total)
    at = np.stack(
        [np.searchsorted(cum, before + np.ceil(q * total).astype(np.int64)) for q in qs], axis=1
    )
    return [k[starts] for k in sorted_keys], bucket[order][at], total
