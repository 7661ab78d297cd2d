"""Mesh-health analysis of exported heartbeat logs (spec §7.5, §10).

The package splits into a pure-Python side that imports no Spark (``params``,
``errors``, ``report``, ``cli``, and the generator ``synth`` with
``synth_model`` and ``synth_export``) and the DataFrame pipeline (``schema``,
``exports``, ``timeline``, ``quantiles``, ``links``, ``availability``,
``partitions``, ``relays``, ``clock``, ``propagation``, orchestrated by
``mesh_health``). ``hearthnet mesh health`` calls
:func:`spark_federation.cli.main`; ``spark-submit spark_federation/mesh_health.py``
runs the same job on a cluster. Definitions: docs/mesh-health.md.
"""
