"""What each end of a call sends again when the link under it changed (spec §8). Pure.

The calls with a peer outlive its direct link: a fall-back to the relay
(:mod:`hearthnet.mesh.path_switch`) or a held sequence taken up by the next link
(:mod:`hearthnet.mesh.path_hold`) carries them on. The peer's sequence resends what it
numbered; but a direct link whose switch had settled carries plain frames, call frames
among them (numbering each one cost two to three times its plain CPU), and those on the
way when it died are lost with it. So, at the fall-back or the hold, each end of a call
sends again, on the link that took the dead one's place, what the other end may not
have received:

- the caller (:class:`CallerResends`): the opening (``call``) of each call not yet
  answered (the provider may never have seen it), the tool results of each running call,
  and the ``cancel`` of the calls it ended lately (a provider that missed one would run
  the call on until its deadline); and its last ``ack`` of each call (an ack lost would
  leave the provider waiting on a full window while the caller waits for the next frame);
- the provider (:class:`ReplyTails`), the reply frames the caller has not acknowledged
  (at most a window's worth per call, and the last ones of the calls that ended lately,
  whose final frame the caller never acknowledges).

Each side drops what it had already: the caller takes each reply frame once by its
number, the provider a call opening once by its id (:class:`SeenCalls`; else a call it
ran would be refused as a replay, or run twice), a second tool result for one tool call
is refused as answered, and a ``cancel`` or ``ack`` is idempotent. So what comes twice
(by the sequence and sent again, or on the dead link and sent again) is taken once.

A node built before :class:`SeenCalls` answers an opening sent again for a call it runs
with ``capacity_exceeded`` (one of a call it ended as a replay), which the caller would
take as the call's answer. So openings go again only to a peer whose hello listed the
``call_resend`` feature (:attr:`~hearthnet.mesh.protocol.PeerInfo.takes_call_resends`);
to an older one, a call not answered at the path change ends at once with a clear
``unavailable`` (:meth:`CallerResends.plan`), unless the dead link never wrote its
opening: the link in its place carries that one (:mod:`hearthnet.mesh.unsent`).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Collection
from typing import Any

from hearthnet.metrics import MetricsRegistry

MAX_ENDED = 64  # calls that ended whose last frames are kept (the oldest go first)
MAX_CANCELS = 64  # cancels sent lately, sent again at a path change (the oldest go first)
MAX_RESULTS = 8  # tool results kept per running call (the last ones)
MAX_SEEN = 4096  # call openings a provider remembers (per node, the oldest go first)
# the kinds of call frames sent again (``hearthnet_call_frames_resent{kind}``)
RESENT_KINDS = ("call", "tool_result", "cancel", "ack", "frame")


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


class CallerResends:
    """A caller's frames a provider needs whole, per call ``sid`` to neighbour ``peer``:
    the opening until the first reply frame, the last :data:`MAX_RESULTS` tool results
    while the call runs, and the :data:`MAX_CANCELS` cancels sent last."""

    def __init__(self, max_cancels: int = MAX_CANCELS) -> None:
        self.max_cancels = max_cancels
        self._openings: dict[str, tuple[str, bytes]] = {}
        self._results: dict[str, tuple[str, deque[bytes]]] = {}
        self._cancels: OrderedDict[str, tuple[str, bytes]] = OrderedDict()

    def opened(self, peer: str, sid: str, data: bytes) -> None:
        """The call's opening (encoded ``data``) went to ``peer``."""
        self._openings[sid] = (peer, data)

    def answered(self, sid: str) -> None:
        """The call's first reply frame came: the provider has the call."""
        self._openings.pop(sid, None)

    def tool_result(self, peer: str, sid: str, data: bytes) -> None:
        """A tool result of the running call went to ``peer``."""
        kept = self._results.get(sid)
        if kept is None:
            kept = self._results[sid] = (peer, deque(maxlen=MAX_RESULTS))
        kept[1].append(data)

    def ended(self, sid: str) -> None:
        """The call ended here (whole, failed, or cancelled)."""
        self._openings.pop(sid, None)
        self._results.pop(sid, None)

    def cancelled(self, peer: str, sid: str, data: bytes) -> None:
        """The call's ``cancel`` went to ``peer`` (the call ended here)."""
        self.ended(sid)
        self._cancels[sid] = (peer, data)
        self._cancels.move_to_end(sid)
        while len(self._cancels) > self.max_cancels:
            self._cancels.popitem(last=False)

    def again(self, peer: str) -> list[bytes]:
        """What to send ``peer`` again: openings, then tool results, then cancels."""
        return [data for _, data in self.plan(peer, openings=True, handed=())[0]]

    def plan(
        self, peer: str, *, openings: bool, handed: Collection[bytes]
    ) -> tuple[list[tuple[str, bytes]], list[str]]:
        """What to send ``peer`` again, each with its kind (openings, then tool results,
        then cancels), and the calls to end now. An opening in ``handed`` (the dead link
        never wrote it: the link in its place carries it) is not sent again. The others
        go again when the peer drops an opening it took (``openings``); else each of
        those calls is listed to end (it may never have reached the peer, and an older
        peer refuses one sent again: spec §8)."""
        out: list[tuple[str, bytes]] = []
        ended: list[str] = []
        for sid, (p, data) in self._openings.items():
            if p != peer or data in handed:
                continue
            if openings:
                out.append(("call", data))
            else:
                ended.append(sid)
        out += [("tool_result", d) for p, kept in self._results.values() if p == peer for d in kept]
        out += [("cancel", data) for p, data in self._cancels.values() if p == peer]
        return out, ended

    def forget(self, peer: str) -> None:
        """The calls with ``peer`` ended with its link (no link took its place)."""
        for table in (self._openings, self._results, self._cancels):
            for sid in [s for s, (p, _) in table.items() if p == peer]:
                del table[sid]


class SeenCalls:
    """The call openings a provider took lately, by ``(peer, sid)``: one sent again after
    a path change is dropped (the provider ran it, or runs it, already)."""

    def __init__(self, max_seen: int = MAX_SEEN) -> None:
        self.max_seen = max_seen
        self._seen: OrderedDict[tuple[str, str], None] = OrderedDict()

    def first(self, peer: str, sid: str) -> bool:
        """True the first time call ``sid`` comes from ``peer`` (recorded), else False."""
        key = (peer, sid)
        if key in self._seen:
            return False
        self._seen[key] = None
        if len(self._seen) > self.max_seen:
            self._seen.popitem(last=False)
        return True


class ResendCounts:
    """What the calls sent again at path changes, since start (``/metrics``, ``/status``
    under ``relaying.paths.calls``): frames by kind, the openings a provider dropped as
    taken already, and the calls to an older peer ended unanswered at a path change."""

    def __init__(self) -> None:
        self.resent = dict.fromkeys(RESENT_KINDS, 0)
        self.openings_dropped = 0  # openings sent again that this provider had taken
        self.older_peer_ended = 0  # calls ended: opening maybe lost, peer without the feature

    def sent(self, kind: str) -> None:
        """One call frame of ``kind`` went again."""
        self.resent[kind] = self.resent.get(kind, 0) + 1

    def status(self) -> dict[str, Any]:
        """The counts, for ``/status``."""
        return {
            "resent": dict(self.resent),
            "openings_dropped": self.openings_dropped,
            "older_peer_ended": self.older_peer_ended,
        }

    def register(self, m: MetricsRegistry) -> None:
        """``hearthnet_call_frames_resent{kind}``, ``hearthnet_call_openings_dropped``,
        ``hearthnet_calls_ended_older_peer``."""
        m.read_counter(
            "hearthnet_call_frames_resent",
            "Call frames sent again after a fall-back or a hold, by kind (spec §8).",
            lambda: {(k,): float(n) for k, n in self.resent.items()},
            ("kind",),
        )
        m.read_counter(
            "hearthnet_call_openings_dropped",
            "Call openings sent again after a path change that this provider had taken.",
            lambda: float(self.openings_dropped),
        )
        m.read_counter(
            "hearthnet_calls_ended_older_peer",
            "Calls ended unanswered at a path change: the peer cannot take an opening again.",
            lambda: float(self.older_peer_ended),
        )
