"""The client's resume state: cursor, dedupe, resume point, acks (spec §3.7). Pure."""

from __future__ import annotations

from hearthnet.subscription import ResumeState


def env(msg_id: str, ts: int) -> dict[str, object]:
    """A minimal envelope."""
    return {"id": msg_id, "ts": ts}


def test_duplicates_are_dropped_and_the_cursor_moves() -> None:
    """The same id twice yields one delivery; the cursor is the highest seq seen."""
    state = ResumeState(window=8)
    state.subscribed("ep", 0)
    first = state.accept(1, env("a", 10))
    dup = state.accept(2, env("a", 10))
    assert (1, None, {"epoch": "ep", "seq": 2}) == (
        first.seq if first else None,
        dup,
        state.since(),
    )


def test_reset_resumes_by_time() -> None:
    """After an epoch reset the next subscribe asks by the last ts seen."""
    state = ResumeState()
    state.subscribed("ep", 0)
    state.accept(3, env("a", 500))
    state.reset()
    assert {"ts": 500} == state.since()


def test_lean_frames_are_each_delivered_and_give_no_resume_time() -> None:
    """Frames without id or ts (subscribe fields) are all delivered; a reset then resumes
    live, not from time 0."""
    state = ResumeState()
    state.subscribed("ep", 0)
    got = [state.accept(seq, {"data": seq}) for seq in (1, 2)]
    state.reset()
    assert ([1, 2], None) == ([d.seq for d in got if d is not None], state.since())


def test_cursor_ahead_resumes_from_the_nodes_head_in_the_same_epoch() -> None:
    """A cursor beyond the node's head rewinds to that head: what comes after is asked for."""
    state = ResumeState()
    state.subscribing({"epoch": "ep", "seq": 90})
    state.subscribed("ep", 90)
    state.accept(91, env("a", 500))
    state.subscribing(state.since())  # reconnected to a node whose log ends at 40
    state.reset("cursor_ahead", "ep", 40)
    assert {"epoch": "ep", "seq": 40} == state.since()


def test_cursor_ahead_before_anything_arrived_resumes_from_the_head() -> None:
    """A first cursor beyond the head (nothing received, no time known) resumes from the
    head the reset names, not live from whenever the next subscribe lands."""
    state = ResumeState()
    state.subscribing({"epoch": "ep", "seq": 999})
    state.reset("cursor_ahead", "ep", 0)
    assert {"epoch": "ep", "seq": 0} == state.since()


def test_a_reset_without_a_head_resumes_by_time() -> None:
    """A cursor_ahead reset that names no head (an older node) falls back to time."""
    state = ResumeState()
    state.subscribed("ep", 0)
    state.accept(3, env("a", 500))
    state.reset("cursor_ahead")
    assert {"ts": 500} == state.since()


def test_acks_at_half_window_or_when_idle() -> None:
    """Acks go at window/2 frames, or earlier when the reader is about to wait."""
    state = ResumeState(window=4)
    state.subscribed("ep", 0)
    state.accept(1, env("a", 1))
    busy = state.ack_due(idle=False)
    state.accept(2, env("b", 1))
    half = state.ack_due(idle=False)
    state.accept(5, env("c", 1))
    idle = state.ack_due(idle=True)
    assert (None, 2, 5, None) == (busy, half, idle, state.ack_due(idle=True))


def test_fresh_subscription_starts_at_head() -> None:
    """A first subscribe without since takes the node's head as its cursor."""
    state = ResumeState()
    assert None is state.since()
    state.subscribed("ep", 41)
    assert {"epoch": "ep", "seq": 41} == state.since()


def test_a_backlog_start_keeps_its_cursor_below_the_head_and_acks_what_arrived() -> None:
    """`last: N` (or ts) starts below the head: the cursor is what arrived, acks never
    name an undelivered seq, and before anything arrives a reconnect asks for N again."""
    state = ResumeState(window=4)
    state.subscribing({"last": 50})
    state.subscribed("ep", 100)
    before = state.since()
    state.accept(51, env("a", 1))
    state.accept(52, env("b", 1))
    assert (before, state.ack_due(idle=False), state.since()) == (
        {"last": 50},
        52,
        {"epoch": "ep", "seq": 52},
    )


def test_a_durable_consumer_never_takes_the_head_as_its_cursor() -> None:
    """The node redelivers from its stored cursor, below the head."""
    state = ResumeState(window=4, consumer=True)
    state.subscribing(None)
    state.subscribed("ep", 90)
    state.accept(61, env("a", 1))
    state.accept(62, env("b", 1))
    assert (state.seq, state.ack_due(idle=False)) == (62, 62)


def test_reset_forgets_the_start_of_the_old_epoch() -> None:
    """After a reset the old cursor is not asked for again; time is."""
    state = ResumeState()
    state.subscribing({"epoch": "old", "seq": 7})
    state.accept(9, env("a", 700))
    state.reset()
    assert state.since() == {"ts": 700}


def test_a_new_session_acks_its_own_deliveries_even_when_all_are_duplicates() -> None:
    """After a reconnect the node redelivers from its cursor; the client has seen those
    messages but must still ack them, or the new session's window never opens."""
    state = ResumeState(window=4, consumer=True)
    state.subscribing(None)
    for seq in (1, 2, 3, 4):
        state.accept(seq, env(f"m{seq}", 1))
    state.ack_due(idle=False)
    state.subscribing(None)  # reconnected; the node had only seen the ack of 2
    state.accept(3, env("m3", 1))
    state.accept(4, env("m4", 1))
    assert state.ack_due(idle=False) == 4
