"""A client of a node reached through relays (spec §8): the CLI's
:class:`~hearthnet.client.Client` over :class:`~hearthnet.federation.carrier.CarriedHttp`.

Its own module so that a node loads :mod:`hearthnet.client` only when it first carries a
request, not at start.
"""

from __future__ import annotations

from hearthnet.client import Client
from hearthnet.federation.carrier import CARRIED_URL, CarriedHttp, Carry
from hearthnet.identity import KeyPair


class CarriedClient(Client):
    """A :class:`~hearthnet.client.Client` of node ``to`` whose requests are carried
    through relays (:class:`CarriedHttp`)."""

    def __init__(self, to: str, carry: Carry, *, keys: KeyPair, community: str) -> None:
        http = CarriedHttp(to, carry, keys=keys, community=community)
        super().__init__(CARRIED_URL, keys=keys, community=community, http=http)
        self.to = to
