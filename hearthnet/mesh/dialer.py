"""Opening peer links (spec §7.2, §3.1): accepting ``GET /mesh/v1/peer``, dialling an
address, TLS between hosts, the handshake, and the referral a full node gives.

Asyncio glue around :class:`~hearthnet.mesh.protocol.Handshake`. An established link is
handed to ``admit`` (the mesh's link-up, which asks :class:`~hearthnet.mesh.routing.Routes`)
and then run here until it ends, inside the task that accepted or dialled it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from hearthnet import __version__
from hearthnet.clock import now_ms
from hearthnet.config import MeshSection
from hearthnet.errors import (
    REJOIN_ADVICE,
    ConfigError,
    Forbidden,
    InvalidSignature,
    Revoked,
    Unauthorized,
    Unavailable,
    UpgradeRequired,
    WireError,
)
from hearthnet.identity import KeyPair
from hearthnet.membership import Membership
from hearthnet.mesh.addresses import PeerBook
from hearthnet.mesh.linkread import install
from hearthnet.mesh.links import (
    HANDSHAKE_TIMEOUT_S,
    BinaryHandler,
    FrameHandler,
    LinkErrors,
    PeerLink,
    RoutesHandler,
    WebSocketLike,
    receive_referral,
    run_handshake,
    send_referral,
)
from hearthnet.mesh.protocol import (
    ANOTHER_COMMUNITY,
    FEATURES,
    MAX_FRAME_BYTES,
    SUBPROTOCOLS,
    Handshake,
    LinkToSelf,
    PeerInfo,
    link_version,
)
from hearthnet.mesh.routing import Routes
from hearthnet.mesh.tls import client_context, peer_node_id
from hearthnet.metrics import Counter
from hearthnet.transport.closing import CLOSE_GRACE_S, OpenTransports, TrackedConnector
from hearthnet.transport.server import error_response

log = logging.getLogger("hearthnet.mesh")

MAX_REFERRALS = 16  # handshakes at once with members a full node only sends elsewhere
FULL_HOLD_S = 60.0  # a node that was full is not dialled again for this long
LINKED_HOLD_S = 3600.0  # an address linked is not dialled again while the link is up
DUPLICATE_HOLD_S = 30.0  # an address whose link lost to a simultaneous dial
REFUSED_HOLD_S = 300.0  # an address that refused us as revoked, not a member or not a bridge
# what the operator of a revoked node reads in its log (also node_membership.py)
REVOKED_ADVICE = (
    "its key can no longer act in the community (links, calls, publishes and this data"
    " dir's commands are refused); " + REJOIN_ADVICE
)


def _log_refusal(form: str, where: str, error: WireError) -> None:
    """Log a refused link (``form`` with ``where`` and the error); a peer's ``revoked``
    refusal is about this node, not the peer (its ``bye`` says "the peer is revoked" from
    where it stands): a warning saying so."""
    if isinstance(error, Revoked) and error.remote:
        log.warning(
            "the node at %s refused a link: it holds this node as revoked: %s",
            where,
            REVOKED_ADVICE,
        )
    else:
        log.info(form, where, error)


# an address only claimed by a linked node is checked once (a probe) per LINKED_HOLD_S,
# at most this many at once (probes bring up no link, so the link budget does not bound them)
MAX_PROBES = 4


class Dialer:
    """Accepts and dials peer links for one node.

    Args:
        keys: this node's keys (the hello's signature).
        membership: who may link (checked in the handshake).
        config: the mesh section (``max_links``).
        name: this node's name, sent in the hello.
        tls_mode: ``auto`` (TLS between hosts), ``on`` or ``off``.
        book: the peer addresses (dialled, held, failed, exchanged).
        routes: the links up (for the link budget).
        refused: counter of links refused, by reason.
        link_errors: where link socket failures are counted.
        spawn: starts a task in the mesh's task group.
        admit: the mesh's link-up: True when the link was taken.
        on_frame / on_down: the handlers every link gets.
    """

    def __init__(
        self,
        *,
        keys: KeyPair,
        membership: Membership,
        config: MeshSection,
        name: str,
        tls_mode: str,
        book: PeerBook,
        routes: Routes,
        refused: Counter,
        link_errors: LinkErrors,
        spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]],
        admit: Callable[[PeerLink], bool],
        on_frame: FrameHandler,
        on_down: Callable[[PeerLink, str], None],
        on_binary: BinaryHandler | None = None,
        on_routes: RoutesHandler | None = None,
        federated: Callable[[str, str], bool] | None = None,
    ) -> None:
        if tls_mode not in ("auto", "on", "off"):
            raise ConfigError("node.tls is auto, on or off")
        self.keys = keys
        self.membership = membership
        self.config = config
        self.name = name
        self.tls_mode = tls_mode
        self.book = book
        self.routes = routes
        self.refused = refused
        self.link_errors = link_errors
        self.spawn = spawn
        self.admit = admit
        self.on_frame = on_frame
        self.on_binary = on_binary
        self.on_routes = on_routes
        self.on_down = on_down
        self.federated = federated  # (node, community): a federated node (spec §8)
        self.federated_links: Mapping[str, PeerLink] = {}  # up, so not dialled again
        # (node, community): a bridge an agreement names, the only ones our relay takes
        self.bridge: Callable[[str, str], bool] | None = None
        self.url = ""  # ours, sent in the hello (set when the node listens)
        # the peer-link versions offered and taken, newest first (spec §7.2): a node
        # speaking fewer acts as a build from before the ones it leaves out
        self.subprotocols: tuple[str, ...] = SUBPROTOCOLS
        # spec §8: the relay URLs we are reachable through (the manifest's), in v4 hellos
        self.relay_urls: Callable[[], tuple[str, ...]] = tuple
        self.dial_timeout_s = HANDSHAKE_TIMEOUT_S  # connect, upgrade and handshake, in all
        self.dialing: set[str] = set()
        self.probing: set[str] = set()  # addresses being probed (see probe)
        self._referrals = 0  # handshakes in flight with members we are too full to link
        self._tls_client = client_context() if tls_mode != "off" else None
        self._http: aiohttp.ClientSession | None = None
        # dialled connections until lost: a TLS close in flight when the mesh stops is
        # waited for (bounded), then aborted, so no socket outlives the node (spec §9)
        self.connections = OpenTransports()
        self.close_grace_s = CLOSE_GRACE_S

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        """The HTTP client dials go through, open while the mesh runs."""
        self._http = aiohttp.ClientSession(
            connector=TrackedConnector(self.connections),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
        )
        try:
            yield
        finally:
            await self._http.close()
            await self.connections.close_all(self.close_grace_s)

    def _handshake(self, *, outbound: bool, link: int, expect: str | None = None) -> Handshake:
        return Handshake(
            self.keys,
            self.membership,
            outbound,
            now_ms(),
            name=self.name,
            url=self.url,
            version=__version__,
            expect=expect,
            # a v1 peer may be from before the relay field and refuse the hello
            relay=self.config.relay and link >= 2,
            link=link,
            relays=self.relay_urls(),  # sent on v4 links only (older peers refuse it)
            features=FEATURES,  # sent on v5 links only (older peers refuse it)
            federated=self.federated,
            bridge=self.bridge,
        )

    def _link(
        self, peer: PeerInfo, ws: WebSocketLike, outbound: bool, address: str | None
    ) -> PeerLink:
        return PeerLink(
            peer,
            ws,
            outbound=outbound,
            on_frame=self.on_frame,
            on_down=self.on_down,
            address=address,
            errors=self.link_errors,
            on_binary=self.on_binary,
            on_routes=self.on_routes,
            v2=peer.link >= 2,
            route_batches=peer.takes_route_batches,
        )

    async def accept(self, request: web.Request) -> web.StreamResponse:
        """``GET /mesh/v1/peer``: a peer dials us; the link runs until it ends."""
        offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",")]
        if not set(self.subprotocols) & set(offered):
            self.refused.inc("subprotocol")
            spoken = ", ".join(self.subprotocols)
            return error_response(
                UpgradeRequired(f"peer links speak {spoken}"),
                headers={"Sec-WebSocket-Protocol": spoken},
            )
        transport = request.transport
        over_tls = transport is not None and transport.get_extra_info("ssl_object") is not None
        if not over_tls and self.needs_tls(request.remote or ""):
            self.refused.inc("plain_between_hosts")
            return error_response(
                UpgradeRequired("peer links between hosts use TLS: dial https://")
            )
        full = len(self.routes) >= 2 * self.config.max_links
        if full and self._referrals >= MAX_REFERRALS:
            self.refused.inc("full")
            return error_response(
                Unavailable("this node has all the peer links it takes", retry_after_ms=5000)
            )
        ws = web.WebSocketResponse(
            protocols=self.subprotocols,
            max_msg_size=MAX_FRAME_BYTES,
            compress=False,
            heartbeat=None,
            autoping=True,
        )
        await ws.prepare(request)
        install(ws, MAX_FRAME_BYTES)  # spec §11: reads split in batches (linkread.py)
        # the first the dialer offered that we speak
        handshake = self._handshake(outbound=False, link=link_version(ws.ws_protocol))
        handshake.full = full
        self._referrals += full
        try:
            peer = await run_handshake(ws, handshake, now_ms, self.link_errors)
            if full:
                # A verified member that found us full learns where else to link, so a
                # node whose only bootstrap address is a busy node still joins the mesh.
                self.refused.inc("full")
                await send_referral(ws, self.book.urls_for_exchange(), self.link_errors)
                return ws
        except WireError as exc:
            self.refused.inc(exc.code)
            if isinstance(exc, Unavailable):  # a peer's probe of our URL closes there, and
                # so does the loser of two simultaneous dials: nothing for an operator
                log.debug("a peer link from %s ended in the handshake: %s", request.remote, exc)
            else:
                _log_refusal("refused a peer link from %s: %s", str(request.remote), exc)
            await ws.close(code=1008, message=exc.code.encode())
            return ws
        finally:
            self._referrals -= full
        # the hello's url is a claim: it is checked by our own dial (a probe) before it counts
        entry = self.book.add(peer.url, node=peer.node, source="inbound") if peer.url else None
        if entry is not None and entry.verified and entry.node != peer.node:
            entry = None  # another node's address, as our own dial found
        link = self._link(peer, ws, False, entry.url if entry is not None else None)
        if self.admit(link):
            if entry is not None and entry.verified:
                # linked, so worth sharing with other peers; not dialled while the link is up
                self.book.succeeded(entry.url, peer.node, now_ms())
                self.book.hold(entry.url, time.monotonic(), LINKED_HOLD_S)
            await link.run()
        else:
            await ws.close(code=1000, message=b"duplicate")
        return ws

    async def dial(self, url: str) -> None:
        """Dial one address and run the link while it is up (the dial loop calls this;
        tests and --peer too). A second dial of an address already being dialled returns."""
        if url in self.dialing:
            return
        self.dialing.add(url)
        try:
            opened = await self._open(url)
        finally:
            self.dialing.discard(url)
        if opened is None:
            return
        ws, peer = opened
        self.book.succeeded(url, peer.node, now_ms())
        if peer.full:
            self.book.learn_exchanged(await receive_referral(ws), self.keys.node_id)
            self.book.hold(url, time.monotonic(), FULL_HOLD_S)
            log.info("%s is full; learnt addresses from it", url)
            return
        link = self._link(peer, ws, True, url)
        if self.admit(link):
            self.book.hold(url, time.monotonic(), LINKED_HOLD_S)
            await link.run()
        else:
            self.book.hold(url, time.monotonic(), DUPLICATE_HOLD_S)
            await ws.close()

    async def probe(self, url: str) -> None:
        """Check which node answers at ``url``, an address a linked node only claimed:
        the handshake up to the answer's signed hello, no link (the link that is up stays
        as it is). The node found is recorded there as verified; the address is not
        probed again for :data:`LINKED_HOLD_S` while that node stays linked."""
        if url in self.dialing or url in self.probing:
            return
        self.probing.add(url)
        try:
            opened = await self._open(url, probe=True)
        finally:
            self.probing.discard(url)
        if opened is None:
            self.book.hold(url, time.monotonic(), LINKED_HOLD_S)
            return
        ws, peer = opened
        await ws.close()
        self.book.succeeded(url, peer.node, now_ms())
        if peer.node in self.routes.links:
            self.book.hold(url, time.monotonic(), LINKED_HOLD_S)

    async def _open(
        self, url: str, *, probe: bool = False
    ) -> tuple[aiohttp.ClientWebSocketResponse, PeerInfo] | None:
        """Connect, upgrade and shake hands with ``url``, all within ``dial_timeout_s``
        (a peer that takes the TCP connection and never answers must not hold a dial
        slot forever); None when that failed (and the address book knows). Only a
        verified NodeID is expected there."""
        assert self._http is not None
        address = self.book.addresses.get(url)
        expect = address.expect if address is not None else None
        target = self.dial_url(url)
        try:
            async with asyncio.timeout(self.dial_timeout_s):
                return await self._connect_peer(self._http, target, expect, probe=probe)
        except WireError as exc:
            self._failed(url, exc)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            self._failed(url, None)
            log.debug("dial %s failed: %s", target, exc)
        return None

    async def _connect_peer(
        self,
        http: aiohttp.ClientSession,
        target: str,
        expect: str | None,
        *,
        probe: bool = False,
    ) -> tuple[aiohttp.ClientWebSocketResponse, PeerInfo]:
        """The peer-link upgrade at ``target`` and the signed handshake (with ``expect``
        when the node is known); the socket is closed when anything fails.

        Raises:
            InvalidSignature: the TLS certificate is not the expected node's, or it and
                the signed hello disagree.
        """
        tls = target.startswith("https:")
        ws = await http.ws_connect(
            target + "/mesh/v1/peer",
            protocols=self.subprotocols,
            max_msg_size=MAX_FRAME_BYTES,
            autoping=True,
            heartbeat=None,
            compress=0,
            ssl=self._tls_client if tls and self._tls_client is not None else False,
        )
        install(ws, MAX_FRAME_BYTES)  # before we speak first: no frame has arrived yet
        try:
            # spec §3.1: the certificate must carry the key of the node we meant to reach
            cert_node = peer_node_id(ws.get_extra_info("ssl_object")) if tls else None
            if cert_node is not None and expect is not None and cert_node != expect:
                raise InvalidSignature(f"{target} presented the certificate of {cert_node}")
            link = link_version(ws.protocol)
            handshake = self._handshake(outbound=True, link=link, expect=expect)
            peer = await run_handshake(ws, handshake, now_ms, self.link_errors, probe=probe)
            if cert_node is not None and cert_node != peer.node:
                raise InvalidSignature("the TLS certificate and the signed hello disagree")
        except BaseException:
            await ws.close()
            raise
        return ws, peer

    async def dial_punched(
        self,
        addr: str,
        expect: str,
        socket_factory: Callable[[Any], socket.socket],
        within_s: float,
    ) -> bool:
        """The client side of a direct upgrade (spec §8): connect to ``addr`` (``ip:port``)
        with a socket from ``socket_factory`` (bound to our listening port, so the connect
        is one half of a simultaneous open), then TLS, the upgrade and the handshake with
        ``expect``; the link runs here until it ends. False when no link came of it."""
        target = self.dial_url(f"http://{addr}")
        connector = TrackedConnector(
            self.connections, socket_factory=socket_factory, force_close=True
        )
        async with aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None, sock_connect=within_s)
        ) as http:
            try:
                async with asyncio.timeout(within_s + self.dial_timeout_s):
                    ws, peer = await self._connect_peer(http, target, expect)
            except (WireError, TimeoutError, aiohttp.ClientError, OSError) as exc:
                log.info("punched dial of %s (%s) failed: %s", expect, addr, exc)
                return False
            link = self._link(peer, ws, True, None)
            if not self.admit(link):
                await ws.close()
                return False
            await link.run()
            return True

    def dial_tick(self) -> None:
        """Dial the addresses that are due, up to the link budget (spec §7.2: D links);
        probe those only claimed by a linked node, up to :data:`MAX_PROBES` at once."""
        linked = set(self.routes.links) | set(self.federated_links)
        due = [
            a
            for a in self.book.due(time.monotonic(), linked)
            if a.url not in self.dialing and a.url not in self.probing
        ]
        claimed = [a for a in due if a.node in linked]  # check them, do not link
        for address in claimed[: max(MAX_PROBES - len(self.probing), 0)]:
            self.spawn(self.probe(address.url), f"probe-{address.url}")
        room = self.config.max_links - len(self.routes) - len(self.dialing)
        for address in [a for a in due if a.node not in linked][: max(room, 0)]:
            self.spawn(self.dial(address.url), f"dial-{address.url}")

    def _failed(self, url: str, error: WireError | None) -> None:
        self.book.failed(url, time.monotonic())
        if error is None:
            return
        self.refused.inc(error.code)
        if url in self.relay_urls() and error.message == ANOTHER_COMMUNITY:
            log.warning(
                "relay %s refused: it belongs to another community; to attach, this node "
                "must be a member of it (stop the node and start it once with --join "
                "hn1:..., an invite from that community) or hold a federation agreement in "
                "force with it (hearthnet federation list)",
                url,
            )
        else:
            _log_refusal("dialling %s refused: %s", url, error)
        if isinstance(error, LinkToSelf):
            self.book.own_urls.add(url)
            self.book.addresses.pop(url, None)
        elif isinstance(error, Revoked | Unauthorized | Forbidden):
            self.book.hold(url, time.monotonic(), REFUSED_HOLD_S)  # no point asking again soon

    def needs_tls(self, host: str) -> bool:
        """Whether a peer link with ``host`` must use TLS (spec §3.1: between hosts)."""
        if self.tls_mode == "off":
            return False
        if self.tls_mode == "on":
            return True
        try:
            return not ipaddress.ip_address(host.strip("[]")).is_loopback
        except ValueError:
            return host != "localhost"

    def dial_url(self, url: str) -> str:
        """The URL to dial: https between hosts (on the same port), plain where allowed."""
        parts = urlsplit(url)
        scheme = "https" if self.needs_tls(parts.hostname or "") else "http"
        return f"{scheme}://{parts.netloc}"
