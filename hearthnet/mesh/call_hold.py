"""Calls across a held sequence (spec §8; :mod:`hearthnet.mesh.path_hold`). Pure.

A direct link that dies with no relay to fall back to holds the peer's sequence for a
re-dial, and the calls in flight with the peer go on with it: what they send meanwhile
waits in the sequence. The sequence resends what it numbered; but a link whose sequence
had settled carried plain frames, and those on the way when it died are lost with it. So,
when the sequence is held, each end of a call sends again, into it, what the other end
may not have received:

- the caller, its last ``ack`` of each call to the peer (an ack lost would leave the
  provider waiting on a full window while the caller waits for the next frame);
- the provider, the reply frames the caller has not acknowledged (:class:`ReplyTails`:
  at most a window's worth per call, and the last ones of the calls that ended lately,
  whose final frame the caller never acknowledges).

The caller takes each reply frame once by its number (``again`` is dropped), so what
comes twice, by the sequence and sent again, is handed on once, in order.
"""

from __future__ import annotations

from collections import OrderedDict, deque

MAX_ENDED = 64  # calls that ended whose last frames are kept (the oldest go first)


class ReplyTails:
    """A provider's reply frames not yet acknowledged, per call ``(peer, sid)``: a
    running call's (bounded by its flow window), and those of the :data:`MAX_ENDED`
    calls that ended last."""

    def __init__(self, max_ended: int = MAX_ENDED) -> None:
        self.max_ended = max_ended
        self._tails: dict[tuple[str, str], deque[tuple[int, bytes]]] = {}
        self._ended: OrderedDict[tuple[str, str], None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._tails)

    def sent(self, peer: str, sid: str, seq: int, data: bytes) -> None:
        """Reply frame ``seq`` of call ``sid`` (encoded ``data``) went to ``peer``."""
        tail = self._tails.get((peer, sid))
        if tail is None:
            tail = self._tails[(peer, sid)] = deque()
        tail.append((seq, data))

    def acked(self, peer: str, sid: str, upto: int) -> None:
        """The caller acknowledged the call's frames up to ``upto``."""
        tail = self._tails.get((peer, sid))
        while tail and tail[0][0] <= upto:
            tail.popleft()

    def ended(self, peer: str, sid: str) -> None:
        """The call ended here (its final frame sent): its tail is kept among the last
        :data:`max_ended`, then dropped."""
        key = (peer, sid)
        if not self._tails.get(key):
            self._tails.pop(key, None)
            return
        self._ended[key] = None
        while len(self._ended) > self.max_ended:
            old, _ = self._ended.popitem(last=False)
            self._tails.pop(old, None)

    def again(self, peer: str) -> list[bytes]:
        """What to send ``peer`` again, its calls one after the other, each in order."""
        return [data for (p, _), tail in self._tails.items() if p == peer for _, data in tail]

    def forget(self, peer: str) -> None:
        """The calls with ``peer`` ended with its link (no link took its place)."""
        for key in [k for k in self._tails if k[0] == peer]:
            del self._tails[key]
            self._ended.pop(key, None)
