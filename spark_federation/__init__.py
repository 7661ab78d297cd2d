"""Mesh-health analysis of exported heartbeat logs (spec §7.5, §10).

The package splits into a pure-Python side that imports no Spark (``params``,
``synth``, ``report``, ``cli``) and the DataFrame pipeline (``exports``,
``availability``, ``links``, ``partitions``, ``relays``, ``clock``,
``propagation``, ``mesh_health``). ``hearthnet mesh health`` calls
:func:`spark_federation.cli.main`; ``spark-submit spark_federation/mesh_health.py``
runs the same job on a cluster.
"""
