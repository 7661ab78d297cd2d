"""A peer's sequence held after its direct link died with no relay to fall back to (spec
§8: the link moves "without losing or duplicating a frame"). Pure.

Within a switch, or while the relayed sequence is kept (:mod:`hearthnet.mesh.path_switch`),
a dying direct link falls back to the relay. An end with no relay attached at that moment
(every relay lost since the switch) cannot fall back; forgetting the sequence then would
drop the frames it sent and the peer did not acknowledge, and the receiving side's count
(so a resend from the peer would be handed on twice). Instead the sequence is **held**:

- the path core moves the peer ``DOWN`` (:meth:`PathCore.direct_down` with no relay),
  which keeps both sides of the sequence (frames unacknowledged, the count of frames
  delivered), and what is sent to the peer meanwhile waits in it;
- the next link with the peer within :data:`HOLD_S` takes it up: a re-dialled direct
  link continues the sequence like a switch (everything unacknowledged resent on it
  first, in order; :meth:`PathSwitch.direct_serves`), a relay attached later carries it
  as any relayed path (:meth:`PathCore.relay_attached` resends it all);
- after :data:`HOLD_S` with no link, or past :data:`MAX_HELD` peers held (the longest
  held goes first), the sequence is forgotten as before.

Calls in flight with the peer are tied to the held sequence rather than ended with the
link: what is still sent on the dead link (a provider's replies, a caller's acks) and
what the calls send to the peer meanwhile (:meth:`HeldSequences.link`) waits in the
sequence (:meth:`HeldSequences.send`), and goes to the link that takes it up. A call
is bounded by its own deadline and by the hold: when the held sequence is forgotten
(no link in time, or made room for another peer) its calls end at once with
:data:`CALLS_ENDED` (``ended``, the glue's). Frames of a call that died with the link
unnumbered (it went plain once its sequence settled) are the calls' own to send again
(:mod:`hearthnet.mesh.call_hold`). What the sequence carries besides (gossip,
membership, presence) arrives once, in order, if the peer comes back in time. The peer
is not asked whether it restarted meanwhile: a peer that did takes the resent frames
as a new sequence (:class:`~hearthnet.mesh.pathseq.Inbound`), as it takes a relayed
sequence resent after a restart.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from hearthnet.errors import WireError
from hearthnet.mesh.path_state import Action, PathState
from hearthnet.mesh.paths import PathCore
from hearthnet.mesh.pathseq import is_gossip

HOLD_S = 10.0  # as long as a switch takes to retire (path_switch.RETIRE_S)
MAX_HELD = 256  # peers whose sequence is held at once
# why the calls of a held sequence end when it is forgotten (their error's message)
CALLS_ENDED = "the link to {peer} went down mid-call and no link took its place within {s:g} s"


class DeadLink(Protocol):
    """What a held sequence needs of the direct link that died (a PeerLink)."""

    sequencer: Callable[[bytes], bool] | None

    def send_raw(self, data: bytes) -> bool:
        """Queue an encoded frame (on a live link)."""


class HeldSequences:
    """The peers whose sequence waits for the next link; ``forget`` ends one (the
    relaying glue's: sequence and relay session)."""

    def __init__(
        self,
        paths: PathCore,
        forget: Callable[[str], None],
        links: Mapping[str, Any] | None = None,
        carry: Callable[[list[Any]], None] | None = None,
    ) -> None:
        self.paths = paths
        self.forget = forget
        self.links: Mapping[str, Any] = {} if links is None else links  # the mesh's
        self.carry = carry or (lambda actions: None)  # the path core's actions
        # the calls tied to a forgotten held sequence end: (peer, why), the glue's
        self.ended: Callable[[str, str], None] = lambda peer, why: None
        self._until: dict[str, float] = {}  # peer -> when its held sequence is forgotten
        self._dead: dict[str, DeadLink] = {}  # peer -> its direct link that died
        self.held = 0  # sequences held when a direct link died with no relay
        self.resumed = 0  # of them, taken up by a re-dialled link or a relay attached later
        self.expired = 0  # of them, forgotten with no link in time

    def __contains__(self, peer: object) -> bool:
        return peer in self._until

    def hold(self, peer: str, now: float, dead: DeadLink | None = None) -> list[Action]:
        """``peer``'s direct link died with no relay to fall back to: keep its sequence
        for :data:`HOLD_S` (the path core's actions to carry out). What is still sent
        on the ``dead`` link goes in the sequence, then to the link that takes it up."""
        if peer not in self._until and len(self._until) >= MAX_HELD:
            oldest = min(self._until, key=self._until.__getitem__)
            self._end(oldest)
        self._until[peer] = now + HOLD_S
        self.held += 1
        if dead is not None:
            self._dead[peer] = dead
            dead.sequencer = lambda data: self.send(peer, dead, data)
        return self.paths.direct_down(peer, now)

    def link(self, peer: str) -> DeadLink | None:
        """While ``peer``'s sequence is held: its dead link, whose frames wait in the
        sequence (where calls send to the peer with no link up)."""
        return self._dead.get(peer) if peer in self._until else None

    def send(self, peer: str, dead: DeadLink, data: bytes) -> bool:
        """The dead link's ``sequencer``: a frame goes to the peer's current link once
        one took the sequence up, else waits in the sequence while it is held, or is
        carried by the path that took it up (a relay attached later). False (dropped
        with the link) once the sequence was forgotten, or when it is full."""
        current = self.links.get(peer)
        if current is not None and current is not dead:
            return bool(current.send_raw(data))
        if peer not in self._until and self.paths.path(peer)[0] is PathState.DOWN:
            return False
        try:
            self.carry(self.paths.send(peer, data, time.monotonic(), sheddable=is_gossip(data)))
        except WireError:  # too much unacknowledged: the frame is lost with the link
            return False
        return True

    def resume(self, peer: str) -> bool:
        """A link with ``peer`` takes its sequence up; False when none was held."""
        self._dead.pop(peer, None)  # its sequencer still hands frames to the new link
        if self._until.pop(peer, None) is None:
            return False
        self.resumed += 1
        return True

    def tick(self, now: float) -> None:
        """Held sequences whose time is up: forgotten if no path took them, else resumed
        (a relay attached meanwhile carries them)."""
        for peer, at in list(self._until.items()):
            if now < at:
                continue
            if self.paths.path(peer)[0] is PathState.DOWN:
                self._end(peer)
            else:
                self.resume(peer)

    def _end(self, peer: str) -> None:
        del self._until[peer]
        self.expired += 1
        self.forget(peer)
        self._dead.pop(peer, None)
        if peer not in self.links:  # a link is up again: the calls on it are its own
            self.ended(peer, CALLS_ENDED.format(peer=peer, s=HOLD_S))

    def forgotten(self, peer: str) -> None:
        """The peer's sequence ended otherwise (it left, or a relayed link of it ended)."""
        self._until.pop(peer, None)
        self._dead.pop(peer, None)
