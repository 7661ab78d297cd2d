"""Loads :mod:`bench.lone_trace` into node processes when ``HN_LONE_TRACE`` is set (put
this directory and the tree on ``PYTHONPATH``; see that module)."""

import os

if os.environ.get("HN_LONE_TRACE"):
    from bench.lone_trace import install_from_env

    install_from_env()
