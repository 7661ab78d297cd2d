"""Invites redeemed at the same moment (spec §1.5): the admitting node signs each new
member's record next on its own chain, so joins that arrive together must each get
their own place on it. Two signed at once once took the same place, and the second
joiner was refused (and, trying the invite's relays next, told the inviter was not
linked to the relay)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hearthnet.clock import now_ms
from hearthnet.community import Level
from hearthnet.identity import load_or_create_keys
from hearthnet.mesh.admission import Invite, redeem_invite
from tests.helpers import start_node_process
from tests.integration.mesh_cluster import MESH_ARGS, status_of

pytestmark = pytest.mark.slow

JOINERS = 8


async def test_invites_redeemed_at_once_all_join(tmp_path: Path) -> None:
    founder = start_node_process(tmp_path / "founder", *MESH_ARGS)
    try:
        keys = load_or_create_keys(founder.data_dir)
        mesh_url = status_of(founder)["mesh_url"]
        tokens = [
            Invite.issue(
                keys,
                community=founder.fields["community"],
                level=Level.MEMBER,
                ttl_ms=600_000,
                now_ms=now_ms(),
                bootstrap=[mesh_url],
                nonce=f"at-once-{i:04d}",
            ).encode()
            for i in range(JOINERS)
        ]
        joined = await asyncio.gather(
            *(
                redeem_invite(tmp_path / f"joiner{i}", token, name=f"joiner{i}")
                for i, token in enumerate(tokens)
            ),
            return_exceptions=True,
        )
        members = status_of(founder)["members"]
    finally:
        founder.stop()
    assert ([True] * JOINERS, 1 + JOINERS) == (joined, members)
