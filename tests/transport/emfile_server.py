"""A bare :class:`HttpServer` in a process that has used up its file descriptors, for
``test_emfile.py``: prints its port once every descriptor is taken, gives them back
when a line arrives on stdin (printing ``released``), and stops at the end of stdin."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import sys

from aiohttp import web

from hearthnet.metrics import MetricsRegistry
from hearthnet.transport.server import HttpServer, TransportMetrics, json_response

NOFILE = 64


async def health(request: web.Request) -> web.Response:
    """Alive."""
    return json_response({"ok": True})


async def main() -> None:
    """Serve, hog the descriptors, release them on request."""
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(message)s")
    server = HttpServer(
        routes=[web.get("/health", health)],
        metrics=TransportMetrics.register(MetricsRegistry()),
        max_body_bytes=1024,
    )
    _, port = await server.start("127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    release = loop.run_in_executor(None, sys.stdin.readline)  # its thread, before the hog
    hog: list[int] = []
    while True:
        try:
            hog.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            break
    print(port, flush=True)
    await release
    for fd in hog:
        os.close(fd)
    print("released", flush=True)
    await loop.run_in_executor(None, sys.stdin.read)
    await server.close()


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))
    asyncio.run(main())
