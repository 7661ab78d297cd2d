"""Gossip takes origins of a federated community on granted topics only (spec §7.3, §8)."""

from __future__ import annotations

from hearthnet.community import Level
from hearthnet.federation.agreement import Revocation
from hearthnet.identity import KeyPair
from hearthnet.mesh.actions import Deliver, Refused
from hearthnet.mesh.frames import Msg
from hearthnet.mesh.gossip import Gossip
from hearthnet.pubsub.envelope import Message
from tests.federation.test_agreement import B_MEMBER, NOW, STRANGER, B, agreement, view_of_a


def outcome(gossip: Gossip, origin_seq: int, topic: str, origin: KeyPair = B) -> str:
    """What the core does with a message from ``origin`` on ``topic``."""
    message = Message.create(origin, topic=topic, msg_type="m", data=1, origin_seq=origin_seq, ts=5)
    result = gossip.receive_msg(Msg(message.raw, 1), "peer")
    return (
        "deliver"
        if isinstance(result, Deliver)
        else (result.label if isinstance(result, Refused) else "other")
    )


def test_foreign_origins_pass_on_granted_topics_until_revoked() -> None:
    """B's node on news.* (granted to A) is delivered; on chat.* or from a stranger it is
    refused like any non-member; after the revocation nothing of B's passes."""
    view = view_of_a(agreement())
    assert Level.MEMBER == view.foreign[B.node_id].level_of(B_MEMBER.node_id)
    gossip = Gossip(
        lambda _id: False, 10, is_member=lambda i: view.membership.level_of(i) is not None
    )
    gossip.foreign_origin = lambda origin, topic: view.accepts_origin(origin, topic, NOW)
    before = [
        outcome(gossip, 1, "news.today"),
        outcome(gossip, 2, "chat.room"),
        outcome(gossip, 1, "news.today", STRANGER),
    ]
    view.add_revocation(Revocation.create(B, agreement().id, NOW))
    after = outcome(gossip, 3, "news.today")
    assert (["deliver", "gossip_origin", "gossip_origin"], "gossip_origin") == (before, after)
