"""Loads :mod:`bench.p99_trace` into node processes when ``HN_P99_TRACE`` is set (put
this directory and the tree on ``PYTHONPATH``; see that module)."""

import os

if os.environ.get("HN_P99_TRACE"):
    from bench.p99_trace import install_from_env

    install_from_env()
