"""Mesh endpoints: ``/mesh/v1/peer`` (peer links), ``/mesh/v1/peers`` (status),
``/mesh/v1/peers/forget`` (the operator forgets known addresses),
``/mesh/v1/invite-urls`` (what an invite made here names), ``/mesh/v1/membership``
(submit signed membership records), ``/mesh/v1/join`` (redeem an invite) and, on a
relay, ``/mesh/v1/relay/join`` (carry a join to an inviter behind NAT, spec §8)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from hearthnet.auth import Authenticator
from hearthnet.caller import Caller
from hearthnet.clock import now_ms
from hearthnet.community import MembershipRecord
from hearthnet.console.access import is_console_token
from hearthnet.errors import (
    BadRequest,
    Forbidden,
    InternalError,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
    Unavailable,
    error_from_wire,
)
from hearthnet.identity import KeyPair
from hearthnet.membership import Admission, Source, split_submitted
from hearthnet.mesh.addresses import forget_target
from hearthnet.mesh.admission import (
    RELAY_JOIN_PATH,
    admit,
    check_join_request,
    sign_join_answer,
)
from hearthnet.mesh.forget import FORGET_PATH, forget
from hearthnet.mesh.relay_frames import MAX_JOIN_BYTES
from hearthnet.mesh.relayed_link import is_relayed
from hearthnet.mesh.service import Mesh
from hearthnet.ratelimit import RateLimiter
from hearthnet.transport.codec import loads
from hearthnet.transport.headers import read_signed_headers
from hearthnet.transport.server import json_response

MEMBERSHIP_CHECKS_PER_S = 500  # submitted records' signatures checked per address per second
SubmitRecords = Callable[[list[MembershipRecord], Source, str | None], Awaitable[Admission]]


class MeshHttp:
    """HTTP side of the mesh."""

    def __init__(
        self,
        mesh: Mesh,
        authenticator: Authenticator,
        keys: KeyPair,
        submit_records: SubmitRecords,
    ) -> None:
        self.mesh = mesh
        self.authenticator = authenticator
        self.keys = keys
        self.submit_records = submit_records
        # signatures of submitted records checked per address (spec §1.5); two batches of
        # the largest size fit at once
        self.checks = RateLimiter(
            MEMBERSHIP_CHECKS_PER_S,
            burst=2 * authenticator.membership.caps.per_request,
            max_keys=4096,
        )
        # a join's record is signed next on this node's chain (spec §1.5) and admitted
        # before the next join signs, or submitted records (which the CLI may have signed
        # with this node's key) are admitted: two at once would take the same place
        self._own_chain = asyncio.Lock()

    def routes(self) -> list[web.RouteDef]:
        """The routes."""
        return [
            web.get("/mesh/v1/peer", self.mesh.accept),
            web.get("/mesh/v1/peers", self.peers),
            web.post(FORGET_PATH, self.forget),
            web.get("/mesh/v1/invite-urls", self.invite_urls),
            web.post("/mesh/v1/membership", self.membership),
            web.post("/mesh/v1/join", self.join),
            web.post(RELAY_JOIN_PATH, self.relay_join),
        ]

    def _signed_get(self, request: web.Request) -> Caller:
        """Who sent this signed ``GET`` (raises as the authenticator does)."""
        return self.authenticator.authenticate_headers(
            method="GET",
            path=request.raw_path,
            body=None,
            signed=read_signed_headers(request.headers),
            now_ms=now_ms(),
        )

    async def peers(self, request: web.Request) -> web.Response:
        """Linked peers and known addresses (members only, and console tokens: the
        console shows them). A token client, or a node of a federated community, is
        ``forbidden``: the addresses of a community's nodes are not in any grant."""
        caller = self._signed_get(request)
        if caller.token is not None and not is_console_token(caller.token):
            raise Forbidden(
                "the peer list is for members of this community: run hearthnet peers with"
                " the --data-dir of a member's node (a token or a federated community's"
                " node may not read it)"
            )
        return json_response(
            {"node": self.keys.node_id, "url": self.mesh.url, "peers": self.mesh.peers_status()}
        )

    async def forget(self, request: web.Request) -> web.Response:
        """``{"target": NODEID|ADDRESS}``: forget those known addresses now (no longer
        dialled, saved at once); only the node's own key (``hearthnet peers forget`` with
        its --data-dir) may. The answer is :func:`~hearthnet.mesh.forget.forget`'s."""
        body: Any = loads(await request.read())
        caller = self.authenticator.authenticate_headers(
            method="POST",
            path=request.raw_path,
            body=body,
            signed=read_signed_headers(request.headers),
            now_ms=now_ms(),
        )
        if not caller.is_self:
            raise Forbidden(
                "only the node's own key forgets its peer addresses: run hearthnet peers"
                " forget with the node's --data-dir"
            )
        if not isinstance(body, dict) or not isinstance(body.get("target"), str):
            raise BadRequest('the body is {"target": NodeID or http://host:port}')
        mesh = self.mesh
        answer = forget(
            mesh.book,
            forget_target(body["target"]),
            links={n: link.address for n, link in mesh.links.items()},
            configured=(*mesh.config.peers, *mesh.config.relay_urls, *mesh.config.relay_peers),
        )
        mesh.book.save()  # on the loop, as the housekeeping tick saves it
        return json_response(answer)

    async def invite_urls(self, request: web.Request) -> web.Response:
        """What ``hearthnet community invite`` names by default, as this node runs now
        (members only: the command signs with the node's key): ``bootstrap``, the mesh URL
        it advertises, and ``relays``, those a new member attaches to (spec §8): the relays
        it attaches to (given at its start, or brought by its own invite; not those it
        federates with), else itself when it is a relay, else none. Read from the running
        node, not from a configuration file that may have changed since it started, or
        that flags overrode."""
        caller = self._signed_get(request)
        if caller.kind == "federated" or caller.token is not None:
            raise Forbidden(
                "invite URLs are for members of this community: run hearthnet community"
                " invite with the --data-dir of a member's node"
            )
        relaying = self.mesh.relaying
        relays = list(relaying.relay_urls)
        if not relays and relaying.relay is not None:
            relays = [self.mesh.url]
        return json_response(
            {
                "node": self.keys.node_id,
                "community": self.authenticator.community_id,
                "bootstrap": [self.mesh.url],
                "relays": relays,
            }
        )

    async def membership(self, request: web.Request) -> web.Response:
        """Submit signed membership records (``hearthnet community revoke``, ``rules``...).

        Records authenticate themselves, so no other credential is needed; but only
        records of members that the fold applies are stored (spec §1.5). A request that
        stores nothing is answered with the first refusal (``unauthorized`` for a
        stranger, ``forbidden`` for a record its signer may not sign, ``revoked``...);
        otherwise ``{"applied": n, "refused": [{"id", "error", "message"}]}``.
        """
        body = loads(await request.read())
        records = body.get("records") if isinstance(body, dict) else None
        membership = self.authenticator.membership
        cap = membership.caps.per_request
        if not isinstance(records, list):
            raise BadRequest('the body is {"records": [...]}')
        if len(records) > cap:
            raise PayloadTooLarge(f"at most {cap} membership records at a time")
        # spec §1.5: records no member signed, nor anyone a member adds in this batch, are
        # refused before a signature is checked; what is left is checked within a budget
        # per address, so nobody makes the node verify signatures without end
        to_check, strangers = split_submitted(
            records, membership.community_id, membership.known, membership.records
        )
        stranger = Unauthorized("the signer is not a member of the community")
        if strangers and not to_check:
            raise stranger
        self.checks.check(request.remote or "", time.monotonic(), len(to_check))
        parsed = await asyncio.to_thread(lambda: [MembershipRecord.parse(r) for r in to_check])
        async with self._own_chain:
            admission = await self.submit_records(parsed, Source.SUBMIT, None)
        error = admission.first_error()
        if not admission.accepted and error is not None:
            raise error
        refused = [(r.id, e) for r, e in admission.refused]
        refused += [(str(r.get("id", "")), stranger) for r in strangers]
        return json_response(
            {
                "applied": len(admission.accepted),
                "refused": [{"id": i, "error": e.code, "message": e.message} for i, e in refused],
                "community": self.authenticator.community_id,
            }
        )

    async def join(self, request: web.Request) -> web.Response:
        """Redeem an invite: add the joining node and hand it the community's records."""
        body: Any = loads(await request.read())
        return json_response(await self.admit_join(body))

    async def admit_join(self, body: Any) -> dict[str, Any]:
        """Admit a join request (over HTTP, or carried by a relay, spec §8): the answer
        with the community's records.

        Raises: what :func:`admit` raises; the fold's refusal of the record.
        """
        async with self._own_chain:
            record = admit(self.keys, self.authenticator.membership, body, now_ms())
            admission = await self.submit_records([record], Source.SUBMIT, None)
        if not admission.accepted:
            raise admission.first_error() or InternalError("the member could not be recorded")
        records = [r.to_json() for r in self.authenticator.membership.records.values()]
        answer = {
            "community": self.authenticator.community_id,
            "records": records,
            "bootstrap": [self.mesh.url],
        }
        # spec §8: signed for this join, so a relay carrying it can change nothing in it
        return sign_join_answer(self.keys, answer, record)

    async def relay_join(self, request: web.Request) -> web.Response:
        """On a relay: carry a not-yet-member's join to the inviter attached here (spec §8,
        ``--join`` when the inviter is behind NAT). The body is ``{to: inviter NodeID,
        request: <the join request>}``; the relay checks the request as far as any member
        can (the invite's and the request's signatures, community, expiry, unused
        invite, ``to`` being the inviter) before one ``join_via`` frame goes to the
        inviter over its direct link, and hands back the inviter's answer."""
        relay = self.mesh.relaying.relay
        if relay is None:
            raise NotFound("this node is not a relay")
        if request.content_length is None or request.content_length > MAX_JOIN_BYTES:
            raise PayloadTooLarge(f"a relayed join is at most {MAX_JOIN_BYTES} bytes")
        body: Any = loads(await request.read())
        if not isinstance(body, dict) or set(body) != {"to", "request"}:
            raise BadRequest('the body is {"to": inviter NodeID, "request": join request}')
        invite = check_join_request(self.authenticator.membership, body["request"], now_ms())
        if body["to"] != invite.inviter:
            raise BadRequest("a join goes to the node that signed its invite")
        if invite.inviter == self.keys.node_id:  # the relay invited: it admits it itself
            return json_response(await self.admit_join(body["request"]))
        link = self.mesh.links.get(invite.inviter)
        if link is None or is_relayed(link):
            raise Unavailable("the inviter is not linked to this relay", retry_after_ms=5000)
        raw = await relay.forward_join(link, json.dumps(body["request"]).encode())
        try:
            answer = json.loads(raw)
        except ValueError as exc:
            raise InternalError("the inviter's answer is not JSON") from exc
        if not isinstance(answer, dict):
            raise InternalError("the inviter's answer is not an object")
        if "error" in answer:
            raise error_from_wire(answer)
        return json_response(answer)
