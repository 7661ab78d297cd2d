"""The mesh (spec §7, §8): pure cores, and the asyncio glue that feeds them.

Pure: :mod:`~hearthnet.mesh.protocol` (codec, handshake, link states),
:mod:`~hearthnet.mesh.frames` (typed frames), :mod:`~hearthnet.mesh.actions`,
:mod:`~hearthnet.mesh.gossip`, :mod:`~hearthnet.mesh.flood`, :mod:`~hearthnet.mesh.heartbeat`,
:mod:`~hearthnet.mesh.announce`, :mod:`~hearthnet.mesh.addresses`.

Glue: :mod:`~hearthnet.mesh.dialer` (accept, dial, TLS), :mod:`~hearthnet.mesh.links` (one
WebSocket), :mod:`~hearthnet.mesh.routing` (NodeID -> path), :mod:`~hearthnet.mesh.traffic`
(frames through the cores), :mod:`~hearthnet.mesh.health`, :mod:`~hearthnet.mesh.remote`,
:mod:`~hearthnet.mesh.discovery`, and :mod:`~hearthnet.mesh.service` (the facade).
"""
