"""Calls that arrive over peer links (spec §2.3, §11): verified like HTTP calls, their
signatures checked by the node's checker process when calls overlap."""

from __future__ import annotations

from typing import Any

from hearthnet.clock import now_ms
from hearthnet.frames import Frame
from hearthnet.ids import new_ulid
from hearthnet.mesh.call_frames import Call, Cancel
from hearthnet.mesh.protocol import decode_frame
from hearthnet.mesh.remote import _Outgoing
from hearthnet.node import Node
from tests.helpers import wait_until


class Link:
    """The peer end of a link: what the node sends back on it."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.sent: list[dict[str, Any]] = []

    def send_raw(self, data: bytes) -> bool:
        """Keep the frame."""
        self.sent.append(decode_frame(data))
        return True


def call_frame(node: Node, sid: str, value: int, *, forged: bool = False) -> Call:
    """A call of echo signed by ``node``'s key, as a peer passes it on (forged: the
    envelope changed after signing)."""
    envelope = {
        "body": {"input": {"i": value}},
        "capability": "echo",
        "version": "1.0",
        "request_id": new_ulid(),
        "from": node.keys.node_id,
        "community": node.membership.community_id,
        "ts": now_ms(),
    }
    signature = node.keys.sign_object(envelope)
    if forged:
        envelope["body"] = {"input": {"i": -1}}
    return Call(sid, None, envelope, signature)


def outcome(link: Link, sid: str) -> Any:
    """The output or error code the call ``sid`` ended with."""
    for sent in link.sent:
        frame = sent["f"]
        if sent["sid"] == sid and frame["event"] in ("output", "error"):
            return frame["data"].get("code") or frame["data"]
    return None


async def test_overlapping_peer_calls_are_checked_by_the_checker_process(node: Node) -> None:
    """Calls from a peer that arrive together are checked by the checker: each answered
    as on the loop, a forged one refused, a replayed one refused, one cancelled while
    checked dropped, nothing left held."""
    link = Link("ed25519:" + "A" * 43)
    remote = node.mesh.remote
    frames = [call_frame(node, f"s{i}", i, forged=i == 3) for i in range(8)]
    for frame in frames:
        remote.on_call(link, frame)
    remote.on_call(link, call_frame(node, "gone", 0))
    remote.on_cancel(link, Cancel("gone"))
    sids = [f.sid for f in frames]
    await wait_until(lambda: all(outcome(link, s) for s in sids), 10.0, "every call answered")
    again = Call("s9", None, frames[0].envelope, frames[0].signature)
    remote.on_call(link, again)  # the same request id and signature: a replay
    await wait_until(lambda: outcome(link, "s9") is not None, 10.0, "the replay answered")
    expected: list[Any] = [{"echo": {"i": i}} for i in range(8)]
    expected[3] = "invalid_signature"
    await wait_until(lambda: not remote.incoming, 10.0, "no call held")
    assert (
        [outcome(link, s) for s in sids],
        outcome(link, "s9"),
        outcome(link, "gone"),
        node.signatures.starts,
    ) == (expected, "replayed", None, 1)


def test_a_replys_frames_count_once_in_number_order_and_a_gap_ends_it() -> None:
    """Frames 1, 2, 2 again, 3, 5: next, next, again, next, gap (4 was lost)."""
    out = _Outgoing("ed25519:provider")
    got = [out.arrival(Frame("token", {}, n)) for n in (1, 2, 2, 3, 5)]
    assert (["next", "next", "again", "next", "gap"], 3) == (got, out.seq)
