"""Every HTTP route the node serves (spec §2, §3, §6, §7, §8, §9), gathered from the
endpoint classes of each part; :class:`hearthnet.node.Node` builds its server on them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from hearthnet.console.http import ConsoleEndpoints
from hearthnet.federation.http import FederationHttp
from hearthnet.mesh.http import MeshHttp
from hearthnet.pubsub.http import PubSubHttp
from hearthnet.transport.bus_http import BusEndpointDeps, BusHttpEndpoints
from hearthnet.transport.bus_ws import BusWebSocketEndpoint
from hearthnet.transport.status import StatusEndpoints

if TYPE_CHECKING:
    from hearthnet.node import Node


def node_routes(
    node: Node, deps: BusEndpointDeps, pubsub_http: PubSubHttp, mesh_http: MeshHttp
) -> list[web.RouteDef]:
    """The bus, pub/sub, mesh, federation, status and console routes of ``node``."""
    return [
        *BusHttpEndpoints(deps).routes(),
        *BusWebSocketEndpoint(deps).routes(),
        *pubsub_http.routes(),
        *mesh_http.routes(),
        *FederationHttp(
            node.federation,
            node.federation_bridge,
            node.authenticator,
            carrier=node.federation_carrier,
        ).routes(),
        *StatusEndpoints(node).routes(),
        *ConsoleEndpoints(
            node,
            keys=node.keys,
            authenticator=node.authenticator,
            membership=node.membership,
            pubsub=node.pubsub,
            mesh=node.mesh,
            rates=node.topic_rates,
            data_dir=node.data_dir,
        ).routes(),
    ]
