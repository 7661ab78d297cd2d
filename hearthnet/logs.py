"""Structured JSON logs (spec §9): one object per line on stderr.

Fields: ``ts``, ``level``, ``logger``, ``msg``, plus ``node``, ``peer``,
``request_id``, ``topic`` when a call site passes them in ``extra``.
"""

from __future__ import annotations

import logging
import sys

import orjson

CONTEXT_FIELDS = ("node", "peer", "request_id", "topic", "capability", "code")
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class JsonFormatter(logging.Formatter):
    """Formats records as one JSON object."""

    def __init__(self, node: str | None = None) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        """Render one record."""
        out: dict[str, object] = {
            "ts": int(record.created * 1000),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if self.node:
            out["node"] = self.node
        for name in CONTEXT_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def configure(level: str, node: str | None = None) -> None:
    """Send the ``hearthnet`` loggers to stderr as JSON at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(node))
    root = logging.getLogger("hearthnet")
    root.handlers[:] = [handler]
    root.setLevel(LEVELS.get(level.lower(), logging.INFO))
    root.propagate = False
