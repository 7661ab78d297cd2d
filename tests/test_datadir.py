"""The data dir's own files: the node's remembered name (real files, no node)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearthnet.config import NodeSection
from hearthnet.datadir import NameFile
from hearthnet.errors import ConfigError

NODE_ID = "ed25519:" + "A" * 43


def test_a_given_name_is_remembered_for_the_starts_without_one(tmp_path: Path) -> None:
    """--name writes the file; a start with none reads it; a new name replaces it."""
    names = NameFile(tmp_path)
    first = names.name_of(NodeSection(name="attic"), NODE_ID, remember=True)
    kept = names.name_of(NodeSection(), NODE_ID, remember=True)
    renamed = names.name_of(NodeSection(name="cellar"), NODE_ID, remember=True)
    after = names.name_of(NodeSection(), NODE_ID, remember=False)
    assert ("attic", "attic", "cellar", "cellar", "cellar\n") == (
        first,
        kept,
        renamed,
        after,
        (tmp_path / "name").read_text(encoding="utf-8"),
    )


def test_without_a_name_ever_given_the_default_is_used_and_nothing_written(
    tmp_path: Path,
) -> None:
    """No file, no configured name: the host-and-short-id default, and no file made."""
    name = NameFile(tmp_path).name_of(NodeSection(), NODE_ID, remember=True)
    assert (NodeSection().display_name(NODE_ID), False) == (name, (tmp_path / "name").exists())


def test_a_name_given_without_remember_is_used_but_not_written(tmp_path: Path) -> None:
    """Commands that only read the identity (community create, a join) do not rename."""
    NameFile(tmp_path).name_of(NodeSection(name="attic"), NODE_ID, remember=True)
    name = NameFile(tmp_path).name_of(NodeSection(name="porch"), NODE_ID, remember=False)
    assert ("porch", "attic") == (name, NameFile(tmp_path).read())


def test_an_unreadable_name_file_says_which_file(tmp_path: Path) -> None:
    """A name file that is not UTF-8 stops the start with an error naming the file."""
    (tmp_path / "name").write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"name.*not UTF-8.*delete the file"):
        NameFile(tmp_path).name_of(NodeSection(), NODE_ID, remember=True)
