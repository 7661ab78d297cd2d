"""Mesh endpoints: ``/mesh/v1/peer`` (peer links), ``/mesh/v1/peers`` (status),
``/mesh/v1/membership`` (submit signed membership records) and ``/mesh/v1/join``
(redeem an invite)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from hearthnet.auth import Authenticator
from hearthnet.clock import now_ms
from hearthnet.community import MembershipRecord
from hearthnet.errors import BadRequest, InternalError
from hearthnet.identity import KeyPair
from hearthnet.mesh.admission import admit
from hearthnet.mesh.service import Mesh
from hearthnet.transport.codec import loads
from hearthnet.transport.headers import read_signed_headers
from hearthnet.transport.server import json_response

MAX_RECORDS_PER_REQUEST = 1000


class MeshHttp:
    """HTTP side of the mesh."""

    def __init__(
        self,
        mesh: Mesh,
        authenticator: Authenticator,
        keys: KeyPair,
        apply_record: Callable[[MembershipRecord], bool],
    ) -> None:
        self.mesh = mesh
        self.authenticator = authenticator
        self.keys = keys
        self.apply_record = apply_record

    def routes(self) -> list[web.RouteDef]:
        """The routes."""
        return [
            web.get("/mesh/v1/peer", self.mesh.accept),
            web.get("/mesh/v1/peers", self.peers),
            web.post("/mesh/v1/membership", self.membership),
            web.post("/mesh/v1/join", self.join),
        ]

    async def peers(self, request: web.Request) -> web.Response:
        """Linked peers and known addresses (members only)."""
        self.authenticator.authenticate_headers(
            method="GET",
            path=request.raw_path,
            body=None,
            signed=read_signed_headers(request.headers),
            now_ms=now_ms(),
        )
        return json_response(
            {"node": self.keys.node_id, "url": self.mesh.url, "peers": self.mesh.peers_status()}
        )

    async def membership(self, request: web.Request) -> web.Response:
        """Submit signed membership records (a revocation from ``hearthnet community revoke``).

        Records authenticate themselves: the fold ignores any whose signer lacks the level,
        so no other credential is needed.
        """
        body = loads(await request.read())
        records = body.get("records") if isinstance(body, dict) else None
        if not isinstance(records, list) or len(records) > MAX_RECORDS_PER_REQUEST:
            raise BadRequest(
                f'the body is {{"records": [...]}} with at most {MAX_RECORDS_PER_REQUEST}'
            )
        parsed = [MembershipRecord.parse(r) for r in records]
        applied = sum(1 for record in parsed if self.apply_record(record))
        return json_response({"applied": applied, "community": self.authenticator.community_id})

    async def join(self, request: web.Request) -> web.Response:
        """Redeem an invite: add the joining node and hand it the community's records."""
        body: Any = loads(await request.read())
        record = admit(self.keys, self.authenticator.membership, body, now_ms())
        if not self.apply_record(record):
            raise InternalError("the admitted member could not be recorded")
        records = [r.to_json() for r in self.authenticator.membership.records.values()]
        return json_response(
            {
                "community": self.authenticator.community_id,
                "records": records,
                "bootstrap": [self.mesh.url],
            }
        )
