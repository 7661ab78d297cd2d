"""What a community admin running nodes meets when following docs/operations.md and
docs/configuration.md against real node processes: each command works as written, and
each mistake is answered with what to do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from hearthnet import __version__
from tests.helpers import start_node_process
from tests.integration.mesh_cluster import MESH_ARGS


def _module(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """``python -m hearthnet ARGS`` with ``HOME`` at ``home`` (bounded)."""
    return subprocess.run(
        [sys.executable, "-m", "hearthnet", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
    )


def test_python_dash_m_hearthnet_is_the_hearthnet_command(tmp_path: Path) -> None:
    """``python -m hearthnet`` (a checkout, or a venv whose bin/ is not on PATH) once failed
    with "No module named hearthnet.__main__"; it is the ``hearthnet`` command."""
    node = start_node_process(tmp_path / "data", *MESH_ARGS)
    try:
        version = _module("--version", home=tmp_path)
        status = _module(
            "node", "status", "--json", "--data-dir", str(node.data_dir), home=tmp_path
        )
    finally:
        node.stop()
    assert (0, f"hearthnet {__version__}", 0, True) == (
        version.returncode,
        version.stdout.strip(),
        status.returncode,
        f'"node": "{node.fields["node"]}"' in status.stdout,
    )
