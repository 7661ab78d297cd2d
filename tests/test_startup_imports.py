"""What starting a node loads (spec §11: idle node RSS < 60 MiB)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# Loaded only when a node needs them, never at start: `cryptography` (~8 MiB) reads a
# peer's certificate on the first TLS link; the CLI's client (~1.4 MiB) makes a bridge's
# first sync or a carried request.
NOT_AT_START = ("cryptography", "hearthnet.client")

PROGRAM = """
import sys
from pathlib import Path
import hearthnet.cli, hearthnet.node
from hearthnet.identity import load_or_create_keys
from hearthnet.mesh.tls import ensure_certificate, server_context
data = Path(sys.argv[1])
keys = load_or_create_keys(data)
server_context(*ensure_certificate(data, keys))  # made
server_context(*ensure_certificate(data, keys))  # checked and kept
print(" ".join(m for m in sys.argv[2:] if m in sys.modules))
"""


def test_node_start_and_its_certificate_load_no_cryptography(tmp_path: Path) -> None:
    """Importing the node and making and checking its TLS certificate loads neither
    cryptography nor the CLI's client."""
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(tmp_path), *NOT_AT_START],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert "" == done.stdout.strip()
