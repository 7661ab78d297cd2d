"""Running a script as an ES module in Node.js, for the tests of the JavaScript the node
serves (hearthnet.js, the console): the JSON the script prints."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest

NODE = shutil.which("node")
needs_node = pytest.mark.skipif(NODE is None, reason="no node (apt-get install nodejs)")


def run_module(script: str, timeout: float = 30) -> Any:
    """Run ``script`` as an ES module in Node.js; the JSON it prints."""
    assert NODE is not None
    out = subprocess.run(
        [NODE, "--input-type=module", "-e", script],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return json.loads(out.stdout)
