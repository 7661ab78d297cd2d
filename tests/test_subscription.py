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
