"""The window of publish keys (hearthnet.pubsub.idempotency), pure: claims, duplicates
in flight and committed, expiry, the bound, refusals, and the key's rule."""

from __future__ import annotations

import pytest

from hearthnet.clock import now_ms
from hearthnet.errors import BadRequest, HearthNetError, Unavailable
from hearthnet.pubsub.envelope import Message, StoredMessage
from hearthnet.pubsub.idempotency import PublishKeys, Receipt, Reply, refusal, validate_key
from tests.pubsub.test_log import KEYS

Replies = list[Receipt | Exception]


def ignore(outcome: Receipt | Exception) -> None:
    """A reply for a claim that must be the first (never told anything)."""
    raise AssertionError(f"a first claim was answered: {outcome!r}")


def claim(keys: PublishKeys, owner: str, key: str, reply: Reply, now: float) -> bool:
    """Claim as the publish paths do: True for the first; a duplicate's ``reply`` is
    told the committed answer now, or added to the waiting list of the one in flight."""
    claimed = keys.claim(owner, key, now)
    if claimed is None:
        return True
    if isinstance(claimed, Receipt):
        reply(claimed)
    else:
        claimed.append(reply)
    return False


def stored(seq: int) -> StoredMessage:
    """A committed message numbered ``seq``."""
    body = Message.unsigned(
        KEYS.node_id, topic="k.t", msg_type="m", data=seq, origin_seq=seq, ts=now_ms()
    )
    return StoredMessage(seq, Message.signed(KEYS, body))


@pytest.mark.parametrize("key", ["a", "k" * 64, "order 17/2026-11-28 ~#!", " ", "~"])
def test_printable_ascii_keys_of_1_to_64_characters_are_taken(key: str) -> None:
    assert key == validate_key(key)


@pytest.mark.parametrize("key", ["", "k" * 65, "caf\u00e9", "a\nb", "tab\t", "\x7f", 17, b"k"])
def test_other_keys_are_refused_naming_the_rule(key: object) -> None:
    with pytest.raises(BadRequest) as err:
        validate_key(key)
    assert "idempotency_key is a string of 1..64 printable ASCII characters" == err.value.message


def test_a_committed_key_answers_its_duplicates_with_the_first_receipt() -> None:
    """The first claim publishes; once settled, a claim of the same owner and key is a
    duplicate answered at once with the same id and seq; another owner's same key and
    the same owner's other key are new."""
    keys = PublishKeys(window_s=120, max_keys=10)
    replies: Replies = []
    assert claim(keys, "alice", "k1", replies.append, 0.0)
    first = stored(7)
    keys.settle("alice", "k1", first, 1.0)
    answer = Receipt.of(first)
    assert Receipt(first.message.id, 7, 7, first.message.ts) == answer
    assert not claim(keys, "alice", "k1", replies.append, 2.0)
    assert [answer._replace(duplicate=True)] == replies
    assert claim(keys, "bob", "k1", replies.append, 2.0)
    assert claim(keys, "alice", "k2", replies.append, 2.0)
    assert 1 == len(replies)
    assert {
        "id": first.message.id,
        "seq": 7,
        "origin_seq": 7,
        "ts": first.message.ts,
        "duplicate": True,
    } == replies[0].answer()  # type: ignore[union-attr]
    assert "duplicate" not in answer.answer()


def test_duplicates_in_flight_wait_for_the_first_and_get_its_answer() -> None:
    """Two more claims while the first is in flight are duplicates: nothing is told
    until the first settles, then each gets its receipt."""
    keys = PublishKeys(window_s=120, max_keys=10)
    replies: Replies = []
    assert claim(keys, "alice", "k", replies.append, 0.0)
    assert not claim(keys, "alice", "k", replies.append, 0.1)
    assert not claim(keys, "alice", "k", replies.append, 0.2)
    assert ([], 1) == (replies, keys.in_flight)
    first = stored(3)
    keys.settle("alice", "k", first, 0.3)
    assert [Receipt.of(first)._replace(duplicate=True)] * 2 == replies
    assert (0, 1) == (keys.in_flight, len(keys))


def test_a_refused_first_publish_refuses_its_waiters_and_forgets_the_key() -> None:
    keys = PublishKeys(window_s=120, max_keys=10)
    replies: Replies = []
    assert claim(keys, "alice", "k", replies.append, 0.0)
    assert not claim(keys, "alice", "k", replies.append, 0.0)
    full = Unavailable("the queue is full", retry_after_ms=200)
    keys.settle("alice", "k", full, 0.1)
    assert [full] == replies
    assert claim(keys, "alice", "k", replies.append, 0.2)  # a retry publishes anew
    assert 1 == len(replies)


def test_a_first_publish_the_log_held_already_is_an_internal_error() -> None:
    keys = PublishKeys(window_s=120, max_keys=10)
    replies: Replies = []
    assert claim(keys, "alice", "k", ignore, 0.0)
    assert not claim(keys, "alice", "k", replies.append, 0.0)
    keys.settle("alice", "k", None, 0.0)
    assert ["internal_error"] == [r.code for r in replies]  # type: ignore[union-attr]
    assert isinstance(refusal(None), HearthNetError)
    assert 0 == len(keys)


def test_a_key_is_forgotten_once_its_window_from_the_commit_has_passed() -> None:
    keys = PublishKeys(window_s=10, max_keys=10)
    replies: Replies = []
    assert claim(keys, "alice", "k", replies.append, 0.0)
    keys.settle("alice", "k", stored(1), 5.0)  # the window counts from the commit
    assert not claim(keys, "alice", "k", replies.append, 14.9)
    assert claim(keys, "alice", "k", replies.append, 15.0)
    assert 1 == len(replies)
    assert 0 == len(keys)


def test_expired_keys_go_oldest_first_and_later_ones_stay() -> None:
    keys = PublishKeys(window_s=10, max_keys=100)
    for i in range(5):
        assert claim(keys, "alice", f"k{i}", ignore, float(i))
        keys.settle("alice", f"k{i}", stored(i + 1), float(i))
    assert claim(keys, "bob", "x", ignore, 12.5)  # k0..k2 expired at 10, 11, 12
    assert 2 == len(keys)
    replies: Replies = []
    assert not claim(keys, "alice", "k3", replies.append, 12.5)
    assert [4] == [r.seq for r in replies]  # type: ignore[union-attr]


def test_when_full_the_oldest_keys_go_first() -> None:
    keys = PublishKeys(window_s=120, max_keys=3)
    for i in range(5):
        assert claim(keys, "alice", f"k{i}", ignore, 0.0)
        keys.settle("alice", f"k{i}", stored(i + 1), 0.0)
    assert 3 == len(keys)
    replies: Replies = []
    assert claim(keys, "alice", "k0", replies.append, 1.0)
    assert claim(keys, "alice", "k1", replies.append, 1.0)
    assert not claim(keys, "alice", "k2", replies.append, 1.0)
    assert not claim(keys, "alice", "k4", replies.append, 1.0)
    assert [3, 5] == [r.seq for r in replies]  # type: ignore[union-attr]


def test_with_no_room_keys_are_deduplicated_only_while_in_flight() -> None:
    keys = PublishKeys(window_s=120, max_keys=0)
    replies: Replies = []
    assert claim(keys, "alice", "k", replies.append, 0.0)
    assert not claim(keys, "alice", "k", replies.append, 0.0)
    keys.settle("alice", "k", stored(1), 0.0)
    assert (1, 0) == (len(replies), len(keys))
    assert claim(keys, "alice", "k", replies.append, 0.0)
