"""A bridge whose peer stays out of reach logs it once, not every round."""

from __future__ import annotations

import pytest

from hearthnet.federation.bridge import SYNC_S
from hearthnet.identity import KeyPair
from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import wait_until

NOBODY = KeyPair.from_seed(b"\x5a" * 32).node_id  # linked to no one: no path to it


async def test_an_unreachable_bridge_peer_is_logged_once(
    make_config: MakeConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """Each round's sync with ``mesh:<NodeID>`` fails the same way; one line says so."""
    caplog.set_level("INFO", logger="hearthnet.federation")
    config = make_config(mesh={"federation_peers": [f"mesh:{NOBODY}"]})

    def failures() -> list[str]:
        return [
            r.getMessage()
            for r in caplog.records
            if r.getMessage().startswith(f"federation sync with mesh:{NOBODY} failed")
        ]

    async with Node(config) as node:
        await wait_until(lambda: bool(failures()), 3 * SYNC_S, "a failed sync")
        for _ in range(2):  # two more rounds, failing alike (run's rounds, without its wait)
            await node.federation_bridge.tick()
    assert 1 == len(failures()), failures()
