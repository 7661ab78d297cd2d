"""One sequence of frames per peer across changing paths (spec §8: the link moves to the
direct path, or back to the relay, "without losing or duplicating a frame"). Pure.

A node reaching a peer through a relay numbers every frame for that peer ``pframe {s, f}``
(1, 2, 3 ...), whichever path carries it, and keeps it until the peer acknowledges it
(``pack {upto}``, cumulative). The receiver hands frames on strictly in order, exactly
once: a frame below what it has delivered is a duplicate and is dropped; one above the next
expected waits (bounded) for the gap to fill.

Switching paths:

- the old path still works (an upgrade to direct): ``drain {upto: last s sent}`` goes on
  the old path, new frames on the new one. Paths are ordered, so the drain arrives after
  every frame the old path carried; the receiver answers it at once with ``pack {upto,
  drained: true}``. Such an ack below the drained ``upto`` means the old path lost
  frames, and the sender resends those on the new path.
- the old path is dead (a relay killed, the direct link gone): every unacknowledged
  frame is resent on the new path at once.
- anything else (a relay that dropped a frame silently, a lost drain): unacknowledged
  frames older than ``retransmit_s`` are resent on :meth:`Outbound.due`.

Resending can only duplicate on the wire, never at delivery.

Heartbeats (``ping``, ``pong``) travel outside the sequence, as ``pframe`` with ``s`` 0:
handed on at once, never acknowledged or resent. A relay over its budget refuses frames
(spec §8 ``rate_limited``), which leaves gaps that wait for a resend; a heartbeat held
behind such a gap would take a busy link down for missed pongs.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from hearthnet.errors import Unavailable
from hearthnet.mesh.path_frames import Drain, PAck, PFrame

MAX_UNACKED = 4096  # frames kept for resending per peer; more means the peer is stuck
MAX_AHEAD = 4096  # out-of-order frames held per peer; beyond that they are resent
MAX_AHEAD_BYTES = 4 * 1024 * 1024  # and their bytes (16 s of a member's relay budget)
RETRANSMIT_S = 2.0
ACK_EVERY = 32  # frames delivered between two acks (also acked on every drain and tick)
UNSEQUENCED = 0  # the ``s`` of a frame outside the sequence
_HEARTBEAT_HEADS = (b"\x61t\x64ping", b"\x61t\x64pong")  # after the map's first byte
# the remote-call frames (spec §7.4): a call, its reply stream and acks, tool results,
# cancellation; "t" then the kind as a CBOR text string of under 24 bytes
_CALL_HEADS = tuple(
    b"\x61t" + bytes([0x60 + len(kind)]) + kind
    for kind in (b"call", b"frame", b"ack", b"tool_result", b"cancel")
)
_MSG_HEAD = b"\x61t\x63msg"
_BATCH_HEAD = b"\x61t\x65batch"


def is_heartbeat(frame: bytes) -> bool:
    """True for an encoded ``ping`` or ``pong`` peer frame (``t`` first, as encoded here)."""
    return frame[1:8] in _HEARTBEAT_HEADS


def is_call(frame: bytes) -> bool:
    """True for an encoded remote-call frame (``call``, ``frame``, ``ack``,
    ``tool_result``, ``cancel``): what a call needs whole, where a lost one ends it."""
    return frame[1:].startswith(_CALL_HEADS)


def is_gossip(frame: bytes) -> bool:
    """True for an encoded ``msg`` or ``batch`` peer frame: gossip, which anti-entropy
    brings again if it is shed under back-pressure (spec §7.3)."""
    return frame[1:7] == _MSG_HEAD or frame[1:9] == _BATCH_HEAD


@dataclass
class Outbound:
    """The sending side of one peer's sequence; ``epoch`` is this process's start (ms).

    Frames go out either at once (:meth:`send`) or, on a paced path
    (:mod:`hearthnet.mesh.pacing`), when the caller takes them (:meth:`hold`, then
    :meth:`next_size` and :meth:`take` while the relay's budget allows): resends first,
    then held frames in order. A held frame is numbered only when it is taken, so a
    ``drain`` covers exactly what the old path carried.
    """

    epoch: int = 0
    max_unacked: int = MAX_UNACKED
    retransmit_s: float = RETRANSMIT_S
    last: int = 0
    acked: int = 0
    drained: int = 0  # the upto of the last drain sent, until an ack answers it
    held_bytes: int = 0  # bytes of frames held, not yet numbered
    _unacked: deque[tuple[int, bytes, float]] = field(default_factory=deque)
    _held: deque[bytes] = field(default_factory=deque)
    _resend: list[int] = field(default_factory=list)  # a heap of numbers to send again
    _resend_set: set[int] = field(default_factory=set)

    def send(self, frame: bytes, now: float) -> PFrame:
        """Number ``frame``, keep it until acknowledged, and hand it out to send now (an
        unpaced path with nothing held).

        Raises:
            Unavailable: ``max_unacked`` frames are waiting; the peer is not acknowledging
                (the caller treats the peer as unreachable).
        """
        self._check_room()
        return self._number(frame, now)

    def hold(self, frame: bytes) -> None:
        """Keep ``frame`` until :meth:`take` hands it out (after any held before it).

        Raises:
            Unavailable: ``max_unacked`` frames are sent or held; see :meth:`send`.
        """
        self._check_room()
        self._held.append(frame)
        self.held_bytes += len(frame)

    def _check_room(self) -> None:
        if len(self._unacked) + len(self._held) >= self.max_unacked:
            raise Unavailable("the peer acknowledges nothing; too many frames unacknowledged")

    def _number(self, frame: bytes, now: float) -> PFrame:
        self.last += 1
        self._unacked.append((self.last, frame, now))
        return PFrame(self.last, frame, self.epoch, self.acked)

    def next_size(self) -> int | None:
        """The bytes of the frame :meth:`take` would hand out next; None when none waits."""
        first = self._unacked[0][0] if self._unacked else self.last + 1
        while self._resend and self._resend[0] < first:  # acknowledged meanwhile
            self._resend_set.discard(heapq.heappop(self._resend))
        if self._resend:
            return len(self._unacked[self._resend[0] - first][1])
        return len(self._held[0]) if self._held else None

    def take(self, now: float) -> tuple[PFrame, bool]:
        """The next frame to send (a resend first, then the oldest held frame, numbered
        now) and whether it is a resend; call only after :meth:`next_size` said one waits."""
        if self.next_size() is not None and self._resend:
            s = heapq.heappop(self._resend)
            self._resend_set.discard(s)
            i = s - self._unacked[0][0]
            _, frame, _ = self._unacked[i]
            self._unacked[i] = (s, frame, now)
            return PFrame(s, frame, self.epoch, self.acked), True
        frame = self._held.popleft()
        self.held_bytes -= len(frame)
        return self._number(frame, now), False

    def unsequenced(self, frame: bytes) -> PFrame:
        """``frame`` outside the sequence: not numbered, not kept for resending."""
        return PFrame(UNSEQUENCED, frame, self.epoch, self.acked)

    @property
    def unacked(self) -> int:
        """Frames sent and not yet acknowledged."""
        return len(self._unacked)

    @property
    def waiting(self) -> int:
        """Frames held or due for resending, not yet handed out."""
        return len(self._held) + len(self._resend)

    def drain(self) -> Drain:
        """The marker for the old path when switching to a new one that still works."""
        self.drained = self.last
        return Drain(self.last, self.epoch)

    def ack(self, frame: PAck, now: float, *, later: bool = False) -> list[PFrame]:
        """Apply a ``pack``; return the frames to resend (those a drained path lost), or
        with ``later`` queue them for :meth:`take`."""
        upto = frame.upto
        if upto > self.last or frame.e != self.epoch:
            return []  # acknowledges what we never sent (or a sequence before our restart)
        while self._unacked and self._unacked[0][0] <= upto:
            self._unacked.popleft()
        self.acked = max(self.acked, upto)
        if not frame.drained or not self.drained:
            return []
        lost_upto, self.drained = self.drained, 0
        return self._resend_where(lambda s: s <= lost_upto, now, later=later)

    def resend_all(self, now: float, *, later: bool = False) -> list[PFrame]:
        """Every unacknowledged frame, for a new path when the old one died (``later``:
        queued for :meth:`take`)."""
        self.drained = 0
        return self._resend_where(lambda s: True, now, later=later)

    def due(self, now: float, *, later: bool = False) -> list[PFrame]:
        """Unacknowledged frames not acknowledged within ``retransmit_s``, to resend (or
        with ``later``, queued for :meth:`take`)."""
        horizon = now - self.retransmit_s
        return self._resend_where(lambda s: True, now, horizon, later=later)

    def _resend_where(
        self,
        which: Callable[[int], bool],
        now: float,
        horizon: float = float("inf"),
        *,
        later: bool = False,
    ) -> list[PFrame]:
        out: list[PFrame] = []
        kept: deque[tuple[int, bytes, float]] = deque()
        for s, f, sent in self._unacked:
            if sent <= horizon and which(s) and s not in self._resend_set:
                if later:
                    heapq.heappush(self._resend, s)
                    self._resend_set.add(s)
                    kept.append((s, f, sent))
                    continue
                out.append(PFrame(s, f, self.epoch, self.acked))
                kept.append((s, f, now))
            else:
                kept.append((s, f, sent))
        self._unacked = kept
        return out


@dataclass
class Inbound:
    """The receiving side of one peer's sequence."""

    max_ahead: int = MAX_AHEAD
    max_ahead_bytes: int = MAX_AHEAD_BYTES
    ack_every: int = ACK_EVERY
    epoch: int | None = None  # the sender's sequence we follow; None until its first frame
    delivered: int = 0
    duplicates: int = 0
    stale: int = 0  # frames of a sequence from before the sender restarted
    _ahead: dict[int, bytes] = field(default_factory=dict)
    _ahead_bytes: int = 0
    _unacked: int = 0  # delivered since the last ack

    def receive(self, frame: PFrame) -> tuple[list[bytes], PAck | None]:
        """Take one ``pframe``; return the frames now deliverable, in order, and the ack
        to send, if one is due."""
        if frame.s == UNSEQUENCED:
            return [frame.f], None
        if self.epoch is None or frame.e > self.epoch:
            # a first frame, or the sender restarted: follow its (new) sequence, which
            # resumes after what we acknowledged (none of it, for a new sequence)
            self.epoch, self.delivered, self._unacked = frame.e, 0, 0
            self._ahead.clear()
            self._ahead_bytes = 0
        elif frame.e < self.epoch:
            self.stale += 1
            return [], None
        if frame.a > self.delivered:
            # we acknowledged up to a before we restarted: those were handed on then
            self.delivered = frame.a
            self._ahead = {k: v for k, v in self._ahead.items() if k > frame.a}
            self._ahead_bytes = sum(len(v) for v in self._ahead.values())
        s = frame.s
        if s <= self.delivered or s in self._ahead:
            self.duplicates += 1
            return [], None
        if s > self.delivered + 1:
            size = len(frame.f)
            if (
                s <= self.delivered + self.max_ahead
                and self._ahead_bytes + size <= self.max_ahead_bytes
            ):
                self._ahead[s] = frame.f
                self._ahead_bytes += size
            return [], None  # beyond the window: the sender's resend brings it again
        out = [frame.f]
        s += 1
        while s in self._ahead:
            held = self._ahead.pop(s)
            self._ahead_bytes -= len(held)
            out.append(held)
            s += 1
        self.delivered = s - 1
        self._unacked += len(out)
        if self._unacked >= self.ack_every:
            return out, self.ack()
        return out, None

    def drain(self, frame: Drain) -> PAck:
        """The old path ended at ``frame.upto``: acknowledge at once, so the sender learns
        what that path lost."""
        self._unacked = 0
        if frame.e != self.epoch:  # a drain of a sequence we do not follow: a plain ack
            return PAck(self.delivered, e=self.epoch or 0)
        return PAck(self.delivered, drained=True, e=frame.e)

    @property
    def ahead(self) -> int:
        """Frames held out of order, waiting for a gap to fill."""
        return len(self._ahead)

    @property
    def owed(self) -> bool:
        """True when frames were delivered since the last ack."""
        return self._unacked > 0

    def ack(self) -> PAck:
        """The acknowledgement of everything delivered (send on tick, or when due)."""
        self._unacked = 0
        return PAck(self.delivered, e=self.epoch or 0)
