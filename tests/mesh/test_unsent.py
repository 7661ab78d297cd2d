"""What a dying direct link never wrote, kept for the link that takes its place (spec §8;
mesh/unsent.py): in order, bounded, heartbeats, ``bye`` and ``caps`` left out. Pure."""

from __future__ import annotations

from hearthnet.mesh.protocol import encode_frame
from hearthnet.mesh.unsent import MAX_BYTES, MAX_FRAMES, UnsentFrames, handed_on


def _presence(i: int) -> bytes:
    return encode_frame("presence", id=f"p{i}", events=[], ttl=1)


def test_queued_frames_come_before_refused_ones_and_control_frames_are_left_out() -> None:
    """Queued presence 1 and a ping, then refused presence 2, a bye and a caps: presence
    1 and 2 are handed on, in that order, once."""
    unsent = UnsentFrames()
    for frame in (_presence(2), encode_frame("bye", code="x", reason="y")):
        unsent.keep(frame)
    unsent.keep(encode_frame("caps", providers=[]))
    queued = [_presence(1), encode_frame("ping", n=1, ts=1)]
    assert ([_presence(1), _presence(2)], []) == (unsent.take(queued), unsent.take([]))


def test_past_the_bounds_frames_are_dropped_and_counted() -> None:
    """MAX_FRAMES + 3 frames: the first MAX_FRAMES are handed on, 3 counted dropped; a
    frame that alone passes MAX_BYTES is dropped too."""
    unsent = UnsentFrames()
    for i in range(MAX_FRAMES + 3):
        unsent.keep(_presence(i))
    took = unsent.take([])
    big = UnsentFrames()
    big.keep(encode_frame("msg", m={"pad": "x" * MAX_BYTES}))
    assert (MAX_FRAMES, _presence(0), 3, [], 1) == (
        len(took),
        took[0],
        unsent.dropped,
        big.take([]),
        big.dropped,
    )


def test_only_heartbeats_bye_and_caps_are_not_handed_on() -> None:
    """The kinds' heads as encoded: gossip, presence, membership and call frames are
    handed on."""
    kinds = {
        "ping": encode_frame("ping", n=1, ts=1),
        "pong": encode_frame("pong", n=1, ts=1),
        "bye": encode_frame("bye", code="x", reason="y"),
        "caps": encode_frame("caps", providers=[]),
        "presence": _presence(1),
        "msg": encode_frame("msg", m={}),
        "frame": encode_frame("frame", sid="s", f={}),
        "cancel": encode_frame("cancel", sid="s"),
    }
    assert {"presence", "msg", "frame", "cancel"} == {k for k, f in kinds.items() if handed_on(f)}
