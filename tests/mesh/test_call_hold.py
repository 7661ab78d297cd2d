"""What each end of a call sends again when the link under it changed (a fall-back to the
relay, a held sequence taken up; spec §8, mesh/call_hold.py): a provider's reply frames
not acknowledged, a caller's unanswered openings, tool results and cancels, each
bounded; and the openings a provider took, so one sent again is dropped. Pure."""

from __future__ import annotations

from hearthnet.mesh.call_hold import (
    MAX_CANCELS,
    MAX_ENDED,
    MAX_RESULTS,
    CallerResends,
    ReplyTails,
    SeenCalls,
)


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


def test_a_caller_sends_again_unanswered_openings_its_tool_results_and_cancels() -> None:
    """Calls s1 (answered), s2 (not answered), s3 (answered, two tool results) and s4
    (cancelled) to p, s5 (not answered) to q: p gets s2's opening, s3's tool results and
    s4's cancel again, in that order; q only s5's opening."""
    resends = CallerResends()
    for sid, peer in (("s1", "p"), ("s2", "p"), ("s3", "p"), ("s4", "p"), ("s5", "q")):
        resends.opened(peer, sid, f"call {sid}".encode())
    for sid in ("s1", "s3", "s4"):
        resends.answered(sid)
    resends.tool_result("p", "s3", b"result 1 of s3")
    resends.tool_result("p", "s3", b"result 2 of s3")
    resends.cancelled("p", "s4", b"cancel s4")
    assert (
        [b"call s2", b"result 1 of s3", b"result 2 of s3", b"cancel s4"],
        [b"call s5"],
    ) == (resends.again("p"), resends.again("q"))


def test_a_call_that_ended_keeps_only_its_cancel_and_the_bounds_hold() -> None:
    """A call that ended whole is sent again in nothing (its opening and tool results
    are dropped); a running call keeps its last MAX_RESULTS tool results; only the last
    MAX_CANCELS cancels are kept; forgetting p drops all of p's."""
    resends = CallerResends()
    resends.opened("p", "done", b"call done")
    resends.tool_result("p", "done", b"result of done")
    resends.ended("done")
    for i in range(MAX_RESULTS + 2):
        resends.tool_result("p", "s1", f"r{i}".encode())
    for i in range(MAX_CANCELS + 1):
        resends.cancelled("p", f"c{i}", f"cancel c{i}".encode())
    again = resends.again("p")
    resends.forget("p")
    assert (
        [f"r{i}".encode() for i in range(2, MAX_RESULTS + 2)],
        b"cancel c1",
        f"cancel c{MAX_CANCELS}".encode(),
        MAX_RESULTS + MAX_CANCELS,
        [],
    ) == (again[:MAX_RESULTS], again[MAX_RESULTS], again[-1], len(again), resends.again("p"))


def test_a_provider_takes_a_call_opening_once_per_peer_within_its_bound() -> None:
    """An opening sent again (same peer, same id) is not taken; the same id from another
    peer is; past max_seen openings the oldest is forgotten."""
    seen = SeenCalls(max_seen=2)
    firsts = [seen.first("p", "s1"), seen.first("p", "s1"), seen.first("q", "s1")]
    firsts.append(seen.first("p", "s2"))  # evicts (p, s1)
    firsts.append(seen.first("p", "s1"))
    assert [True, False, True, True, True] == firsts
