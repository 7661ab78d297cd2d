"""Gossip bookkeeping (spec §7.3): what each origin's messages this node holds, and what to
ask a peer for. Pure.

Every origin numbers its messages 1, 2, 3, ... (``origin_seq``). A node's *head* for an
origin is the highest ``origin_seq`` up to which it holds everything from the lowest it
ever held (older messages removed by retention do not count as missing). Anti-entropy
exchanges heads every 5 s per link (``ihave``); a node behind asks (``iwant``) for the
range it lacks, in bounded slices, and does not ask two peers for the same range at once.

:class:`Gossip` is the core the mesh's glue feeds: frames and commits in, actions out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from hearthnet.errors import BadRequest, HearthNetError
from hearthnet.mesh.actions import Deliver, Duplicate, Forward, ForwardBatch, Refused, Repair
from hearthnet.mesh.batches import batch_frame, batch_runs, parse_leaves, prove_batch
from hearthnet.mesh.frames import BatchMsgs, IHave, IWant, Msg
from hearthnet.pubsub.envelope import Message, StoredMessage
from hearthnet.transport.codec import loads

MAX_ABOVE = 100_000  # out-of-order origin_seqs remembered above the heads, in all
IWANT_SLICE = 500  # messages asked for per origin per round
IWANT_RETRY_S = 5.0
MAX_REPAIR_ORIGINS = 256  # origins answered per iwant
MAX_ASKED_ORIGINS = 4_096  # origins remembered per peer on an older link (receive_ihave)
OLDER_RETRY_S = 10.0  # an older peer asked again at an unmoved head: after this, doubling
OLDER_RETRY_MAX_S = 300.0


@dataclass
class OriginTracker:
    """Held ``origin_seq`` values per origin: a contiguous head and a bounded set above it."""

    heads: dict[str, int] = field(default_factory=dict)
    above: dict[str, set[int]] = field(default_factory=dict)
    floors: dict[str, int] = field(default_factory=dict)  # the lowest seq ever held
    above_count: int = 0
    # origin -> the highest seq skipped on a peer's floor since the glue last took them
    # (it records them as removed by retention, so a restart starts past them too)
    skipped: dict[str, int] = field(default_factory=dict)
    # origin -> runs (first, last) above the head that retention removed here, ascending:
    # from the log at start, when a hole below them never came (logfloors.py); the head
    # moves over them once the hole is filled, and no one is asked for them
    done: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    def load(
        self,
        origin: str,
        head: int,
        floor: int,
        above: list[int] | None = None,
        done: list[tuple[int, int]] | None = None,
    ) -> None:
        """Initialise one origin from the log (at start)."""
        self.heads[origin] = head
        self.floors[origin] = floor
        if done:
            self.done[origin] = sorted(done)
            self.above.setdefault(origin, set())  # kept while there are runs: _advance
            self.heads[origin] = self._advance(origin, head)
        for seq in above or ():
            self.add(origin, seq)

    def add(self, origin: str, seq: int) -> None:
        """Record that ``(origin, seq)`` is held. A new origin starts at head 0, so a new or
        long-offline node backfills all the history its peers still hold."""
        head = self.heads.get(origin, 0)
        # the lowest held, not the first: a node linked just after an origin's first
        # publish gets its second message live and the first by anti-entropy, and a peer
        # told "nothing below 2" would skip 1 for good (receive_ihave's skip_to)
        floor = self.floors.get(origin)
        if floor is None or seq < floor:
            self.floors[origin] = seq
        if seq <= head:
            return
        if seq > head + 1:
            if self.done and _within(self.done.get(origin), seq):
                return  # counted done already
            bucket = self.above.setdefault(origin, set())
            if seq not in bucket and self.above_count < MAX_ABOVE:
                bucket.add(seq)
                self.above_count += 1
            return
        self.heads[origin] = self._advance(origin, seq)

    def _advance(self, origin: str, head: int) -> int:
        """Fold the seqs held just above ``head`` into it (and the removed runs: an
        origin with some keeps a bucket, empty or not, so that an origin without either
        costs one lookup)."""
        bucket = self.above.get(origin)
        if bucket is None:
            return head
        while bucket and head + 1 in bucket:
            head += 1
            bucket.discard(head)
            self.above_count -= 1
        if origin in self.done:
            head = self._fold_done(origin, head)
        if not bucket and origin not in self.done:
            del self.above[origin]
        return head

    def _fold_done(self, origin: str, head: int) -> int:
        """:meth:`_advance` over the removed runs (and what is held after each)."""
        runs = self.done[origin]
        bucket = self.above.get(origin)
        while runs and runs[0][0] <= head + 1:
            head = max(head, runs.pop(0)[1])
            if bucket:
                dropped = {s for s in bucket if s <= head}
                bucket -= dropped
                self.above_count -= len(dropped)
            while bucket and head + 1 in bucket:
                head += 1
                bucket.discard(head)
                self.above_count -= 1
        if not runs:
            del self.done[origin]
        return head

    def skip_to(self, origin: str, lowest_available: int) -> None:
        """A peer that is ahead holds nothing below ``lowest_available``: stop asking for the
        hole below it (retention removed those messages from the mesh)."""
        head = self.heads.get(origin, 0)
        if lowest_available > head + 1:
            bucket = self.above.get(origin)
            if bucket:
                dropped = {s for s in bucket if s < lowest_available}
                bucket -= dropped
                self.above_count -= len(dropped)
            self.heads[origin] = self._advance(origin, lowest_available - 1)
            self.skipped[origin] = max(lowest_available - 1, self.skipped.get(origin, 0))

    def missing(self, origin: str, peer_head: int) -> tuple[int, int] | None:
        """The next slice ``(from, to)`` to ask for, when a peer's head is ahead of ours."""
        head = self.heads.get(origin, 0)
        if peer_head <= head:
            return None
        start = head + 1
        end = min(peer_head, start + IWANT_SLICE - 1)
        above = self.above.get(origin)
        if above:
            held = [s for s in above if start <= s <= end]
            if held:
                end = min(held) - 1  # stop the slice before what we already hold
        runs = self.done.get(origin)
        if runs:
            end = min(end, runs[0][0] - 1)  # nor what retention removed here
        return (start, end) if end >= start else None


def _within(runs: list[tuple[int, int]] | None, seq: int) -> bool:
    """Whether ``seq`` is in one of ``runs``."""
    return runs is not None and any(a <= seq <= b for a, b in runs)


@dataclass
class AntiEntropy:
    """Decides what to ask which peer for, without asking twice at once."""

    tracker: OriginTracker
    requested: dict[str, tuple[int, float]] = field(default_factory=dict)  # origin -> (to, until)
    # origin -> the highest head a peer advertised while we were behind it: a message at or
    # below it existed elsewhere before it reached us, so it arrives as catch-up
    advertised: dict[str, int] = field(default_factory=dict)

    def plan(self, peer_heads: dict[str, int], now: float) -> dict[str, list[int]]:
        """From a peer's ``ihave`` heads, the ``iwant`` ranges to send: ``{origin: [from, to]}``."""
        wants: dict[str, list[int]] = {}
        for origin, peer_head in peer_heads.items():
            if not isinstance(origin, str) or not isinstance(peer_head, int):
                continue
            gap = self.tracker.missing(origin, peer_head)
            if gap is None:
                continue
            self.advertised[origin] = max(self.advertised.get(origin, 0), peer_head)
            pending = self.requested.get(origin)
            if pending is not None and pending[1] > now and pending[0] >= gap[1]:
                continue  # asked someone already; wait for that answer
            self.requested[origin] = (gap[1], now + IWANT_RETRY_S)
            wants[origin] = [gap[0], gap[1]]
        return wants

    def answered(self, origin: str) -> None:
        """A reply for ``origin`` arrived: a later round may ask again at once."""
        self.requested.pop(origin, None)


class Gossip:
    """Gossip and anti-entropy on one node (spec §7.3), as a pure core.

    The glue feeds it ``msg``/``ihave``/``iwant`` frames and the log's commits and carries
    out what it returns: :class:`~hearthnet.mesh.actions.Deliver` into the log,
    :class:`~hearthnet.mesh.actions.Forward` to the links, ``iwant`` frames back,
    :class:`~hearthnet.mesh.actions.Repair` reads from the log.

    Args:
        knows: whether the log committed a message id recently (cheap dedupe before the
            signature is verified).
        repair_per_round: messages sent per ``iwant`` answered.
        is_member: whether an identity is a current, unrevoked member (every message is
            accepted when None).
    """

    def __init__(
        self,
        knows: Callable[[str], bool],
        repair_per_round: int,
        is_member: Callable[[str], bool] | None = None,
    ) -> None:
        self.knows = knows
        self.is_member = is_member
        # spec §8: an origin of a federated community, on a topic its community grants
        # ours ((origin, topic) -> bool; the node sets it, None: no one else is accepted)
        self.foreign_origin: Callable[[str, str], bool] | None = None
        self.repair_per_round = repair_per_round
        self.tracker = OriginTracker()
        self.anti = AntiEntropy(self.tracker)
        self._hops: dict[str, int] = {}  # messages being ingested -> hops they travelled
        self._repairing: set[str] = set()  # peers with an iwant being answered
        # peers on links older than v3 -> origin -> (our head when we last asked them for
        # it, not again before, the wait after that)
        self._asked_older: dict[str, dict[str, tuple[int, float, float]]] = {}

    def receive_msg(self, frame: Msg, source: str) -> Deliver | Duplicate | Refused:
        """A gossiped message from ``source``: verify it unless it is known already.

        A :class:`Deliver` must be followed by :meth:`ingested` once the log has it.
        """
        try:
            obj = loads(frame.raw)
        except BadRequest as exc:
            return Refused(source, str(exc))
        msg_id = obj.get("id") if isinstance(obj, dict) else None
        if not isinstance(msg_id, str) or self.knows(msg_id) or msg_id in self._hops:
            return Duplicate()
        try:
            message = Message.parse(obj, raw=frame.raw)
        except HearthNetError as exc:
            return Refused(source, str(exc))
        if not self._may_originate(message):
            # spec §1.5, §7.3: only a current member originates gossip (mesh.** included).
            # Refused before _hops, so it is neither stored nor forwarded and leaves no
            # trace that would stop a later copy: a member whose member.added arrives after
            # its message gets it again from anti-entropy (ihave/iwant).
            return Refused(source, f"origin {message.origin} is not a member", "gossip_origin")
        self._hops[message.id] = frame.h
        return Deliver(message, source, frame.h, self.is_catch_up(message))

    def _may_originate(self, message: Message) -> bool:
        """Whether ``message``'s origin is a current member (or a federated origin on a
        topic its community grants ours)."""
        return (
            self.is_member is None
            or self.is_member(message.origin)
            or (
                self.foreign_origin is not None
                and self.foreign_origin(message.origin, message.topic)
            )
        )

    def receive_batch(self, frame: BatchMsgs, source: str) -> list[Deliver] | Duplicate | Refused:
        """A whole signed batch from ``source`` (spec §6.2): its leaves checked, its root's
        signature verified once, and each message new to this node delivered. Any fault
        refuses the batch whole: none of its messages is delivered.

        Each :class:`Deliver` must be followed by :meth:`ingested` once the log has it.
        """
        try:
            objs = parse_leaves(frame)
        except HearthNetError as exc:
            return Refused(source, f"batch: {exc}", "gossip_batch")
        ids = [obj.get("id") for obj in objs]
        if all(isinstance(i, str) and (self.knows(i) or i in self._hops) for i in ids):
            return Duplicate()  # held already: not verified again
        try:
            messages = prove_batch(frame, objs)
        except HearthNetError as exc:
            return Refused(source, f"batch: {exc}", "gossip_batch")
        if not all(self._may_originate(m) for m in messages):
            return Refused(source, f"origin {frame.origin} is not a member", "gossip_origin")
        delivers: list[Deliver] = []
        for message in messages:
            if self.knows(message.id) or message.id in self._hops:
                continue
            self._hops[message.id] = frame.h
            delivers.append(Deliver(message, source, frame.h, self.is_catch_up(message)))
        return delivers

    def is_catch_up(self, message: Message) -> bool:
        """Whether a peer had advertised holding ``message`` (in an ``ihave``) before it
        arrived here: backlog repaired by anti-entropy, or forwarded by a node that
        caught up itself, rather than a live copy of a new publish. The mesh-health
        job measures the two apart (docs/mesh-health.md, "Propagation")."""
        return message.origin_seq <= self.anti.advertised.get(message.origin, 0)

    def ingested(self, message_id: str) -> None:
        """The log took (or refused) a delivered message: forget its hop count."""
        self._hops.pop(message_id, None)

    def committed(self, batch: list[StoredMessage], linked: bool) -> list[Forward | ForwardBatch]:
        """Messages this node newly holds: track them, and (when ``linked``) forward them
        to every link but the one they came from, encoded once: each whole signed batch
        as one :class:`ForwardBatch`, every other message as a ``msg`` frame."""
        for stored in batch:
            self.tracker.add(stored.origin, stored.origin_seq)
        if not linked:
            return []
        forwards: list[Forward | ForwardBatch] = []
        for run, whole in batch_runs(batch):
            hops = tuple(self._hops.get(s.message.id, 0) + 1 for s in run)
            if whole:
                messages = tuple(s.message for s in run)
                frame = batch_frame(messages, max(hops))
                forwards.append(ForwardBatch(frame, messages, hops, run[0].source))
            else:
                message = run[0].message
                data = Msg(message.raw, hops[0]).encode()
                forwards.append(Forward(data, run[0].source, message.data_enc is not None))
        return forwards

    def ihave(self) -> IHave:
        """This node's heads and floors, for a peer's anti-entropy."""
        return IHave(dict(self.tracker.heads), dict(self.tracker.floors))

    def receive_ihave(self, frame: IHave, now: float, older: str | None = None) -> IWant | None:
        """A peer's heads: skip holes retention removed everywhere, and ask for what we
        lack (not what another peer is answering already).

        ``older`` names a peer on a link older than v3: it cannot hold the messages with
        ``data_enc`` its head may have been moved past (mesh/older_links.py). While our
        head for an origin stays where it was when we last asked that peer, it is asked
        again only after :data:`OLDER_RETRY_S`, doubling to :data:`OLDER_RETRY_MAX_S`
        (an iwant it ignored while busy is asked again; a hole it cannot fill costs
        little); once our head moved, at once.
        """
        for origin, floor in frame.floors.items():
            head = frame.heads.get(origin)
            if head is not None and head >= floor:
                self.tracker.skip_to(origin, floor)
        heads = dict(frame.heads)
        if older is not None:
            heads = self._older_heads(older, heads, now)
        wants = self.anti.plan(heads, now)
        if older is not None:
            self._asked(older, wants, now)
        return IWant({o: (span[0], span[1]) for o, span in wants.items()}) if wants else None

    def _older_heads(self, older: str, heads: dict[str, int], now: float) -> dict[str, int]:
        """``heads`` of the older peer without the origins not to ask it for yet."""
        asked = self._asked_older.get(older)
        if not asked:
            return heads
        ours = self.tracker.heads
        return {
            o: h
            for o, h in heads.items()
            if (prev := asked.get(o)) is None or prev[0] != ours.get(o, 0) or prev[1] <= now
        }

    def _asked(self, older: str, wants: dict[str, list[int]], now: float) -> None:
        """Remember what the older peer was asked for, at which of our heads."""
        asked = self._asked_older.setdefault(older, {})
        for origin in wants:
            head = self.tracker.heads.get(origin, 0)
            prev = asked.get(origin)
            wait = OLDER_RETRY_S
            if prev is not None and prev[0] == head:
                wait = min(prev[2] * 2, OLDER_RETRY_MAX_S)
            if prev is not None or len(asked) < MAX_ASKED_ORIGINS:
                asked[origin] = (head, now + wait, wait)

    def forget(self, node: str) -> None:
        """The link to ``node`` went down."""
        self._asked_older.pop(node, None)

    def receive_iwant(self, frame: IWant, source: str) -> Repair | None:
        """A peer asks for ranges: the repair to run, or None while one for that peer is
        still running (a peer asking faster than we answer gets the rest when it asks
        again: its anti-entropy retries after :data:`IWANT_RETRY_S`)."""
        if source in self._repairing:
            return None
        self._repairing.add(source)
        spans = tuple((o, a, b) for o, (a, b) in list(frame.want.items())[:MAX_REPAIR_ORIGINS])
        return Repair(source, spans, self.repair_per_round)

    def repaired(self, node: str) -> None:
        """The repair for ``node`` ended."""
        self._repairing.discard(node)

    def repairing(self, node: str) -> bool:
        """Whether a repair for ``node`` is running."""
        return node in self._repairing
