"""Where the job's tables go: one Parquet file each, NodeIDs readable, rows handed back.

The tables are small aggregates. In local mode with a ``file:`` destination the rows
the summary needs are read back from the file just written (no second Spark job for
a collect); elsewhere (a cluster, another file system) the table is cached, written
from the cache and collected from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as sf


@dataclass(slots=True)
class Tables:
    """Where tables go, and the id→NodeID map used to write them readable."""

    uri: str
    names: dict[int, str]
    cached: list[DataFrame]
    local_dir: Path | None = None
    written: list[str] = field(default_factory=list)

    def _map(self) -> Column:
        # one array literal per side, not one expression per node: the plan stays
        # small for thousands of nodes
        keys = sf.lit(list(self.names)).cast("array<bigint>")
        return sf.map_from_arrays(keys, sf.lit(list(self.names.values())).cast("array<string>"))

    def node(self, c: Column) -> Column:
        """The NodeID for an id column."""
        return sf.try_element_at(self._map(), c)

    def nodes(self, c: Column) -> Column:
        """NodeIDs for an array-of-ids column."""
        return sf.transform(c, lambda x: sf.try_element_at(self._map(), x))

    def write(self, df: DataFrame, name: str, *order: str) -> list[dict[str, Any]]:
        """Write one small aggregated table as a single Parquet file; returns its rows
        as :func:`rows` does.

        When the tables are on the driver's file system (local mode, a ``file:`` URI)
        the rows are read back from the file just written, without another Spark job;
        otherwise the table is computed once into the cache, written from it, and
        collected from it.
        """
        path = f"{self.uri.rstrip('/')}/{name}"
        local = self.local_dir is not None
        kept = df if local else df.persist()
        if not local:
            self.cached.append(kept)
        kept.coalesce(1).write.mode("overwrite").parquet(path)
        self.written.append(name)
        if self.local_dir is None:
            return rows(kept, *order)
        read: list[dict[str, Any]] = pq.read_table(self.local_dir / name).to_pylist()
        return _sorted(read, order)


def rows(df: DataFrame, *order: str) -> list[dict[str, Any]]:
    """Collect a small result as plain dicts, sorted by ``order`` (nulls first, as Spark
    sorts) on the driver: a Spark ``orderBy`` would add a sampling job and a sort stage."""
    return _sorted([r.asDict() for r in df.collect()], order)


def _sorted(found: list[dict[str, Any]], order: tuple[str, ...]) -> list[dict[str, Any]]:
    if order:
        found.sort(key=lambda r: tuple((r[k] is not None, r[k]) for k in order))
    return found
