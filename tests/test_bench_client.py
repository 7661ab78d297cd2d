"""The benchmark's WebSocket client (bench/fanout/leanws.mjs) parses frames correctly.

Fan-out numbers are only as true as the load generator that counts them, so its own
client is checked here against a raw server whose writes are cut down to single bytes.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

CHECK = Path(__file__).resolve().parent.parent / "bench" / "fanout" / "leanws_check.mjs"


def test_lean_websocket_client_reassembles_every_frame() -> None:
    """Small frames, a 1 MiB frame, fragments, ping and close arrive intact, both as
    'message' events and through the `onframe` hook the load generator uses."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("Node.js is not installed (.ci/run installs it)")
    done = subprocess.run(
        [node, str(CHECK)], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout.count("leanws ok")) == (0, 2), done.stderr
