"""Peer-link frames holding values canonical JSON cannot represent, from a hand-driven peer
over a real loopback link (spec §2.5, §3.8): refused and counted, the link stays up."""

from __future__ import annotations

import cbor2

from hearthnet.clock import now_ms
from hearthnet.mesh.protocol import LinkState
from hearthnet.node import Node
from tests.helpers import wait_until
from tests.mesh.rawpeer import raw_peer

# A tag-1 datetime, a UUID (tag 37), a half-float NaN and 2^64 - 1, as raw CBOR items.
BAD_ITEMS = ["c11a5f000000", "d82550" + "00" * 16, "f97e00", "1bffffffffffffffff"]


def ping_with_ts(seq: int, ts_item: bytes) -> bytes:
    """A ``ping`` link frame whose ``ts`` is the raw CBOR item given."""
    return b"\xa3" + b"".join(
        [
            cbor2.dumps("t"),
            cbor2.dumps("ping"),
            cbor2.dumps("seq"),
            cbor2.dumps(seq),
            cbor2.dumps("ts"),
            ts_item,
        ]
    )


async def test_unrepresentable_peer_frames_are_refused_and_the_link_goes_on(node: Node) -> None:
    """Pings whose ts is a datetime, UUID, NaN or 2^64 - 1 are refused and counted on the
    link (no pong echoes them); a gossiped message nested 1,000 deep is dropped and
    counted; the link stays up and the next good ping is answered."""
    gossip = node.metrics.counter("hearthnet_signature_failures_total", "", ("reason",))
    before = gossip.get("gossip")
    async with raw_peer(node) as peer:
        link = node.mesh.links[peer.node]
        for seq, item in enumerate(BAD_ITEMS, start=1):
            await peer.ws.send_bytes(ping_with_ts(seq, bytes.fromhex(item)))
        await peer.send("msg", raw=b'{"id":' + b"[" * 1000 + b"]" * 1000 + b"}")
        await peer.send("ping", seq=99, ts=now_ms())
        pong = await peer.first("pong")
        await wait_until(lambda: gossip.get("gossip") > before, what="the gossip drop counted")
        state = link.state
    assert (99, len(BAD_ITEMS), LinkState.UP, 1.0) == (
        pong["seq"],
        link.refused_frames,
        state,
        gossip.get("gossip") - before,
    )


async def test_a_frame_with_an_unknown_field_is_refused_and_the_link_goes_on(node: Node) -> None:
    """A ping carrying a field pings do not have gets no pong; the link stays up and the
    next good ping is answered."""
    async with raw_peer(node) as peer:
        link = node.mesh.links[peer.node]
        await peer.send("ping", seq=1, ts=now_ms(), extra=True)
        await peer.send("ping", seq=2, ts=now_ms())
        pong = await peer.first("pong")
        state = link.state
    assert (2, LinkState.UP) == (pong["seq"], state)
