"""Listing the exports: a local input listed by Python exactly as Hadoop lists it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from spark_federation import exports
from spark_federation.errors import MeshHealthError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _tree(root: Path) -> Path:
    """Export dirs at two depths, hidden and unknown files, a linked export dir."""
    files = [
        "in/site/a/heartbeats/1.jsonl",
        "in/site/a/heartbeats/.1.jsonl.crc",
        "in/site/a/heartbeats/_SUCCESS",
        "in/site/a/beacons/b.parquet",
        "in/b/heartbeats/2.parquet",
        "in/b/heartbeats/notes.txt",
        "in/b/traces/t.jsonl.gz",
        "in/.hidden/heartbeats/4.jsonl",
        "in/top.jsonl",
        "elsewhere/heartbeats/3.jsonl",
    ]
    for f in files:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text("")
    (root / "in" / "linked").symlink_to(root / "elsewhere")
    return root / "in"


def test_local_listing_is_hadoops(spark: Any, tmp_path: Path) -> None:
    """Same files, same order, same path strings as Hadoop's recursive listing, for a
    path, a path with a trailing slash, a relative path and a file: URI."""
    tree = _tree(tmp_path)
    relative = os.path.relpath(tree)
    inputs = [str(tree), f"{tree}/", relative, tree.as_uri(), f"{tree}/../in"]
    inputs += [str(FIXTURES / "heartbeats_6node"), str(FIXTURES / "heartbeats_6node" / "n0")]
    for uri in inputs:
        assert exports.local_root(uri) is not None
        hadoop = list(exports.hadoop_files(spark, uri))
        assert (uri, hadoop) == (uri, list(exports._listing(spark, uri)))
    found = exports.discover(spark, str(tree))
    assert {
        "exports": sorted(found.exports),
        "jsonl": found.jsonl["heartbeats"],
        "parquet": found.parquet["heartbeats"] + found.parquet["beacons"],
        "traces": found.jsonl["traces"],
    } == {
        "exports": sorted(f"file:{tree}/{d}" for d in ("site/a", "b", ".hidden", "linked")),
        "jsonl": sorted(
            (
                f"file:{tree}/{d}"
                for d in (
                    "site/a/heartbeats/1.jsonl",
                    ".hidden/heartbeats/4.jsonl",
                    "linked/heartbeats/3.jsonl",
                )
            ),
            key=list(exports.hadoop_files(spark, str(tree))).index,
        ),
        "parquet": [f"file:{tree}/b/heartbeats/2.parquet", f"file:{tree}/site/a/beacons/b.parquet"],
        "traces": [f"file:{tree}/b/traces/t.jsonl.gz"],
    }


def test_other_file_systems_are_left_to_hadoop() -> None:
    """Only file: URIs without a host, and paths when the default file system is the
    local one, are listed by Python."""
    assert [
        exports.local_root("hdfs://nn:8020/exports"),
        exports.local_root("s3a://bucket/exports"),
        exports.local_root("file://host/exports"),
        exports.local_root("/exports", default_fs="hdfs://nn:8020"),
        exports.local_root("file:///exports/", default_fs="hdfs://nn:8020"),
        exports.local_root("/a/b/../c:d"),
    ] == [None, None, None, None, "/exports", "/a/c:d"]


def test_a_missing_local_input_is_one_error(spark: Any, tmp_path: Path) -> None:
    """A local input that does not exist, or holds no heartbeat files, is a MeshHealthError."""
    with pytest.raises(MeshHealthError, match="does not exist"):
        exports.discover(spark, str(tmp_path / "nope"))
    (tmp_path / "x" / "beacons").mkdir(parents=True)
    (tmp_path / "x" / "beacons" / "b.jsonl").write_text("")
    with pytest.raises(MeshHealthError, match="no heartbeat files"):
        exports.discover(spark, str(tmp_path))
