"""Records on the admitting node's own chain signed at the same moment (spec §1.5): the
node signs each new member's record next on its chain, so joins that arrive together
must each get their own place on it (two signed at once once took the same place, and
the second joiner was refused, and, trying the invite's relays next, told the inviter
was not linked to the relay); and a record the CLI signs with the node's key is signed
again when a join took its place meanwhile."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hearthnet.cli import build_parser
from hearthnet.clock import now_ms
from hearthnet.commands.common import submit_record
from hearthnet.community import Level, MembershipRecord
from hearthnet.identity import KeyPair, load_or_create_keys
from hearthnet.membership import Membership
from hearthnet.mesh.admission import Invite, redeem_invite
from tests.helpers import start_node_process
from tests.integration.mesh_cluster import MESH_ARGS, status_of

pytestmark = pytest.mark.slow

JOINERS = 8


async def test_invites_redeemed_at_once_all_join(tmp_path: Path) -> None:
    """Eight invites of one node redeemed at once: every joiner is admitted."""
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


def test_a_record_whose_place_a_join_took_is_signed_again(tmp_path: Path) -> None:
    """``hearthnet topic rotate`` (as every command that signs a membership record) reads
    the chain's head from the data dir, signs, and posts; a join the node admits in
    between takes that place: the node answers ``place_taken`` and the command signs
    again at the new head instead of failing."""
    founder = start_node_process(tmp_path / "founder", *MESH_ARGS)
    try:
        mesh_url = status_of(founder)["mesh_url"]
        args = build_parser().parse_args(
            ["topic", "rotate", "x.*", "--data-dir", str(founder.data_dir)]
        )
        places: list[int | None] = []

        def sign(keys: KeyPair, membership: Membership) -> MembershipRecord:
            if not places:  # after the first read of the head, a join is admitted
                token = Invite.issue(
                    keys, community=membership.community_id, level=Level.MEMBER,
                    ttl_ms=600_000, now_ms=now_ms(), bootstrap=[mesh_url], nonce="between-1",
                ).encode()  # fmt: skip
                assert asyncio.run(redeem_invite(tmp_path / "joiner", token, name="joiner"))
            record = membership.sign(keys, "topic.rotated", "x.*", now_ms=now_ms())
            places.append(record.signer_seq)
            return record

        record = submit_record(args, sign, "refused")
        members = status_of(founder)["members"]
    finally:
        founder.stop()
    assert ([2, 3], 3, 2) == (places, record.signer_seq, members)
