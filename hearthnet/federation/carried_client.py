"""A client of a node reached through relays (spec §8): the CLI's
:class:`~hearthnet.client.Client` over :class:`~hearthnet.federation.carrier.CarriedHttp`.

Its own module so that a node loads :mod:`hearthnet.client` only when it first carries a
request, not at start.
"""

from __future__ import annotations

from typing import Any

import orjson

from hearthnet.client import Client
from hearthnet.federation.carrier import CARRIED_URL, CarriedHttp, Carry
from hearthnet.identity import KeyPair

CARRY_PATH = "/mesh/v1/federation/carry"


class CarriedClient(Client):
    """A :class:`~hearthnet.client.Client` of node ``to`` whose requests are carried
    through relays (:class:`CarriedHttp`)."""

    def __init__(self, to: str, carry: Carry, *, keys: KeyPair, community: str) -> None:
        http = CarriedHttp(to, carry, keys=keys, community=community)
        super().__init__(CARRIED_URL, keys=keys, community=community, http=http)
        self.to = to


def carried_by(outer: Client, to: str, *, keys: KeyPair, community: str) -> CarriedClient:
    """A client of node ``to`` of a federated community, signing as ``keys`` (a member of
    ``community``), whose requests ``outer``'s node carries to it through a relay
    (``POST /mesh/v1/federation/carry``, docs/federation.md "Through a relay")."""

    async def carry(
        method: str, path: str, headers: dict[str, str], body: bytes | None
    ) -> tuple[int, bytes]:
        payload: dict[str, Any] = {"to": to, "method": method, "path": path, "headers": headers}
        payload["body"] = orjson.loads(body) if body else None
        signed = await outer.signed_headers("POST", CARRY_PATH, payload)
        async with outer.session.post(
            outer.url + CARRY_PATH,
            data=orjson.dumps(payload),
            headers={**signed, "Content-Type": "application/json"},
        ) as resp:
            return resp.status, await resp.read()

    return CarriedClient(to, carry, keys=keys, community=community)
