"""Which peers are sent a call's opening again after a path change (spec §8;
mesh/call_hold.py): one whose hello lists ``call_resend`` (it drops an opening it took);
to an older one the other frames go again and a call it may not have seen ends instead;
and what went again is counted. Pure: no sockets."""

from __future__ import annotations

from hearthnet.mesh.call_hold import RESENT_KINDS, CallerResends, ResendCounts
from hearthnet.metrics import MetricsRegistry


def _resends() -> CallerResends:
    """Calls to p: s1 and s2 unanswered, s3 answered with a tool result, s4 cancelled."""
    resends = CallerResends()
    for sid in ("s1", "s2", "s3"):
        resends.opened("p", sid, f"{sid}:call".encode())
    resends.answered("s3")
    resends.tool_result("p", "s3", b"s3:result")
    resends.opened("p", "s4", b"s4:call")
    resends.cancelled("p", "s4", b"s4:cancel")
    return resends


def test_openings_go_again_only_to_a_peer_that_takes_them() -> None:
    """To a peer listing ``call_resend`` the unanswered openings go again with the tool
    results and cancels; to an older one only the tool results and cancels, and the
    unanswered calls are listed to end. An opening the dead link never wrote (handed to
    the link in its place) goes neither again nor is its call ended."""
    newer = _resends().plan("p", openings=True, handed=set())
    older = _resends().plan("p", openings=False, handed=set())
    handed = _resends().plan("p", openings=False, handed={b"s2:call"})
    handed_newer = _resends().plan("p", openings=True, handed={b"s2:call"})
    rest = [("tool_result", b"s3:result"), ("cancel", b"s4:cancel")]
    assert (
        ([("call", b"s1:call"), ("call", b"s2:call"), *rest], []),
        (rest, ["s1", "s2"]),
        (rest, ["s1"]),
        ([("call", b"s1:call"), *rest], []),
        ([], []),
    ) == (newer, older, handed, handed_newer, _resends().plan("q", openings=False, handed=()))


def test_resend_counts_by_kind_in_status_and_metrics() -> None:
    """What went again is counted by kind, with the openings dropped and the calls ended
    for an older peer, in ``/status`` and ``/metrics``."""
    counts = ResendCounts()
    for kind in ("call", "frame", "frame", "ack"):
        counts.sent(kind)
    counts.openings_dropped += 2
    counts.older_peer_ended += 1
    metrics = MetricsRegistry()
    counts.register(metrics)
    text = metrics.render()
    assert (
        {
            "resent": {"call": 1, "tool_result": 0, "cancel": 0, "ack": 1, "frame": 2},
            "openings_dropped": 2,
            "older_peer_ended": 1,
        },
        RESENT_KINDS,
        True,
        True,
        True,
    ) == (
        counts.status(),
        RESENT_KINDS,
        'hearthnet_call_frames_resent{kind="frame"} 2' in text,
        "hearthnet_call_openings_dropped 2" in text,
        "hearthnet_calls_ended_older_peer 1" in text,
    )
