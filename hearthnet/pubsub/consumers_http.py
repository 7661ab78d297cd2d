"""Durable consumers over HTTP (spec §6.8, an extension): list them and delete one.

``GET /pubsub/v1/consumers`` lists the caller's consumers; ``DELETE
/pubsub/v1/consumers/{name}`` forgets one (its cursor, and what retention kept for it).
The node's own identity (the operator's CLI) sees every identity's consumers and deletes
any with ``?owner=``; anyone else only their own, so an abandoned consumer of a token
client can be cleared without its token.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_right
from collections.abc import Callable
from typing import Any

from aiohttp import web

from hearthnet.caller import Caller
from hearthnet.errors import BadRequest, Forbidden
from hearthnet.pubsub.consumers import DurableConsumers
from hearthnet.pubsub.consumerstate import ConsumerRecord
from hearthnet.pubsub.logread import TopicMask
from hearthnet.pubsub.topics import TopicPattern
from hearthnet.pubsub.ws import PubSubDeps
from hearthnet.shapes import Shape
from hearthnet.transport.server import json_response

CONSUMERS_QUERY = Shape.query("consumers query", ("owner", "token"))
# ``pending`` is counted from the indexes (bisections in each topic's seqs, or a scan of
# the seq columns at C speed where the log has too many topics to list a wildcard's); the
# listing lets other work run between every few consumers.
YIELD_EVERY = 16


def owner_asked(caller: Caller, asked: str | None, *, listing: bool) -> str | None:
    """Whose consumers ``caller`` reaches: its own, or, for the node's own identity,
    ``asked`` (every identity's when listing without ``owner``).

    Raises:
        Forbidden: ``owner`` names another identity and the caller is not the node.
    """
    if asked is None or asked == "":
        return None if caller.is_self and listing else caller.owner
    if asked != caller.owner and not caller.is_self:
        raise Forbidden("only the node's own identity reaches other identities' consumers")
    return asked


def describe(
    consumers: DurableConsumers, record: ConsumerRecord, masks: dict[tuple[str, ...], TopicMask]
) -> dict[str, Any]:
    """One consumer as the listing shows it: ``pending`` counts its matches after its
    cursor (those past their ttl included), from the indexes (``masks``: the topic masks
    of the listing's wildcards, made once for all its consumers)."""
    log, after, head = consumers.log, record.cursor, consumers.log.head_seq
    patterns = [TopicPattern.parse(p) for p in record.patterns]
    lists = log.reader.topic_lists(patterns)
    if lists is not None:
        pending = sum(bisect_right(s, head) - bisect_right(s, after) for s in lists)
    else:  # too many topics to list a wildcard's: the seq columns, by topic number
        mask = masks[record.patterns] = log.reader.topic_mask(patterns, masks.get(record.patterns))
        pending = log.index.cols.count_of(mask.bits, after, head)
    lost = record.lost
    return {
        "owner": record.identity,
        "name": record.name,
        "topics": list(record.patterns),
        "cursor": record.cursor,
        "pending": pending,
        "held": consumers.is_held(record),
        "lost": None if lost is None else {"from_seq": lost[0], "to_seq": lost[1]},
    }


class ConsumersHttp:
    """``/pubsub/v1/consumers``."""

    def __init__(self, deps: PubSubDeps, caller: Callable[[web.Request, Any], Caller]) -> None:
        self.deps = deps
        self.caller = caller  # the pub/sub endpoints' authentication

    def routes(self) -> list[web.RouteDef]:
        """The routes."""
        return [
            web.get("/pubsub/v1/consumers", self.listing),
            web.delete("/pubsub/v1/consumers/{name:.+}", self.delete),
        ]

    async def listing(self, request: web.Request) -> web.Response:
        """``GET /pubsub/v1/consumers[?owner=ID]``."""
        CONSUMERS_QUERY.check(request.query)
        caller = self.caller(request, None)
        owner = owner_asked(caller, request.query.get("owner"), listing=True)
        consumers = self.deps.service.consumers
        head = consumers.log.head_seq
        rows, masks = [], dict[tuple[str, ...], TopicMask]()
        for i, record in enumerate(consumers.listed(owner)):
            if i % YIELD_EVERY == YIELD_EVERY - 1:
                await asyncio.sleep(0)  # a node's whole listing: up to max_consumers
            rows.append(describe(consumers, record, masks))
        return json_response({"consumers": rows, "head_seq": head})

    async def delete(self, request: web.Request) -> web.Response:
        """``DELETE /pubsub/v1/consumers/{name}[?owner=ID]``."""
        CONSUMERS_QUERY.check(request.query)
        caller = self.caller(request, None)
        name = request.match_info["name"]
        if not 1 <= len(name) <= 64:
            raise BadRequest("a consumer name is 1..64 characters")
        owner = owner_asked(caller, request.query.get("owner"), listing=False)
        assert owner is not None
        service = self.deps.service
        record = await service.consumers.delete(owner, name, service.detach)
        return json_response({"deleted": {"owner": record.identity, "name": record.name}})
