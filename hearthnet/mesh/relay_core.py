"""The relay's pure core (spec §8): attached members, budgets, forwarding, federation.

Feed it what happens on the relay's peer links (:meth:`RelayCore.link_up`,
:meth:`~RelayCore.receive`, :meth:`~RelayCore.route` for a route frame's header,
:meth:`~RelayCore.route_many` for a route batch's, :meth:`~RelayCore.link_down`) and the clock
(:meth:`~RelayCore.tick`, every second or so); carry out the actions it returns:

- :class:`Send` ``(link, frame)``: write ``frame.encode()`` on the link;
- :class:`Forward` ``(link)`` (from :meth:`~RelayCore.route` only): write the route frame
  just received on the link, ``ttl_hops`` one less (the received bytes, patched: spec
  §11); :meth:`~RelayCore.receive` of a :class:`Route` returns that frame as a ``Send``;
- :class:`Refuse` ``(link, code, retry_after_ms)``: the member's attachment is refused or
  ended; write ``detach {code, retry_after_ms}`` on the link (the peer link itself stays);
- :class:`Close` ``(link)``: the peer broke the relay protocol; close the link.

Rules:

- Only nodes ``is_served`` accepts (members of this community and of federated ones) may
  attach, send and be sent to; attached members are checked again on every table refresh.
  With ``is_own``, a route frame needs one end that is a member of this community: a
  federated community's node reaches our members only (else ``unreachable``, counted).
- A member's ``route`` frames must carry its own NodeID in ``from`` and at most the
  ``max_inner`` bytes it was granted (else :class:`Close`); a peer that has not attached
  is refused (attach first).
- Budgets (per attached member, only where its frames enter the relay network): bytes of
  ``inner`` per second (default 256 KiB/s; route frames marked ``control`` are charged to
  a separate allowance, default 16 KiB/s, and take no circuit) and concurrent circuits,
  a circuit being a destination the member sent to within ``circuit_idle_s`` (default 64;
  the relay cannot see the bus streams inside the sealed frames, so circuits are what it
  counts). When the members sending within the last ``active_window_s`` would together
  exceed the relay's ``capacity_bytes_per_s``, each gets an equal share of it. A member over budget
  gets ``route_error rate_limited`` with ``retry_after_ms``; nobody else waits. Each member
  is told its share (``budget {bytes_per_s, burst}``) when it attaches and when the share
  changes (on :meth:`~RelayCore.tick`), and paces itself to it (:mod:`hearthnet.mesh.pacing`).
- Forwarding: to the attached member ``to``, else to the federated relay with the fewest
  hops to it, else ``route_error unreachable``. Each relay passed takes one from
  ``ttl_hops``; a frame arriving with none left is ``route_error ttl``. A ``(from, id)``
  already forwarded is dropped (seen-cache: at least the last ``seen_cache / 2`` keys
  forwarded, at most ``seen_cache``; :mod:`hearthnet.mesh.relay_seen`).
- Route batches (:meth:`~RelayCore.route_runs`): each run of frames with the same
  ``to``, ``from``, ``control`` and ``ttl_hops`` is decided once (membership, the next
  link, the seen-cache in one set operation, the budget charged the run's bytes) when
  every frame of it would be forwarded alone; otherwise frame by frame. Either way each
  frame gets the decision it would get alone.
- Federation: each federated relay gets our ``route_table`` (what goes in it, when it is
  sent, when a relay's is forgotten: :mod:`hearthnet.mesh.relay_tables`). Which links are
  federated is the caller's decision (:meth:`RelayCore.link_up` with ``federated``; relays
  both sides configured), never a frame's: a ``route_table`` on any other link is
  dropped and counted. Frames from federated relays were budgeted where they entered;
  each must come from a node that relay's table puts behind it (else it is dropped and
  counted as spoofed), and is checked for membership, ttl and the seen-cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from hearthnet.mesh.frame_fields import MAX_INNER_BYTES
from hearthnet.mesh.pacing import Budget
from hearthnet.mesh.relay_actions import Action, Close, Forward, LinkId, Refuse, RelayStats, Send
from hearthnet.mesh.relay_budget import FairBucket
from hearthnet.mesh.relay_frames import (
    DEFAULT_TTL_HOPS,
    Attach,
    Attached,
    Detach,
    RelayFrame,
    Route,
    RouteError,
    RouteTable,
)
from hearthnet.mesh.relay_seen import SeenCache
from hearthnet.mesh.relay_tables import Federated, RouteTables
from hearthnet.mesh.route_batch import RouteRun
from hearthnet.mesh.route_header import RouteHeader, header_of

_FOREIGN = object()  # route_many: a destination no frame of this member may reach


@dataclass(frozen=True, slots=True)
class RelayConfig:
    """The relay's bounds (spec §8 defaults)."""

    member_bytes_per_s: int = 256 * 1024
    member_streams: int = 64
    # per member, for route frames marked control, apart from member_bytes_per_s: a ping,
    # pong or ack is ~100 bytes, so this keeps ~160 relayed peers' links alive
    control_bytes_per_s: int = 16 * 1024
    capacity_bytes_per_s: int = 8 * 1024 * 1024  # a small VPS's uplink
    burst_s: float = 0.5  # a bucket holds this many seconds of its rate
    max_members: int = 1024
    seen_cache: int = 65_536
    circuit_idle_s: float = 60.0
    active_window_s: float = 1.0
    rebalance_s: float = 0.25
    table_refresh_s: float = 10.0
    table_min_interval_s: float = 1.0
    table_expiry_s: float = 30.0
    # Relays a route may still pass after this one: a member's frame (ttl_hops 4) spends one
    # here, so 3 more can carry it; longer routes are neither kept nor advertised.
    max_route_hops: int = DEFAULT_TTL_HOPS - 1
    max_inner: int = MAX_INNER_BYTES
    full_retry_after_ms: int = 30_000


@dataclass(slots=True)
class _Member:
    node: str
    link: LinkId
    bucket: FairBucket
    control: FairBucket  # route frames marked control (heartbeats, acks, hellos)
    circuits: dict[str, float] = field(default_factory=dict)  # destination -> last used
    last_sent: float = float("-inf")
    told: float = 0.0  # the rate its last ``budget`` frame named


@dataclass(slots=True)
class _Counters:
    forwarded: int = 0
    forwarded_bytes: int = 0
    duplicates: int = 0
    rate_limited: int = 0
    unreachable: int = 0
    ttl_expired: int = 0
    spoofed: int = 0
    foreign_tables: int = 0
    foreign_routes: int = 0


class RelayCore:
    """One relay's forwarding state. Pure: no I/O, no clock but ``now`` (seconds)."""

    def __init__(
        self,
        node_id: str,
        is_served: Callable[[str], bool],
        config: RelayConfig | None = None,
        *,
        is_own: Callable[[str], bool] | None = None,
    ) -> None:
        self.node_id = node_id
        self.is_served = is_served
        # spec §8 community federation: a node served but not ``is_own`` (a member of a
        # federated community) reaches members of ours only, and only they reach it
        self.is_own = is_own
        self.config = config or RelayConfig()
        self._links: dict[LinkId, tuple[str, str]] = {}  # link -> (peer, observed address)
        # spec §11: one Forward per link up, returned for every frame passed on to it
        self._forwards: dict[LinkId, Forward] = {}
        self._members: dict[str, _Member] = {}
        self._member_links: dict[LinkId, str] = {}
        self._tables = RouteTables(node_id, self.config, is_served, self._members)
        self._federated = self._tables.links
        self._seen = SeenCache(self.config.seen_cache)
        self._rebalanced = float("-inf")
        self._fair_rate = float(
            min(self.config.member_bytes_per_s, self.config.capacity_bytes_per_s)
        )
        self._count = _Counters()

    # -- links ---------------------------------------------------------------------------

    def link_up(
        self, link: LinkId, peer: str, observed_addr: str, now: float, *, federated: bool = False
    ) -> list[Action]:
        """A peer link is up (its hello verified ``peer``). ``federated``: the peer is a
        relay this one federates with; it gets our route table at once."""
        self._links[link] = (peer, observed_addr)
        if not federated or link in self._federated:
            return []
        node = self._member_links.pop(link, None)
        if node is not None:  # a relay is not served as a member on its federated link
            del self._members[node]
        self._federated[link] = Federated(peer, refreshed=now)
        if node is not None:
            return self._tables.changed(now, members_changed=True)
        return [Send(link, self._tables.table_for(link))]

    def link_down(self, link: LinkId, now: float) -> list[Action]:
        """A peer link is gone: its member detaches, its routes are forgotten."""
        self._links.pop(link, None)
        self._forwards.pop(link, None)
        node = self._member_links.pop(link, None)
        if node is not None:
            self._members.pop(node, None)
        if self._federated.pop(link, None) is None and node is None:
            return []
        return self._tables.changed(now, members_changed=node is not None)

    # -- frames --------------------------------------------------------------------------

    def receive(self, link: LinkId, frame: RelayFrame, now: float) -> list[Action]:
        """One relay frame that arrived on ``link``."""
        if link not in self._links:
            raise ValueError("receive on a link that is not up")
        if isinstance(frame, Route):  # the CBOR map form: the hop is a new frame to send
            return [
                Send(a.link, replace(frame, ttl_hops=frame.ttl_hops - 1))
                if isinstance(a, Forward)
                else a
                for a in self.route(link, header_of(frame), now)
            ]
        if isinstance(frame, Attach):
            return self._attach(link, frame, now)
        if isinstance(frame, Detach):
            node = self._member_links.pop(link, None)
            if node is None:
                return []
            del self._members[node]
            return self._tables.changed(now, members_changed=True)
        if isinstance(frame, RouteTable):
            acts = self._tables.receive(link, frame, now)
            if acts is None:  # spec §8: a frame never makes a link federated
                self._count.foreign_tables += 1
                return []
            return acts
        if isinstance(frame, RouteError):
            member = self._members.get(frame.origin)
            if link in self._federated and member is not None:
                return [Send(member.link, frame)]
            return []
        return [Close(link, f"{frame.KIND} is not a frame for a relay")]

    def _attach(self, link: LinkId, frame: Attach, now: float) -> list[Action]:
        peer, observed = self._links[link]
        cfg = self.config
        if link in self._federated or not self.is_served(peer):
            return [Refuse(link, "unauthorized")]
        old = self._members.get(peer)
        if old is None and len(self._members) >= cfg.max_members:
            return [Refuse(link, "capacity_exceeded", cfg.full_retry_after_ms)]
        if old is not None:  # re-attached over a new link: the new one wins
            self._member_links.pop(old.link, None)
            old.link = link
        else:
            bucket = FairBucket(self._fair_rate, cfg.burst_s, now)
            control = FairBucket(cfg.control_bytes_per_s, cfg.burst_s, now)
            self._members[peer] = _Member(peer, link, bucket, control)
        self._member_links[link] = peer
        granted = Attached(
            self.node_id,
            observed,
            cfg.member_bytes_per_s,
            cfg.member_streams,
            cfg.max_inner,
            frame.ts,
        )
        member = self._members[peer]
        return [
            Send(link, granted),
            self._tell(member),
            *self._tables.changed(now, members_changed=old is None),
        ]

    def _tell(self, member: _Member) -> Send:
        """The member's budget now, for it to pace to (spec §8: refusals stay rare)."""
        member.told = member.bucket.rate
        burst = max(1, int(member.bucket.rate * member.bucket.burst_s))
        return Send(member.link, Budget(max(1, int(member.bucket.rate)), burst))

    def route(self, link: LinkId, route: RouteHeader, now: float) -> list[Action]:
        """A route frame that arrived on ``link``, by its header (the relay never reads
        ``inner``, spec §8); a :class:`Forward` passes it on."""
        if link not in self._links:
            raise ValueError("route on a link that is not up")
        member_node = self._member_links.get(link)
        if member_node is not None:
            if route.from_ != member_node:
                self._count.spoofed += 1
                return [Close(link, "route.from is not the attached member")]
            if route.size > self.config.max_inner:  # attached told it the limit
                return [Close(link, "route.inner over the max_inner granted")]
        elif link in self._federated:
            # spec §8: a federated relay carries frames of the nodes behind it, no others;
            # a frame from anyone else is a forgery (or a relay lying about its members)
            if route.from_ not in self._federated[link].routes or not self.is_served(route.from_):
                self._count.spoofed += 1
                return []
        else:
            return [Refuse(link, "unauthorized")]  # attach first
        if self.is_own is not None and not (self.is_own(route.from_) or self.is_own(route.to)):
            self._count.foreign_routes += 1  # no transit between two other communities
            return [Send(link, RouteError(route.to, route.from_, route.id, "unreachable"))]
        if self._seen.seen(route.from_, route.id):
            self._count.duplicates += 1
            return []
        if route.ttl_hops == 0:
            self._count.ttl_expired += 1
            return [Send(link, RouteError(route.to, route.from_, route.id, "ttl"))]
        target = self._next_link(route.to, link)
        if target is None:
            self._count.unreachable += 1
            return [Send(link, RouteError(route.to, route.from_, route.id, "unreachable"))]
        if member_node is not None:
            wait = self._charge(self._members[member_node], route, now)
            if wait > 0:
                self._count.rate_limited += 1
                retry = max(1, int(wait * 1000 + 0.999))
                return [
                    Send(link, RouteError(route.to, route.from_, route.id, "rate_limited", retry))
                ]
        self._seen.add(route.from_, route.id)
        count = self._count
        count.forwarded += 1
        count.forwarded_bytes += route.size
        forward = self._forwards.get(target)
        if forward is None:
            forward = self._forwards[target] = Forward(target)
        return [forward]

    def route_many(
        self, link: LinkId, heads: Sequence[RouteHeader], now: float
    ) -> tuple[list[LinkId | None], list[Action]]:
        """Route frames that arrived together on ``link`` (a route batch, spec §11), each
        decided as :meth:`route` decides it alone: per frame the link it goes on to (None:
        not forwarded), and the other actions in order. What depends on the destination
        alone (membership, the next link) is worked out once per destination; a frame
        that closes the link ends the batch."""
        member_node = self._member_links.get(link)
        if member_node is None:  # a federated relay's frames, or an unattached peer's
            return self._route_each(link, heads, now)
        member, cfg, count, seen = self._members[member_node], self.config, self._count, self._seen
        is_own = self.is_own
        targets: list[LinkId | None] = []
        others: list[Action] = []
        nexts: dict[str, LinkId | None] = {}  # destination -> next link (None: unreachable)
        for head in heads:
            if head.from_ != member_node or head.size > cfg.max_inner:
                others += self.route(link, head, now)  # the Close, counted as alone
                break
            to = head.to
            if to in nexts:
                target = nexts[to]
            elif is_own is not None and not (is_own(member_node) or is_own(to)):
                target = nexts[to] = _FOREIGN
            else:
                target = nexts[to] = self._next_link(to, link)
            error = None
            if target is _FOREIGN:
                count.foreign_routes += 1
                error = "unreachable"
            elif seen.seen(member_node, head.id):
                count.duplicates += 1
            elif head.ttl_hops == 0:
                count.ttl_expired += 1
                error = "ttl"
            elif target is None:
                count.unreachable += 1
                error = "unreachable"
            elif (wait := self._charge(member, head, now)) > 0:
                count.rate_limited += 1
                retry = max(1, int(wait * 1000 + 0.999))
                others.append(
                    Send(link, RouteError(to, member_node, head.id, "rate_limited", retry))
                )
            else:
                seen.add(member_node, head.id)
                count.forwarded += 1
                count.forwarded_bytes += head.size
                targets.append(target)
                continue
            if error is not None:
                others.append(Send(link, RouteError(to, member_node, head.id, error)))
            targets.append(None)
        return targets + [None] * (len(heads) - len(targets)), others

    def route_runs(
        self, link: LinkId, runs: Sequence[RouteRun], now: float
    ) -> tuple[list[tuple[LinkId | None, list[LinkId | None] | None]], list[Action]]:
        """The runs of a route batch that arrived on ``link`` (spec §11), each frame
        decided as :meth:`route` decides it alone: per run ``(link, None)`` when all its
        frames go on to ``link``, ``(None, None)`` when none is forwarded, else ``(None,
        per-frame links)``; and the other actions in order. A run whose frames would all
        go on is decided once; any other frame by frame (:meth:`route_many`); a frame
        that closes the link ends the batch."""
        out: list[tuple[LinkId | None, list[LinkId | None] | None]] = []
        others: list[Action] = []
        member_node = self._member_links.get(link)
        member = self._members[member_node] if member_node is not None else None
        cfg, count, seen, is_own = self.config, self._count, self._seen, self.is_own
        nexts: dict[str, LinkId | None] = {}
        for i, run in enumerate(runs):
            to = run.to
            if to in nexts:
                target = nexts[to]
            else:
                target = nexts[to] = self._next_link(to, link)
            if (
                member is not None
                and target is not None
                and run.from_ == member_node
                and run.size <= cfg.max_inner
                and run.ttl_hops > 0
                and (is_own is None or is_own(member_node) or is_own(to))
                and seen.fresh(member_node, run.ids)
                and self._charge_run(member, run, now)
            ):
                seen.add_all(member_node, run.ids)
                count.forwarded += len(run.ids)
                count.forwarded_bytes += run.size
                out.append((target, None))
                continue
            targets, acts = self.route_many(link, [span[0] for span in run.spans()], now)
            others += acts
            if all(t is None for t in targets):
                out.append((None, None))
            else:
                out.append((None, targets))
            if any(type(a) is Close or type(a) is Refuse for a in acts):
                out += [(None, None)] * (len(runs) - i - 1)  # the link is refused or closes
                break
        return out, others

    def _charge_run(self, member: _Member, run: RouteRun, now: float) -> bool:
        """Charge all of ``run`` as :meth:`_charge` would frame by frame, when it would
        admit every frame; else charge nothing (see :meth:`FairBucket.admit_all`)."""
        if run.control:
            return member.control.admit_all(now, run.size, run.last)
        cfg = self.config
        circuits = member.circuits
        if run.to not in circuits and len(circuits) >= cfg.member_streams:
            return False  # circuits to expire or a refusal: frame by frame
        if (
            now - self._rebalanced >= cfg.rebalance_s
            or member.last_sent < now - cfg.active_window_s
        ):
            self._rebalance(now, member)
        if not member.bucket.admit_all(now, run.size, run.last):
            return False
        circuits[run.to] = now
        member.last_sent = now
        return True

    def _route_each(
        self, link: LinkId, heads: Sequence[RouteHeader], now: float
    ) -> tuple[list[LinkId | None], list[Action]]:
        targets: list[LinkId | None] = []
        others: list[Action] = []
        for head in heads:
            acts = self.route(link, head, now)
            forward = acts[0] if len(acts) == 1 and type(acts[0]) is Forward else None
            targets.append(None if forward is None else forward.link)
            if forward is None:
                others += acts
                if acts and type(acts[0]) in (Close, Refuse):
                    break  # unattached, or a protocol breach: the rest go nowhere
        return targets + [None] * (len(heads) - len(targets)), others

    def _next_link(self, to: str, came_from: LinkId) -> LinkId | None:
        if not self.is_served(to):
            return None
        member = self._members.get(to)
        if member is not None:
            return member.link
        best = self._tables.best.get(to)
        if best is None or best[2] == came_from:  # never back where it came from
            return None
        return best[2]

    def _charge(self, member: _Member, route: RouteHeader, now: float) -> float:
        cfg = self.config
        if route.control:  # its own allowance: a member over its data budget stays linked
            return member.control.admit(now, route.size)
        circuits = member.circuits
        if route.to not in circuits and len(circuits) >= cfg.member_streams:
            horizon = now - cfg.circuit_idle_s
            for dest in [d for d, t in circuits.items() if t <= horizon]:
                del circuits[dest]
            if len(circuits) >= cfg.member_streams:
                return min(circuits.values()) - horizon
        if (
            now - self._rebalanced >= cfg.rebalance_s
            or member.last_sent < now - cfg.active_window_s
        ):
            self._rebalance(now, member)
        wait = member.bucket.admit(now, route.size)
        if wait == 0:
            circuits[route.to] = now
            member.last_sent = now
        return wait

    def _rebalance(self, now: float, sender: _Member) -> None:
        """Share the capacity equally among the members sending lately (spec §8)."""
        cfg = self.config
        horizon = now - cfg.active_window_s
        active = [m for m in self._members.values() if m.last_sent >= horizon or m is sender]
        rate = min(cfg.member_bytes_per_s, cfg.capacity_bytes_per_s / max(1, len(active)))
        self._rebalanced = now
        if rate != self._fair_rate:
            self._fair_rate = rate
            for m in active:
                m.bucket.set_rate(rate, now)
        elif sender.bucket.rate != rate:
            sender.bucket.set_rate(rate, now)

    # -- time ----------------------------------------------------------------------------

    def tick(self, now: float) -> list[Action]:
        """Expire stale tables, drop members no longer served, refresh route tables."""
        # a member's fair share changed since it was told: it paces to the new one
        actions: list[Action] = [
            self._tell(m) for m in self._members.values() if m.told != m.bucket.rate
        ]
        dropped = False
        if self._tables.refresh_due(now):
            for node in [n for n in self._members if not self.is_served(n)]:
                member = self._members.pop(node)
                del self._member_links[member.link]
                actions.append(Refuse(member.link, "unauthorized"))
                dropped = True
        return actions + self._tables.tick(now, members_changed=dropped)

    # -- views ---------------------------------------------------------------------------

    def member_link(self, node: str) -> LinkId | None:
        """The link of attached member ``node``, if any."""
        member = self._members.get(node)
        return member.link if member is not None else None

    def is_federated(self, link: LinkId) -> bool:
        """Whether ``link`` is up as a federated relay's."""
        return link in self._federated

    def routes(self) -> dict[str, str]:
        """``{node: via_relay}`` for nodes reached through federated relays (spec §8)."""
        return {node: relay for node, (_, relay, _) in self._tables.best.items()}

    def statistics(self) -> RelayStats:
        """The counters now."""
        c = self._count
        return RelayStats(
            len(self._members),
            len(self._federated),
            len(self._tables.best),
            c.forwarded,
            c.forwarded_bytes,
            c.duplicates,
            c.rate_limited,
            c.unreachable,
            c.ttl_expired,
            c.spoofed,
            c.foreign_tables,
            c.foreign_routes,
        )


# the actions and statistics live in relay_actions.py; callers take them from here too
__all__ = [
    "Action",
    "Close",
    "FairBucket",
    "Forward",
    "LinkId",
    "Refuse",
    "RelayConfig",
    "RelayCore",
    "RelayStats",
    "Send",
]
