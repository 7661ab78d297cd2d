"""What a provider sends again when the link to a caller dies and the peer's sequence is
held (spec §8; mesh/call_hold.py): reply frames not acknowledged, per call, bounded. Pure."""

from __future__ import annotations

from hearthnet.mesh.call_hold import MAX_ENDED, ReplyTails


def _frames(tails: ReplyTails, peer: str, sid: str, seqs: range) -> None:
    for seq in seqs:
        tails.sent(peer, sid, seq, f"{sid}:{seq}".encode())


def test_what_the_caller_acknowledged_is_not_sent_again() -> None:
    """Frames 1-5 of call s1 and 1-2 of s2 to p, 1 of s3 to q; p acknowledged s1 up to 3:
    p gets s1's 4-5 and s2's 1-2 again, in order, call after call."""
    tails = ReplyTails()
    _frames(tails, "p", "s1", range(1, 6))
    _frames(tails, "p", "s2", range(1, 3))
    _frames(tails, "q", "s3", range(1, 2))
    tails.acked("p", "s1", 3)
    tails.acked("p", "s9", 3)  # an ack for a call it does not know: nothing
    assert [b"s1:4", b"s1:5", b"s2:1", b"s2:2"] == tails.again("p")


def test_an_ended_call_keeps_its_last_frames_among_the_last_max_ended() -> None:
    """A call that ended keeps what the caller has not acknowledged (its final frame is
    never acknowledged) until MAX_ENDED calls ended after it; one wholly acknowledged
    keeps nothing."""
    tails = ReplyTails()
    _frames(tails, "p", "acked", range(1, 3))
    tails.acked("p", "acked", 2)
    tails.ended("p", "acked")
    for i in range(MAX_ENDED + 1):
        _frames(tails, "p", f"c{i}", range(1, 2))
        tails.ended("p", f"c{i}")
    again = tails.again("p")
    assert (MAX_ENDED, b"c1:1", f"c{MAX_ENDED}:1".encode()) == (len(tails), again[0], again[-1])


def test_forgetting_a_peer_drops_its_calls_only() -> None:
    """The calls with p ended with its link: nothing of them is kept; q's are."""
    tails = ReplyTails()
    _frames(tails, "p", "s1", range(1, 3))
    tails.ended("p", "s1")
    _frames(tails, "p", "s2", range(1, 2))
    _frames(tails, "q", "s3", range(1, 2))
    tails.forget("p")
    assert ([], [b"s3:1"], 1) == (tails.again("p"), tails.again("q"), len(tails))
