"""``key  value`` output of ``node status`` and ``keys show`` (docs/cli.md)."""

from __future__ import annotations

import pytest

from hearthnet.commands.output import print_fields


def test_sections_of_sections_get_a_line_each(capsys: pytest.CaptureFixture[str]) -> None:
    """``relaying: {relay: {...}, paths: {...}}`` prints ``relaying.relay`` and
    ``relaying.paths`` lines, keys aligned; a flat section stays on its line."""
    print_fields(
        {
            "name": "vm-kx3q",
            "relaying": {"relay": {"members": 2, "routes": 0}, "paths": {"relayed": 1}},
            "signatures": {"batch_signatures": 3},
        }
    )
    assert [
        "name            vm-kx3q",
        "relaying.relay  members=2, routes=0",
        "relaying.paths  relayed=1",
        "signatures      batch_signatures=3",
    ] == capsys.readouterr().out.splitlines()
