"""`hearthnet console` without what it needs: the node's keys, a running node."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from hearthnet.cli import main
from hearthnet.identity import load_or_create_keys


def _console(data_dir: Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["console", "--data-dir", str(data_dir)])
    return code, out.getvalue(), err.getvalue()


def test_no_keys_no_url(tmp_path: Path) -> None:
    """A data dir without keys is an error (exit 1) and prints no URL."""
    code, out, err = _console(tmp_path)
    assert (1, "", True) == (code, out, "no keys" in err)


def test_no_running_node(tmp_path: Path) -> None:
    """Keys but no running node: exit 3 (spec §9), no URL."""
    load_or_create_keys(tmp_path)
    code, out, _ = _console(tmp_path)
    assert (3, "") == (code, out)
