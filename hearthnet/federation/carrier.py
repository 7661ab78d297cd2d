"""The bridge's requests through relays (spec §8): HTTP requests carried on a peer link
with a node of a federated community.

A bridge whose peer is named ``mesh:<NodeID>`` (``--federation-peer mesh:ed25519:...``)
reaches it through a relay (mesh/relay_federated.py): its sync, pull and push, and the
federated calls of its members, travel as link frames::

    fed_req {id, method, path, headers: {name: value}, body: bytes | null}
    fed_res {id, status, body: bytes}

The receiving node answers a ``fed_req`` by making the same request to its own HTTP
server (the node's own listening address), so the request is authenticated, authorized
under the grant and rate limited exactly as it would be over HTTP: the signature covers
method, path with query and body, never the host. Only the requests a bridge makes are
carried (:data:`CARRIED`), only the credential headers go along, and a request naming
any community but the link peer's own is refused (``forbidden``), so a federated link
serves that community's grant and nothing else. Bounded: :data:`MAX_PENDING` requests in
flight each way, :data:`MAX_BODY_BYTES` per body, :data:`REQUEST_S` per request.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import aiohttp
import orjson
from yarl import URL

from hearthnet.errors import (
    BadRequest,
    Forbidden,
    HearthNetError,
    PayloadTooLarge,
    RateLimited,
    Unavailable,
    WireError,
    error_from_wire,
)
from hearthnet.identity import KeyPair
from hearthnet.mesh.links import PeerLink
from hearthnet.mesh.protocol import encode_frame
from hearthnet.mesh.relay_federated import FederatedLinks
from hearthnet.node_http import NodeHttp
from hearthnet.transport import headers as h

log = logging.getLogger("hearthnet.federation")

MESH_SCHEME = "mesh:"  # a bridge peer reached through relays: mesh:<NodeID>
CARRIED_URL = "http://carried.invalid"  # a carried client's placeholder: no host is dialled
# (method, path) a federated link carries: the bridge's sync, push and pull, and calls
CARRIED = frozenset(
    {
        ("POST", "/mesh/v1/federation/sync"),
        ("POST", "/mesh/v1/federation/push"),
        ("GET", "/pubsub/v1/subscribe"),
        ("POST", "/bus/v1/call"),
    }
)
# the headers that go along: credentials and the call's (the rest is the carrier's)
HEADERS = frozenset(
    name.lower()
    for name in (
        h.REQUEST_ID,
        h.COMMUNITY,
        h.TIMESTAMP,
        h.FROM,
        h.SIGNATURE,
        h.CAPABILITY,
        h.VERSION,
        h.TARGET,
        h.DEADLINE,
        "Content-Type",
        "Accept",
    )
)
MAX_PENDING = 32  # carried requests in flight, each way
MAX_BODY_BYTES = 1024 * 1024  # a carried request's or answer's body (frames: 2 MiB)
REQUEST_S = 15.0  # a pull parks 2 s; a sync or push is given 10 s over HTTP
FAREWELL_S = 2.0  # a link whose agreement ended closes at most this long after
MAX_PATH = 2048


def mesh_peer(url: str) -> str | None:
    """The NodeID a ``mesh:<NodeID>`` bridge peer names, else None (an HTTP URL)."""
    return url[len(MESH_SCHEME) :] if url.startswith(MESH_SCHEME) else None


@dataclass(frozen=True, slots=True)
class FedRequest:
    """``fed_req``: one HTTP request carried to a node of another community."""

    KIND: ClassVar[str] = "fed_req"
    id: int
    method: str
    path: str
    headers: dict[str, str]
    body: bytes | None

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Self:
        """From a decoded link frame; :class:`BadRequest` if malformed."""
        rid, method, path = obj.get("id"), obj.get("method"), obj.get("path")
        headers, body = obj.get("headers"), obj.get("body")
        if not (
            isinstance(rid, int)
            and isinstance(method, str)
            and isinstance(path, str)
            and path.startswith("/")
            and len(path) <= MAX_PATH
            and isinstance(headers, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
            and (body is None or isinstance(body, bytes))
        ):
            raise BadRequest("fed_req is {id, method, path, headers, body}")
        return cls(rid, method, path, headers, body)

    def encode(self) -> bytes:
        """The link frame."""
        return encode_frame(
            self.KIND,
            id=self.id,
            method=self.method,
            path=self.path,
            headers=self.headers,
            body=self.body,
        )


@dataclass(frozen=True, slots=True)
class FedAnswer:
    """``fed_res``: the answer to a ``fed_req`` (status and body of the HTTP answer)."""

    KIND: ClassVar[str] = "fed_res"
    id: int
    status: int
    body: bytes

    @classmethod
    def parse(cls, obj: dict[str, Any]) -> Self:
        """From a decoded link frame; :class:`BadRequest` if malformed."""
        rid, status, body = obj.get("id"), obj.get("status"), obj.get("body")
        if not (isinstance(rid, int) and isinstance(status, int) and isinstance(body, bytes)):
            raise BadRequest("fed_res is {id, status, body}")
        return cls(rid, status, body)

    def encode(self) -> bytes:
        """The link frame."""
        return encode_frame(self.KIND, id=self.id, status=self.status, body=self.body)

    @classmethod
    def error(cls, rid: int, status: int, error: WireError) -> Self:
        """An answer carrying ``error`` as the node's HTTP answer would."""
        return cls(rid, status, orjson.dumps(error.to_wire()))


def check_request(request: FedRequest, community: str | None) -> FedRequest:
    """The request a node of ``community`` may have carried to us: ``request`` with its
    method in capitals and only the headers that go along (:data:`HEADERS`).

    Raises:
        Forbidden: not a request a bridge makes, or signed for another community.
        BadRequest: a header value with a line break.
        PayloadTooLarge: the body is over :data:`MAX_BODY_BYTES`.
    """
    method, path = request.method.upper(), request.path.split("?", 1)[0]
    if (method, path) not in CARRIED:
        raise Forbidden(f"{method} {path[:100]} is not carried for another community")
    kept = {k: v for k, v in request.headers.items() if k.lower() in HEADERS}
    if any("\r" in v or "\n" in v for v in kept.values()):
        raise BadRequest("a carried header value has a line break")
    named = {k.lower(): v for k, v in kept.items()}.get(h.COMMUNITY.lower())
    if community is None or named != community:
        raise Forbidden("a carried request is signed for the link peer's own community")
    if request.body is not None and len(request.body) > MAX_BODY_BYTES:
        raise PayloadTooLarge(f"a carried body is at most {MAX_BODY_BYTES} bytes")
    return FedRequest(request.id, method, request.path, kept, request.body)


class Carrier:
    """Carried requests on the federated links: ours out, theirs to our own server."""

    def __init__(
        self,
        links: FederatedLinks,
        *,
        spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]],
        keys: KeyPair | None = None,
        offer: Callable[[str], dict[str, Any]] | None = None,
        community: str = "",
    ) -> None:
        self.links = links
        self.spawn = spawn
        # the sync a link whose agreement ended gets before it closes (the revocation)
        self.keys, self.offer, self.community = keys, offer, community
        self.local_url = ""  # our own server, set when the node listens
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[str, asyncio.Future[FedAnswer]]] = {}
        self._serving = 0
        self._http: aiohttp.ClientSession | None = None
        self.counts = {"sent": 0, "served": 0, "refused": 0}
        links.carry = self.frame
        links.lost = self._lost
        links.farewell = self.farewell

    async def request(
        self, node: str, method: str, path: str, headers: dict[str, str], body: bytes | None
    ) -> tuple[int, bytes]:
        """Carry one request to ``node`` and return its answer's status and body.

        Raises:
            Unavailable: no federated link with ``node`` (yet), or no answer in time.
            RateLimited: :data:`MAX_PENDING` requests are in flight already.
        """
        link = self.links.links.get(node)
        if link is None:
            raise Unavailable(f"no path to {node} through a relay yet", retry_after_ms=1000)
        if len(self._pending) >= MAX_PENDING:
            raise RateLimited("as many carried requests are in flight as allowed")
        rid = next(self._ids)
        answer: asyncio.Future[FedAnswer] = asyncio.get_running_loop().create_future()
        self._pending[rid] = (node, answer)
        kept = {k: v for k, v in headers.items() if k.lower() in HEADERS}
        try:
            if not link.send_raw(FedRequest(rid, method.upper(), path, kept, body).encode()):
                raise Unavailable(f"the link to {node} is closing")
            self.counts["sent"] += 1
            got = await asyncio.wait_for(answer, REQUEST_S)
        except TimeoutError as exc:
            raise Unavailable(f"{node} did not answer a carried request in time") from exc
        finally:
            self._pending.pop(rid, None)
        return got.status, got.body

    def farewell(self, link: PeerLink) -> None:
        """The agreement with ``link``'s community ended here: hand the other side our
        agreements and revocations (a sync, as a bridge would), then close the link,
        within :data:`FAREWELL_S`. So the revocation reaches the other side even when
        this link was its only way to us."""
        self.spawn(self._farewell(link), f"federation-farewell-{link.node}")

    async def _farewell(self, link: PeerLink) -> None:
        try:
            if self.keys is not None and self.offer is not None and link.peer.community:
                body = self.offer(link.peer.community)
                # imported here: the CLI's client is not loaded by a node that never
                # carries a request (idle RSS, spec §11)
                from hearthnet.federation.carried_client import CarriedClient  # noqa: PLC0415

                client = CarriedClient(
                    link.node, self.carry_to(link.node), keys=self.keys, community=self.community
                )
                async with asyncio.timeout(FAREWELL_S):
                    await client.request_json("POST", "/mesh/v1/federation/sync", body)
        except (HearthNetError, TimeoutError) as exc:
            log.info("no farewell sync with %s: %s", link.node, exc)
        finally:
            link.close("the federation agreement is no longer in force")

    def carry_to(self, node: str) -> Carry:
        """:meth:`request` to ``node``, for a
        :class:`~hearthnet.federation.carried_client.CarriedClient`."""

        async def carry(
            method: str, path: str, headers: dict[str, str], body: bytes | None
        ) -> tuple[int, bytes]:
            return await self.request(node, method, path, headers, body)

        return carry

    def _lost(self, node: str) -> None:
        """The link with ``node`` ended: the requests waiting on it fail now."""
        for peer, answer in list(self._pending.values()):
            if peer == node and not answer.done():
                answer.set_exception(Unavailable(f"the link to {node} ended"))

    def frame(self, link: PeerLink, raw: dict[str, Any]) -> None:
        """A ``fed_req`` or ``fed_res`` off a federated link."""
        try:
            if raw.get("t") == FedAnswer.KIND:
                answer = FedAnswer.parse(raw)
                pending = self._pending.get(answer.id)
                if pending is not None and pending[0] == link.node and not pending[1].done():
                    pending[1].set_result(answer)
                return
            request = FedRequest.parse(raw)
        except HearthNetError as exc:
            self.links.count("bad_carried_frame")
            log.info("bad carried frame from %s: %s", link.node, exc)
            return
        try:
            request = check_request(request, link.peer.community)
            if self._serving >= MAX_PENDING:
                raise RateLimited("as many carried requests are in flight as allowed")
        except WireError as exc:
            self.counts["refused"] += 1
            self.links.count(f"carried_{exc.code}")
            link.send_raw(FedAnswer.error(request.id, exc.http_status, exc).encode())
            return
        self._serving += 1
        self.spawn(self._serve(link, request), f"federation-carried-{request.id}")

    async def _serve(self, link: PeerLink, request: FedRequest) -> None:
        """Make ``request`` to our own server and send its answer back on ``link``."""
        try:
            if self._http is None:
                self._http = aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=REQUEST_S, sock_connect=5)
                )
            url = URL(self.local_url + request.path, encoded=True)
            async with self._http.request(
                request.method, url, headers=request.headers, data=request.body
            ) as resp:
                body = await resp.content.read(MAX_BODY_BYTES + 1)
                if len(body) > MAX_BODY_BYTES:
                    error: WireError = PayloadTooLarge("the answer is too large to carry")
                    answer = FedAnswer.error(request.id, error.http_status, error)
                else:
                    answer = FedAnswer(request.id, resp.status, body)
            self.counts["served"] += 1
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            error = Unavailable(f"the carried request failed here: {type(exc).__name__}")
            answer = FedAnswer.error(request.id, error.http_status, error)
        finally:
            self._serving -= 1
        link.send_raw(answer.encode())

    async def close(self) -> None:
        """Close our client session (the node stops)."""
        if self._http is not None:
            await self._http.close()
            self._http = None


Carry = Callable[[str, str, dict[str, str], bytes | None], Awaitable[tuple[int, bytes]]]


class CarriedHttp(NodeHttp):
    """The HTTP API of node ``to``, each exchange carried through relays (``carry``:
    :meth:`Carrier.carry_to`, or the carry endpoint of a bridge) and answered like an
    HTTP one."""

    def __init__(self, to: str, carry: Carry, *, keys: KeyPair, community: str) -> None:
        super().__init__(CARRIED_URL, keys=keys, community=community)
        self.to = to
        self._carry = carry

    async def send(self, method: str, url: str | URL, **kwargs: Any) -> Any:
        """One carried exchange."""
        target = url if isinstance(url, URL) else URL(url, encoded=True)
        data = kwargs.get("data")
        status, raw = await self._carry(
            method, target.raw_path_qs, dict(kwargs.get("headers") or {}), data
        )
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"{self.to} answered {status} with non-JSON body") from exc
        if status >= 400:
            if isinstance(body, dict) and "error" in body:
                raise error_from_wire(body)
            raise error_from_wire({"error": "internal_error", "message": f"HTTP {status}"})
        return body


def __getattr__(name: str) -> Any:
    """``CarriedClient``, which lives in :mod:`hearthnet.federation.carried_client` so that
    importing this module does not load the CLI's client (PEP 562)."""
    if name == "CarriedClient":
        from hearthnet.federation.carried_client import CarriedClient  # noqa: PLC0415

        return CarriedClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
