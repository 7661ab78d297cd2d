"""Federation endpoints (spec §8).

- ``POST /mesh/v1/federation`` (a member's signed request; ``hearthnet federation accept``
  and ``revoke``): ``{agreements, revocations, records: {community: [...]}}``; answers
  what was new and the listing.
- ``GET /mesh/v1/federation`` (a member's signed request; ``hearthnet federation list``).
- ``POST /mesh/v1/federation/sync``: another community's bridge. Everything in it is
  signed (agreements by both anchors, revocations by an anchor, membership records by
  members), and only agreements an anchor of ours signed take a place, so no other
  credential is asked for.
- ``POST /mesh/v1/federation/carry`` (a member's signed request):
  ``{to: NodeID, method, path, headers, body}``, a request signed by a member of ours for
  a node of a federated community that this node reaches through a relay; carried there
  (federation/carrier.py), where it is authenticated and checked under the grant as over
  HTTP, and answered with that node's answer.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from hearthnet.auth import Authenticator
from hearthnet.clock import now_ms
from hearthnet.errors import BadRequest, Forbidden
from hearthnet.federation.bridge import Bridge
from hearthnet.federation.carrier import Carrier
from hearthnet.federation.service import Federation
from hearthnet.transport.codec import loads
from hearthnet.transport.headers import read_signed_headers
from hearthnet.transport.server import json_response


class FederationHttp:
    """HTTP side of federation."""

    def __init__(
        self,
        federation: Federation,
        bridge: Bridge,
        authenticator: Authenticator,
        *,
        carrier: Carrier | None = None,
    ) -> None:
        self.carrier = carrier
        self.federation = federation
        self.bridge = bridge
        self.authenticator = authenticator

    def routes(self) -> list[web.RouteDef]:
        """The routes."""
        return [
            web.get("/mesh/v1/federation", self.listing),
            web.post("/mesh/v1/federation", self.submit),
            web.post("/mesh/v1/federation/sync", self.sync),
            web.post("/mesh/v1/federation/push", self.push),
            web.post("/mesh/v1/federation/carry", self.carry),
        ]

    def _member(self, request: web.Request, body: Any) -> None:
        caller = self.authenticator.authenticate_headers(
            method=request.method,
            path=request.raw_path,
            body=body,
            signed=read_signed_headers(request.headers),
            now_ms=now_ms(),
        )
        if caller.kind == "federated" or caller.token is not None:
            raise Forbidden("only members of this community manage its federations")

    async def listing(self, request: web.Request) -> web.Response:
        """Every agreement held, with its status."""
        self._member(request, None)
        return json_response(self._listing())

    def _listing(self) -> dict[str, Any]:
        return {
            "community": self.federation.community_id,
            "agreements": self.federation.view.listing(now_ms()),
            **self.bridge.statistics(),
        }

    async def submit(self, request: web.Request) -> web.Response:
        """Signed agreements, revocations and records from a member (the CLI)."""
        body = loads(await request.read())
        self._member(request, body)
        if not isinstance(body, dict):
            raise BadRequest("the body is {agreements, revocations, records}")
        agreements = body.get("agreements", [])
        revocations = body.get("revocations", [])
        records = body.get("records", {})
        if not (
            isinstance(agreements, list)
            and isinstance(revocations, list)
            and isinstance(records, dict)
        ):
            raise BadRequest("agreements and revocations are lists, records an object")
        added = await self.federation.apply(agreements, revocations, records)
        return json_response({"added": added, **self._listing()})

    async def sync(self, request: web.Request) -> web.Response:
        """A bridge of another community exchanges what it holds with us. Our membership
        records go only to a member of that community under an agreement in force (the
        request is signed as such); once no agreement is in force, such a member still
        gets the agreements and their revocations, so that a revocation reaches the other
        side. Anyone else is refused (``unauthorized``)."""
        body = loads(await request.read())
        community = await self.federation.take_sync(body)
        members = True
        try:
            caller = self.authenticator.authenticate_headers(
                method=request.method,
                path=request.raw_path,
                body=body,
                signed=read_signed_headers(request.headers),
                now_ms=now_ms(),
            )
        except Forbidden:  # no agreement in force (any more): no records
            members = False
        else:
            if caller.kind != "federated" or caller.token is None:
                raise BadRequest("a sync comes from a bridge of another community")
        assert isinstance(body, dict)
        if members:
            members = body.get("known") != len(self.federation.view.membership.records)
        return json_response(self.federation.offer(community, members=members))

    async def push(self, request: web.Request) -> web.Response:
        """Messages from a bridge of another community, on topics it grants us (each is
        checked by :meth:`Bridge.take_messages`); the request is signed by a member of
        that community under an agreement in force. Answered once what was taken is
        durable here, so the pushing bridge moves its cursor only past that."""
        body = loads(await request.read())
        caller = self.authenticator.authenticate_headers(
            method=request.method,
            path=request.raw_path,
            body=body,
            signed=read_signed_headers(request.headers),
            now_ms=now_ms(),
        )
        messages = body.get("messages") if isinstance(body, dict) else None
        if caller.kind != "federated" or not isinstance(messages, list):
            raise BadRequest('a push is {"messages": [...]} from another community\'s bridge')
        community = self.bridge.view.community_of(caller.identity)
        taken = await self.bridge.take_messages(community or "", messages)
        return json_response({"taken": taken, "of": len(messages)})

    async def carry(self, request: web.Request) -> web.StreamResponse:
        """A member's request for a node of a federated community, carried through the
        relay path to it; answered with that node's answer (status and body)."""
        body = loads(await request.read())
        self._member(request, body)
        if self.carrier is None:
            raise BadRequest("this node carries no requests")
        to = body.get("to") if isinstance(body, dict) else None
        method, path = body.get("method"), body.get("path")
        headers, inner = body.get("headers") or {}, body.get("body")
        if not (
            isinstance(to, str)
            and isinstance(method, str)
            and isinstance(path, str)
            and isinstance(headers, dict)
            and all(isinstance(v, str) for v in headers.values())
        ):
            raise BadRequest("a carry is {to, method, path, headers, body}")
        data = None if inner is None else orjson.dumps(inner)
        status, answer = await self.carrier.request(to, method, path, headers, data)
        return web.Response(status=status, body=answer, content_type="application/json")
