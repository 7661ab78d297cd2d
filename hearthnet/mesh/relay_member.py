"""A member's end of relayed traffic (spec §8): one end-to-end session per peer, and path
frames wrapped into ``route`` frames and back. Pure (and, at the end, the member
role's metrics over it, :func:`register_member_metrics`).

Between :class:`~hearthnet.mesh.paths.PathCore` and the link to a relay::

    Transmit(peer, via=R, frame)  --wrap-->    route {to: peer, from: us, inner: sealed}  -> R
    route from R                  --unwrap-->  path frames for PathCore.receive(peer, ...)

The first frame for a peer starts the session (an ``e2e_hello`` goes first; frames wait,
bounded, until the answer). A hello from a node that is not a member of a served
community is refused (the relay is not trusted to check). A frame the session refuses
(altered, replayed, reordered, from a stranger) is returned as ``refused`` and counted; the
glue logs it and carries on. Frames lost that way are resent by the path sequence. A
sealed frame from a peer we hold no session with (we restarted, it did not) starts a new
handshake, so the peer's later frames open again; so do ``rehandshake_after`` sealed
frames in a row that do not verify on an established session (the two ends hold
different keys: one restarted, or a relay replayed an old hello to it).
"""

from __future__ import annotations

import os
from collections import Counter, OrderedDict, deque
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hearthnet.errors import BadRequest, InvalidSignature, Unauthorized, WireError
from hearthnet.identity import KeyPair
from hearthnet.mesh.frame_fields import MAX_ID
from hearthnet.mesh.path_frames import PATH_FRAME_TYPES, PathFrame, PFrame
from hearthnet.mesh.pathseq import UNSEQUENCED
from hearthnet.mesh.relay_e2e import RelaySession, SessionState
from hearthnet.mesh.relay_frames import DEFAULT_TTL_HOPS, Route, decode
from hearthnet.metrics import MetricsRegistry

if TYPE_CHECKING:
    from hearthnet.mesh.paths import PathCore


@dataclass(frozen=True, slots=True)
class EndpointConfig:
    """Bounds of a member's relayed sessions."""

    ttl_hops: int = DEFAULT_TTL_HOPS
    handshake_timeout_ms: int = 5_000  # a hello unanswered this long is sent again
    max_pending: int = 1024  # frames per peer waiting for its session (oldest dropped)
    max_sessions: int = 4096  # peers with a session (least recently used forgotten)
    # sealed frames in a row that do not verify before a fresh handshake (the keys differ:
    # one side restarted, or a relay replayed an old hello to it)
    rehandshake_after: int = 3


@dataclass(frozen=True, slots=True)
class Unwrapped:
    """What one ``route`` from a relay produced: routes to send back (a hello's answer,
    frames that waited for it), path frames for the path core, or why it was refused.
    ``renewed``: the peer opened a new session in place of one we held (see
    :attr:`~hearthnet.mesh.relay_e2e.Opened.renewed`)."""

    routes: list[Route] = field(default_factory=list)
    frames: list[PathFrame] = field(default_factory=list)
    refused: WireError | None = None
    renewed: bool = False


@dataclass(slots=True)
class _Peer:
    session: RelaySession
    hello_at: int = 0
    pending: deque[bytes] = field(default_factory=deque)
    failures: int = 0  # sealed frames in a row that did not verify


class RelayEndpoint:
    """This member's sessions with the peers it reaches through relays."""

    def __init__(
        self,
        keys: KeyPair,
        is_member: Callable[[str], bool],
        config: EndpointConfig | None = None,
    ) -> None:
        self.keys = keys
        self.is_member = is_member
        self.config = config or EndpointConfig()
        self.refused: Counter[str] = Counter()  # wire code -> frames refused
        self._forgotten_gaps = 0  # gaps counted by sessions no longer held
        self.dropped_pending = 0
        self._peers: OrderedDict[str, _Peer] = OrderedDict()
        # A random start: ids from before a restart may still sit in relays' seen-caches.
        self._next_id = int.from_bytes(os.urandom(6), "big")  # 48 bits; ids stay < 2^53

    def _peer(self, node: str) -> _Peer:
        p = self._peers.get(node)
        if p is None:
            p = self._peers[node] = _Peer(RelaySession(self.keys, node))
            if len(self._peers) > self.config.max_sessions:
                self._forgotten_gaps += self._peers.popitem(last=False)[1].session.gaps
        else:
            self._peers.move_to_end(node)
        return p

    def _route(self, to: str, inner: bytes, control: bool = True) -> Route:
        self._next_id = (self._next_id + 1) % (MAX_ID + 1)
        return Route(to, self.keys.node_id, self.config.ttl_hops, self._next_id, inner, control)

    def wrap(self, peer: str, frame: PathFrame, now_ms: int) -> list[Route]:
        """The route frames that carry ``frame`` to ``peer`` (a hello first, when the
        session is not up yet; the frame then waits for the answer)."""
        p = self._peer(peer)
        if p.session.established:
            # spec §8: all but the sequence's frames keep the path alive (control)
            data = isinstance(frame, PFrame) and frame.s != UNSEQUENCED
            return [self._route(peer, p.session.seal(frame.encode()), not data)]
        if len(p.pending) >= self.config.max_pending:
            p.pending.popleft()  # the path sequence resends it
            self.dropped_pending += 1
        p.pending.append(frame.encode())
        if p.session.state is SessionState.HELLO_SENT:
            return []
        p.hello_at = now_ms
        return [self._route(peer, p.session.start(now_ms))]

    def unwrap(self, route: Route, now_ms: int) -> Unwrapped:
        """Open one route frame that a relay delivered to us."""
        try:
            if route.to != self.keys.node_id:
                raise BadRequest("a route frame for another node")
            if route.from_ == route.to:  # a relay rewrote from: no session is with oneself
                raise BadRequest("a route frame from this node to itself")
            if not self.is_member(route.from_):
                raise Unauthorized("route from a node that is not a member")
            p = self._peer(route.from_)
            opened = p.session.receive(route.inner, now_ms)
            routes = [] if opened.reply is None else [self._route(route.from_, opened.reply)]
            if p.session.established and p.pending:
                routes += [self._route(route.from_, p.session.seal(f), False) for f in p.pending]
                p.pending.clear()
            frames: list[PathFrame] = []
            if opened.frame is not None:
                p.failures = 0
                inner = decode(opened.frame)
                if not isinstance(inner, PATH_FRAME_TYPES):
                    raise BadRequest(f"{inner.KIND} does not travel sealed")
                frames.append(inner)
            return Unwrapped(routes, frames, renewed=opened.renewed)
        except WireError as exc:
            self.refused[exc.code] += 1
            known = self._peers.get(route.from_)
            if (
                isinstance(exc, InvalidSignature)
                and known is not None
                and self._stale(known, now_ms)
            ):
                # sealed under keys we do not hold: make new ones
                known.failures = 0
                known.hello_at = now_ms
                hello = self._route(route.from_, known.session.start(now_ms))
                return Unwrapped([hello], refused=exc)
            return Unwrapped(refused=exc)

    def _stale(self, p: _Peer, now_ms: int) -> bool:
        """After a frame that did not verify: whether the session's keys are not the
        peer's. With none (we restarted), yes; with keys, after ``rehandshake_after``
        such frames in a row (the peer restarted, or a relay replayed an old hello to one
        of us, spec §8), at most once per ``handshake_timeout_ms``, so the pair never
        stays stuck on keys only one side holds."""
        p.failures += 1
        state = p.session.state
        if state is SessionState.IDLE:
            return True
        return (
            state is SessionState.ESTABLISHED
            and p.failures >= self.config.rehandshake_after
            and now_ms - p.hello_at >= self.config.handshake_timeout_ms
        )

    def tick(self, now_ms: int) -> list[Route]:
        """Hellos sent again where no answer came within ``handshake_timeout_ms``."""
        out: list[Route] = []
        for node, p in self._peers.items():
            waited = now_ms - p.hello_at
            if (
                p.session.state is SessionState.HELLO_SENT
                and waited >= self.config.handshake_timeout_ms
            ):
                p.hello_at = now_ms
                out.append(self._route(node, p.session.start(now_ms)))
        return out

    def forget(self, peer: str) -> None:
        """Drop the session with ``peer`` (it left the community, or we stop reaching it)."""
        p = self._peers.pop(peer, None)
        if p is not None:
            self._forgotten_gaps += p.session.gaps

    @property
    def gaps(self) -> int:
        """Times sealed frames from a peer arrived with frames missing before them:
        dropped on the way (a relay that dropped them, or refused them over a budget); the
        path sequence resends them. Summed when read (metrics), not per frame."""
        return self._forgotten_gaps + sum(p.session.gaps for p in self._peers.values())


def register_member_metrics(
    m: MetricsRegistry, endpoint: RelayEndpoint, counts: Tally[str], paths: PathCore
) -> None:
    """The member role's series: relayed frames and bytes, refusals end to end, gaps, pacing."""
    m.read_counter(
        "hearthnet_relayed_paced_bytes",
        "Bytes this member sent through relays that grant a budget, paced to it (spec §8).",
        lambda: float(paths.statistics().paced_bytes),
    )
    m.gauge(
        "hearthnet_relayed_queued",
        "Frames and bytes waiting for a relay's budget, in the relayed paths' sequences.",
        lambda: {
            ("frames",): float(paths.statistics().queued_frames),
            ("bytes",): float(paths.statistics().queued_bytes),
        },
        ("unit",),
    )
    m.read_counter(
        "hearthnet_relayed_shed_frames",
        "Gossip frames dropped for back-pressure on a relayed path (anti-entropy repairs them).",
        lambda: float(paths.statistics().shed),
    )
    m.read_counter(
        "hearthnet_relayed_frames",
        "Route frames this member sent and opened, by direction.",
        lambda: {("out",): float(counts["frames_out"]), ("in",): float(counts["frames_in"])},
        ("direction",),
    )
    m.read_counter(
        "hearthnet_relayed_bytes",
        "Bytes of route.inner this member sent and opened.",
        lambda: {("out",): float(counts["bytes_out"]), ("in",): float(counts["bytes_in"])},
        ("direction",),
    )
    m.read_counter(
        "hearthnet_relayed_refused_frames",
        "Relayed frames refused end to end (altered, replayed, forged), by code.",
        lambda: {(code,): float(n) for code, n in endpoint.refused.items()},
        ("code",),
    )
    m.read_counter(
        "hearthnet_relayed_gaps",
        "Times relayed frames from a peer arrived with some missing before them (a relay"
        " dropped or refused them on the way; the path sequence resends them).",
        lambda: float(endpoint.gaps),
    )
