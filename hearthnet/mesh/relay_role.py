"""The relay role of a node (spec §8; ``mesh.relay``, ``--relay``): relay frames arriving on
peer links go to :class:`~hearthnet.mesh.relay_core.RelayCore`, and its actions are
carried out on the links (``Send`` writes a frame, ``Refuse`` sends ``detach``, ``Close``
ends the link). Only members of this community are served, and nodes of federated
communities under an agreement in force, to and from our members only
(:mod:`hearthnet.mesh.relay_federated`). Relays that name each other in
``mesh.relay_peers`` (``--relay-peer``) federate: route tables go both ways, and a frame
for a member attached to the other relay goes relay → relay → member. A relay also
carries one ``join_via`` per join request for an invite it can check (bounded below).

The member side, and the dispatch of relay frames to the role they belong to, is
:class:`~hearthnet.mesh.relaying.Relaying`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from hearthnet.errors import RateLimited, Unavailable, WireError
from hearthnet.mesh.addresses import PeerBook
from hearthnet.mesh.links import PeerLink
from hearthnet.mesh.pacing import Budget
from hearthnet.mesh.relay_core import Action, Forward, Refuse, RelayCore, Send
from hearthnet.mesh.relay_frames import Detach, JoinAnswer, JoinVia, RelayFrame, Route
from hearthnet.mesh.route_batch import RouteRun, Span, batch_runs, passed_on_runs
from hearthnet.mesh.route_header import (
    RouteHeader,
    encode_route,
    parse_route,
    passed_on,
    read_header,
    v1_bytes,
)
from hearthnet.metrics import MetricsRegistry

log = logging.getLogger("hearthnet.mesh.relaying")

MAX_PENDING_JOINS = 4  # joins a relay carries at a time for nodes not yet members
JOIN_TIMEOUT_S = 10.0  # how long a relay waits for the inviter's answer to one
VERIFY_S = 5.0  # a peer relay's URL not yet reached by our own dial is dialled this often
UNKNOWN_ADDR = "0.0.0.0:1"  # observed address when the socket does not tell (unused yet)


def _observed_addr(link: PeerLink) -> str:
    """``ip:port`` the peer's connection came from, as this node sees it (spec §8)."""
    extra = getattr(link.ws, "get_extra_info", None)
    peer = extra("peername") if callable(extra) else None
    if isinstance(peer, tuple) and len(peer) >= 2:
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return UNKNOWN_ADDR


class RelayRole:
    """The relay's side (``--relay``): frames of attached members to the relay core, its
    actions carried out on the links.

    Federation (spec §8, ``mesh.relay_peers``, ``--relay-peer``): a link is federated
    only when both ends configured it, which no frame can fake. Our side: the peer's
    NodeID is the one this node reached when it dialled a configured URL itself (see
    :meth:`dialled`; an inbound hello's ``url`` is only a claim), and its signed hello
    says it is a relay (``relay: true``). Their side: a relay that did not configure us
    drops our tables (a ``route_table`` on a link not federated is dropped and counted),
    so neither learns routes from the other and nothing is forwarded. A member stays a
    member whatever it sends: budgeted, and ``route.from`` must be itself. A federated
    relay can only blackhole what it is asked to carry (``route.inner`` is sealed end to
    end), and only for the nodes its table puts behind it.
    """

    def __init__(
        self,
        core: RelayCore,
        metrics: MetricsRegistry,
        peer_urls: tuple[str, ...] = (),
        *,
        book: PeerBook | None = None,
        dial: Callable[[str], object] | None = None,
    ) -> None:
        self.core = core
        self.peer_urls = peer_urls  # normalized URLs of the relays we federate with
        self.book = book
        self.dial = dial  # dials one URL in the background (the mesh's dialer)
        self._next_verify = 0.0
        # url -> the NodeID our own dial of that URL reached (see dialled)
        self.verified: dict[str, str] = {}
        self._served: set[PeerLink] = set()  # links the core knows are up
        self._joins: dict[int, tuple[str, asyncio.Future[bytes]]] = {}  # id -> (inviter, answer)
        self._join_ids = itertools.count(1)
        self.joins_forwarded = 0
        # route frames in the CBOR map form (peers on hearthnet-peer.v1), read and written
        self.v1_routes = {"in": 0, "out": 0}
        # binary route messages (one frame, or a route batch) read, and queued to be
        # written (a v4 link's writer may merge those queued in one turn further)
        self.route_messages = {"in": 0, "out": 0}
        # configured peer relays not federated with, by reason (v1: a hearthnet-peer.v1
        # link; not_a_relay: its hello does not say relay)
        self.federation_refused = {"v1": 0, "not_a_relay": 0}
        self._refused: weakref.WeakSet[PeerLink] = weakref.WeakSet()  # each link counted once
        self._register(metrics)

    async def forward_join(self, link: PeerLink, request: bytes) -> bytes:
        """Carry a not-yet-member's join request to the inviter on ``link`` and return its
        answer (spec §8 ``--join`` through a relay). Bounded: :data:`MAX_PENDING_JOINS`
        at a time, each waits :data:`JOIN_TIMEOUT_S` at most.

        Raises:
            RateLimited: as many joins are on their way already.
            Unavailable: no answer in time, or the inviter's link went down.
        """
        if len(self._joins) >= MAX_PENDING_JOINS:
            raise RateLimited("this relay carries as many joins as it takes", retry_after_ms=1000)
        join_id = next(self._join_ids)
        answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._joins[join_id] = (link.node, answer)
        try:
            link.send_raw(JoinVia(join_id, request).encode())
            self.joins_forwarded += 1
            return await asyncio.wait_for(answer, JOIN_TIMEOUT_S)
        except TimeoutError as exc:
            raise Unavailable("the inviter did not answer the join in time") from exc
        finally:
            self._joins.pop(join_id, None)

    def join_answered(self, link: PeerLink, frame: JoinAnswer) -> None:
        """The inviter's answer to a join this relay carried (from that inviter only)."""
        pending = self._joins.get(frame.id)
        if pending is not None and pending[0] == link.node and not pending[1].done():
            pending[1].set_result(frame.answer)

    def dialled(self, link: PeerLink) -> None:
        """An outbound link came up through its handshake (admitted or not): when we
        dialled one of our peer relays' URLs, the node there is that relay."""
        if link.outbound and link.address in self.peer_urls:
            self.verified[link.address] = link.node

    def unverified(self) -> list[str]:
        """Peer relay URLs this node has not reached by its own dial yet."""
        return [url for url in self.peer_urls if url not in self.verified]

    def is_peer_relay(self, link: PeerLink) -> bool:
        """Whether ``link`` (a direct link) goes to a relay we federate with: one we
        configured and reached by our own dial, which says in its hello that it relays,
        on a ``hearthnet-peer.v2`` or later link (relays federate over v2 and up, spec §8)."""
        return link.v2 and link.peer.relay and link.node in self.verified.values()

    def link_up(self, link: PeerLink, now: float) -> None:
        """A direct link was admitted: federate when it goes to one of our peer relays;
        a configured peer relay that cannot federate is refused, logged and counted (it
        stays a member: attached, budgeted, its route frames read in the CBOR map form)."""
        if self.is_peer_relay(link):
            self._federate(link, now)
        elif link.node in self.verified.values() and link not in self._refused:
            reason = "v1" if not link.v2 else "not_a_relay"
            self._refused.add(link)
            self.federation_refused[reason] += 1
            log.warning(
                "not federating with %s (%s): %s",
                link.node,
                link.address,
                "it speaks hearthnet-peer.v1; relays federate over hearthnet-peer.v2 and later"
                if reason == "v1"
                else "its hello does not say it is a relay",
                extra={"peer": link.node},
            )

    def _federate(self, link: PeerLink, now: float) -> None:
        if self.core.is_federated(link):
            return
        log.info("federated with relay %s", link.node, extra={"peer": link.node})
        self._served.add(link)
        observed = _observed_addr(link)
        self._carry_out(self.core.link_up(link, link.node, observed, now, federated=True))

    def _serve(self, link: PeerLink, now: float) -> None:
        """The core learns of a direct link with its first relay frame."""
        self._served.add(link)
        self._carry_out(self.core.link_up(link, link.node, _observed_addr(link), now))

    def forward(self, link: PeerLink, data: bytes, now: float) -> None:
        """A binary route frame off a direct link (spec §11, the hot path): the header is
        read, the core decides, and the received bytes go on with ``ttl_hops`` one less.

        Raises:
            BadRequest: a malformed header (the link logs it and goes on).
        """
        head = read_header(data)
        self.route_messages["in"] += 1
        if link not in self._served:
            self._serve(link, now)
        for action in self.core.route(link, head, now):
            target = action.link
            assert isinstance(target, PeerLink)
            if isinstance(action, Forward):
                self._forward_one(target, data, head)
            else:
                self._carry_out([action])

    def forward_batch(
        self,
        link: PeerLink,
        data: bytes,
        now: float,
        runs: list[RouteRun] | None = None,
        messages: int = 1,
    ) -> list[Span]:
        """A route batch off a direct link (spec §11): its runs of frames between the same
        two nodes decided as :meth:`forward` decides one frame (at once where every frame
        of a run goes on), and the frames going to one v4 link written on as one message
        (each with ``ttl_hops`` one less). Returns the frames addressed to this node,
        which are not the relay's to forward. ``runs``: the batch's, read already;
        ``messages``: the WebSocket messages it came in (single frames of one read
        joined, :meth:`~hearthnet.mesh.relaying.Relaying.on_routes`).

        Raises:
            BadRequest / PayloadTooLarge: a malformed batch; none of it is taken.
        """
        if runs is None:
            runs = batch_runs(data)
        self.route_messages["in"] += messages
        if link not in self._served:
            self._serve(link, now)
        own = self.core.node_id
        mine: list[Span] = []
        if runs[0].to == own if len(runs) == 1 else any(run.to == own for run in runs):
            mine = [span for run in runs if run.to == own for span in run.spans()]
            runs = [run for run in runs if run.to != own]
        decided, others = self.core.route_runs(link, runs, now)
        if len(decided) == 1 and not mine:  # the usual batch: one run, all going on
            target, each = decided[0]
            if each is None and isinstance(target, PeerLink) and target.route_batches:
                if others:
                    self._carry_out(others)
                self.route_messages["out"] += 1
                target.enqueue(passed_on_runs(data, ((runs[0], None),), whole=True))
                return mine
        groups: dict[PeerLink, list[tuple[RouteRun, list[int] | None]]] = {}
        for run, (target, each) in zip(runs, decided, strict=True):
            if each is None:
                if target is not None:
                    self._pick(groups, target, run, None)
                continue
            chosen: dict[PeerLink, list[int]] = {}
            for i, frame_target in enumerate(each):
                if frame_target is not None:
                    assert isinstance(frame_target, PeerLink)
                    chosen.setdefault(frame_target, []).append(i)
            for peer, indices in chosen.items():
                self._pick(groups, peer, run, indices)
        if others:
            self._carry_out(others)
        for target, picks in groups.items():
            if not target.route_batches:  # a v3 or older link: each frame alone
                for run, chosen_at in picks:
                    spans = run.spans()
                    for i in range(len(spans)) if chosen_at is None else chosen_at:
                        head, start, end = spans[i]
                        self._forward_one(target, data[start:end], head)
                continue
            self.route_messages["out"] += 1
            whole = not mine and len(groups) == 1 and len(picks) == len(runs)
            whole = whole and all(chosen_at is None for _, chosen_at in picks)
            target.enqueue(passed_on_runs(data, picks, whole=whole))
        return mine

    @staticmethod
    def _pick(
        groups: dict[PeerLink, list[tuple[RouteRun, list[int] | None]]],
        target: object,
        run: RouteRun,
        chosen: list[int] | None,
    ) -> None:
        assert isinstance(target, PeerLink)
        group = groups.get(target)
        if group is None:
            groups[target] = [(run, chosen)]
        else:
            group.append((run, chosen))

    def _forward_one(self, target: PeerLink, data: bytes, head: RouteHeader) -> None:
        """Route frame ``data`` (header ``head``) passed on to ``target`` alone."""
        self.route_messages["out"] += 1
        if target.v2:
            target.enqueue(passed_on(data, head))
        else:  # a v1 peer takes the CBOR map (spec §8)
            route = parse_route(data)
            self._carry_out([Send(target, replace(route, ttl_hops=route.ttl_hops - 1))])

    def receive(self, link: PeerLink, frame: RelayFrame, now: float) -> None:
        """A relay frame in the CBOR map form off a direct link (a ``route`` from a
        ``hearthnet-peer.v1`` peer among them)."""
        if link not in self._served:
            self._serve(link, now)
        if isinstance(frame, Route):
            self.v1_routes["in"] += 1
        self._carry_out(self.core.receive(link, frame, now))

    def link_down(self, link: PeerLink, now: float) -> None:
        """A link ended: its member detaches."""
        if link in self._served:
            self._served.discard(link)
            self._carry_out(self.core.link_down(link, now))

    def tick(self, now: float) -> None:
        """Budgets, route tables, members no longer served; peer relays not verified yet
        are dialled every :data:`VERIFY_S`."""
        self._carry_out(self.core.tick(now))
        if now >= self._next_verify:
            self._next_verify = now + VERIFY_S
            self._verify_peer_relays()

    def _verify_peer_relays(self) -> None:
        """Dial the peer relays' URLs we have not reached ourselves (an inbound link from
        a relay proves nothing about which URL it is at), expecting no particular node."""
        for url in self.unverified():
            entry = self.book.addresses.get(url) if self.book is not None else None
            if entry is not None:
                entry.node = None  # what an inbound hello claimed is not what we dial for
            if self.dial is not None:
                self.dial(url)

    def _carry_out(self, actions: list[Action]) -> None:
        for action in actions:
            link = action.link
            assert isinstance(link, PeerLink)
            if isinstance(action, Send):
                frame = action.frame
                if isinstance(frame, Budget) and not link.v2:
                    continue  # a v1 member drops the link on a kind it does not know
                if not isinstance(frame, Route):
                    link.send_raw(frame.encode())
                elif link.v2:
                    link.enqueue(encode_route(frame))
                else:  # spec §8 mixed versions: a hearthnet-peer.v1 peer takes the CBOR map
                    self.v1_routes["out"] += 1
                    link.enqueue(v1_bytes(frame))
            elif isinstance(action, Forward):
                raise AssertionError("a Forward comes only from RelayCore.route")
            elif isinstance(action, Refuse):
                link.send_raw(Detach(action.code, retry_after_ms=action.retry_after_ms).encode())
            else:
                log.warning("relay closes the link to %s: %s", link.node, action.reason)
                link.close(action.reason)

    def statistics(self) -> dict[str, Any]:
        """The relay's numbers, for ``/status``."""
        s = self.core.statistics()
        return {
            "members": s.members,  # attached to it now, federated relays not among them
            "federated": s.federated,  # relays linked as federated
            # their NodeIDs (a handful: the relays named with --relay-peer), and those
            # relay URLs our own dial has not reached yet
            "peers": sorted({link.node for link in self._served if self.core.is_federated(link)}),
            "peers_unreached": self.unverified(),
            "routes": s.routes,  # members reached through them
            "forwarded": s.forwarded,
            "forwarded_bytes": s.forwarded_bytes,
            "rate_limited": s.rate_limited,
            "unreachable": s.unreachable,
            "duplicates": s.duplicates,
            "spoofed": s.spoofed,  # route.from not the member, or not behind that relay
            "foreign_tables": s.foreign_tables,  # route tables from links not federated
            # spec §8 community federation: frames between two nodes of other communities
            "foreign_routes": s.foreign_routes,
            "joins_forwarded": self.joins_forwarded,
            # route frames in the CBOR map form, read from and written to v1 peers
            "v1_routes_in": self.v1_routes["in"],
            "v1_routes_out": self.v1_routes["out"],
            # binary route messages read and queued: forwarded / route_messages_in is the
            # frames per message members send (route batches, spec §11)
            "route_messages_in": self.route_messages["in"],
            "route_messages_out": self.route_messages["out"],
            # configured peer relays not federated with: on a v1 link, or not relays
            **{f"federation_refused_{r}": n for r, n in self.federation_refused.items()},
        }

    def _register(self, m: MetricsRegistry) -> None:
        core = self.core
        m.gauge(
            "hearthnet_relay_members",
            "Members attached to this relay.",
            lambda: float(core.statistics().members),
        )
        m.read_counter(
            "hearthnet_relay_forwarded_frames",
            "Route frames this relay forwarded.",
            lambda: float(core.statistics().forwarded),
        )
        m.read_counter(
            "hearthnet_relay_forwarded_bytes",
            "Bytes of route.inner this relay forwarded.",
            lambda: float(core.statistics().forwarded_bytes),
        )

        def refused() -> dict[tuple[str, ...], float]:
            s = core.statistics()
            return {
                ("rate_limited",): float(s.rate_limited),
                ("unreachable",): float(s.unreachable),
                ("ttl",): float(s.ttl_expired),
                ("duplicate",): float(s.duplicates),
                ("spoofed",): float(s.spoofed),
                ("foreign",): float(s.foreign_routes),
            }

        m.read_counter(
            "hearthnet_relay_federation_refused",
            "Links to configured peer relays not federated, by reason (v1, not_a_relay).",
            lambda: {(r,): float(n) for r, n in self.federation_refused.items()},
            ("reason",),
        )
        m.read_counter(
            "hearthnet_relay_route_messages",
            "Binary route messages (a route frame or a route batch) read, and queued to write.",
            lambda: {(d,): float(n) for d, n in self.route_messages.items()},
            ("direction",),
        )
        m.read_counter(
            "hearthnet_relay_v1_route_frames",
            "Route frames in the CBOR map form (peers on hearthnet-peer.v1), by direction.",
            lambda: {(d,): float(n) for d, n in self.v1_routes.items()},
            ("direction",),
        )
        m.read_counter(
            "hearthnet_relay_refused_frames",
            "Route frames this relay did not forward, by reason (rate_limited: budget).",
            refused,
            ("reason",),
        )


JoinHandler = Callable[[Any], Awaitable[dict[str, Any]]]  # a join request -> the answer


class RelayedJoins:
    """Joins a relay carried to this node, their inviter (spec §8): each is admitted as
    ``POST /mesh/v1/join`` would, a few at a time, and the answer goes back on the link
    it came in on."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def answer(self, link: PeerLink, frame: JoinVia, handler: JoinHandler | None) -> None:
        """Admit the join request in ``frame`` with ``handler`` and answer the relay (no
        handler, or too many joins pending: unavailable)."""
        if handler is None or len(self._tasks) >= MAX_PENDING_JOINS:
            body: dict[str, Any] = Unavailable("this node takes no joins now").to_wire()
            link.send_raw(JoinAnswer(frame.id, json.dumps(body).encode()).encode())
            return

        async def answer() -> None:
            try:
                out = await handler(json.loads(frame.request))
            except WireError as exc:
                out = exc.to_wire()
            except ValueError:
                out = {"error": "bad_request", "message": "the join request is not JSON"}
            link.send_raw(JoinAnswer(frame.id, json.dumps(out).encode()).encode())

        task = asyncio.get_running_loop().create_task(answer(), name="mesh-relayed-join")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
