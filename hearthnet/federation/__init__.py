"""Community federation (spec §8): agreements between two communities, what they grant,
and the bridge that carries granted topics and calls across. See docs/federation.md.

- :mod:`~hearthnet.federation.agreement`: the signed records (pure);
- :mod:`~hearthnet.federation.view`: what a node holds and every decision (pure);
- :mod:`~hearthnet.federation.store`: SQLite;
- :mod:`~hearthnet.federation.service` and :mod:`~hearthnet.federation.http`: the glue.
- :mod:`~hearthnet.federation.carrier`: the bridge's requests carried through relays
  (links with the other community's nodes: :mod:`hearthnet.mesh.relay_federated`).
"""
