"""The mesh (spec §7): discovery now; peer links and gossip build on it.

- :mod:`hearthnet.mesh.announce`: the DNS-SD announcement and the table of peers seen (pure).
- :mod:`hearthnet.mesh.discovery`: zeroconf announce and browse (asyncio glue).
"""
