"""What a dying direct link never wrote, for the link that takes its place (spec §8: a
direct link "falls back to the relay"). Pure.

Once a direct link's read side ends (a reset, the peer's close, three missed pongs), it
is closing for up to a second while its writer drains, and only then reported down; a
fall-back to the relay (or a held sequence, :mod:`hearthnet.mesh.path_hold`) follows.
Meanwhile it is still the peer's link: what the mesh sends the peer goes to it and is
refused, and what it had queued is never written. Most of that is repaired anyway (the
relayed link that takes its place is greeted with every membership record, the peer
addresses, our capabilities, our local presence and our gossip heads, so anti-entropy
brings the messages; the calls send again what they need, :mod:`call_hold`), but not
the presence events (a ``leave`` lost leaves a ghost member at the peer until it expires,
45 s; a ``join`` or ``update`` of another node's member waits for its next refresh, 15 s).
So the link keeps what it refused while closing, and what it had queued, bounded, and
the glue hands it to the link in its place (:meth:`UnsentFrames.take`).

Not kept: heartbeats and ``bye`` (of this link, not the next), and ``caps`` (the
greeting sends the current table; an older one after it would replace it).
"""

from __future__ import annotations

from collections.abc import Iterable

MAX_FRAMES = 512  # frames handed on at most (the relayed sequence holds 4,096 unacknowledged)
MAX_BYTES = 512 * 1024  # and their bytes (two seconds of a member's default relay budget)
# "t" then the kind, as encoded here (a CBOR text string of under 24 bytes), after the
# map's first byte
_SKIPPED = tuple(
    b"\x61t" + bytes([0x60 + len(kind)]) + kind for kind in (b"ping", b"pong", b"bye", b"caps")
)


def handed_on(frame: bytes) -> bool:
    """Whether an encoded peer frame is worth handing to the link that takes a dying
    one's place (not a heartbeat, ``bye`` or ``caps``)."""
    return not frame[1:].startswith(_SKIPPED)


class UnsentFrames:
    """Frames a closing link refused, kept in order up to :data:`MAX_FRAMES` and
    :data:`MAX_BYTES` (the rest are dropped and counted)."""

    def __init__(self) -> None:
        self._frames: list[bytes] = []
        self._bytes = 0
        self.dropped = 0  # frames past the bounds

    def keep(self, frame: bytes) -> None:
        """The closing link refused ``frame``."""
        if not handed_on(frame):
            return
        if len(self._frames) >= MAX_FRAMES or self._bytes + len(frame) > MAX_BYTES:
            self.dropped += 1
            return
        self._frames.append(frame)
        self._bytes += len(frame)

    def take(self, queued: Iterable[bytes]) -> list[bytes]:
        """What to hand on, once: the link's ``queued`` frames never written, then those
        it refused, in order, within the bounds (queued ones first)."""
        out: list[bytes] = []
        size = 0
        for frame in [*queued, *self._frames]:
            if not handed_on(frame):
                continue
            if len(out) >= MAX_FRAMES or size + len(frame) > MAX_BYTES:
                self.dropped += 1
                continue
            out.append(frame)
            size += len(frame)
        self._frames, self._bytes = [], 0
        return out
