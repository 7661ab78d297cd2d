"""Idempotent publish (an extension of spec §6.4, after NATS JetStream's ``Nats-Msg-Id``
and its duplicate window): the publish keys a node remembers, and the answers it gave.

A publish may carry ``idempotency_key`` (1..64 printable ASCII characters). The node
keeps, per publishing owner (:attr:`Caller.owner <hearthnet.caller.Caller.owner>`: the
NodeID of a member, ``token:<issuer>/<sub>`` of a token client, as durable consumers
are owned) and key, the answer of the publish that first carried it, for
``pubsub.idempotency_window_s`` after its commit and at most
``pubsub.idempotency_max_keys`` keys (when full, the oldest go first). A publish whose
key is known is not published again: it gets the first answer, marked ``duplicate``.
While the first is still on its way to the log, the others wait for its commit and get
its answer; when the first is refused (a full queue, a failed commit), they get its
refusal, and the key is forgotten so that a retry publishes anew. The key alone decides:
a publish with a known key and another topic or body gets the first answer (as
JetStream does), so a client must not reuse a key for another message.

:class:`PublishKeys` is the pure window (no I/O, no clock of its own: ``now`` is the
caller's monotonic time); the publish paths of both transports
(:meth:`PubSub.publish <hearthnet.pubsub.service.PubSub.publish>` for HTTP and the
node's own publishes, :class:`~hearthnet.pubsub.ws_publish.WsPublisher` for WebSocket
frames) claim a key before queueing the publish and settle it from the log's outcome.
The window lives in memory: a restart forgets it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import NamedTuple

from hearthnet.errors import BadRequest, InternalError
from hearthnet.pubsub.envelope import StoredMessage

MAX_KEY = 64
KEY_RULE = f"idempotency_key is a string of 1..{MAX_KEY} printable ASCII characters"


def validate_key(value: object) -> str:
    """``value`` as a publish key.

    Raises:
        BadRequest: not a string of 1..64 printable ASCII characters (space to ``~``).
    """
    if (
        type(value) is not str
        or not 1 <= len(value) <= MAX_KEY
        or not value.isascii()
        or not value.isprintable()
    ):
        raise BadRequest(KEY_RULE)
    return value


class Receipt(NamedTuple):
    """The answer to a publish, as remembered for its key: what ``published.ok`` and the
    HTTP answer carry, and whether this answer is a duplicate's."""

    id: str
    seq: int
    origin_seq: int
    ts: int
    duplicate: bool = False

    @classmethod
    def of(cls, stored: StoredMessage) -> Receipt:
        """The receipt of a committed publish."""
        fields = stored.fields
        if fields is not None:  # signed here: no Message made for the answer
            return cls(fields["id"], stored.seq, fields["origin_seq"], fields["ts"])
        msg = stored.message
        return cls(msg.id, stored.seq, msg.origin_seq, msg.ts)

    def answer(self) -> dict[str, object]:
        """The fields of the answer (``duplicate`` only when true: a keyless client sees
        the answer it always saw)."""
        out: dict[str, object] = {
            "id": self.id,
            "seq": self.seq,
            "origin_seq": self.origin_seq,
            "ts": self.ts,
        }
        if self.duplicate:
            out["duplicate"] = True
        return out


# Told the answer of the publish a duplicate stands for: its receipt (``duplicate``
# true), or the error that refused it.
Reply = Callable[[Receipt | Exception], None]
# The duplicates waiting for a first publish in flight (a :meth:`PublishKeys.claim`
# answer: the caller adds its reply).
Waiting = list[Reply]


class PublishKeys:
    """The publish keys of one node: those in flight (with the duplicates waiting for
    them) and those committed within the window (with their answers)."""

    __slots__ = ("_done", "_in_flight", "max_keys", "window_s")

    def __init__(self, *, window_s: float, max_keys: int) -> None:
        self.window_s = window_s
        self.max_keys = max_keys
        # (owner, key) → (expiry, id, seq, origin_seq, ts), oldest first: entries are
        # added at their commit with one window, so the order of insertion is the order
        # of expiry. One flat tuple each (a Receipt is made for a duplicate only).
        self._done: OrderedDict[tuple[str, str], tuple[float, str, int, int, int]] = OrderedDict()
        self._in_flight: dict[tuple[str, str], Waiting] = {}

    def __len__(self) -> int:
        """Keys remembered (committed, within the window), not counting those in flight."""
        return len(self._done)

    @property
    def in_flight(self) -> int:
        """Keys whose first publish is not decided yet."""
        return len(self._in_flight)

    def claim(self, owner: str, key: str, now: float) -> Receipt | Waiting | None:
        """Claim ``key`` for a publish of ``owner``. None: it is the first; the caller
        queues it and then calls :meth:`settle` with its outcome (always, whatever it
        is). A :class:`Receipt` (``duplicate`` true): the key was committed within the
        window; the publish is answered with it, not published. A :data:`Waiting` list:
        the first is in flight; the caller adds the reply that answers this duplicate
        once the first is settled, and does not publish it."""
        done = self._done
        while done:  # drop what expired, oldest first
            if next(iter(done.values()))[0] > now:
                break
            done.popitem(last=False)
        name = (owner, key)
        entry = done.get(name)
        if entry is not None:
            return Receipt(entry[1], entry[2], entry[3], entry[4], True)
        waiting = self._in_flight.get(name)
        if waiting is not None:
            return waiting
        self._in_flight[name] = []
        return None

    def settle(
        self, owner: str, key: str, outcome: StoredMessage | Exception | None, now: float
    ) -> None:
        """The first publish with ``key`` is decided: committed (its answer is kept for
        the window, and every duplicate that waited gets it) or refused (the key is
        forgotten; every duplicate that waited gets the refusal)."""
        name = (owner, key)
        waiting = self._in_flight.pop(name, None)
        if isinstance(outcome, StoredMessage):
            fields = outcome.fields
            if fields is not None:  # signed here: no Message made for the answer
                msg_id, origin_seq, ts = fields["id"], fields["origin_seq"], fields["ts"]
            else:
                msg = outcome.message
                msg_id, origin_seq, ts = msg.id, msg.origin_seq, msg.ts
            if self.max_keys > 0 and self.window_s > 0:
                done = self._done
                done[name] = (now + self.window_s, msg_id, outcome.seq, origin_seq, ts)
                if len(done) > self.max_keys:
                    done.popitem(last=False)
            if not waiting:
                return
            told: Receipt | Exception = Receipt(msg_id, outcome.seq, origin_seq, ts, True)
        elif not waiting:
            return
        else:
            told = refusal(outcome)
        for reply in waiting:
            reply(told)


def refusal(outcome: Exception | None) -> Exception:
    """The error a refused first publish is answered with (None: the log held the message
    already, which a new publish never is)."""
    if outcome is None:
        return InternalError("the message log could not store this message")
    return outcome
