"""The node's listening socket: shared with the direct upgrade's hole punching (spec §8),
never with another node."""

from __future__ import annotations

import socket

BACKLOG = 1024


def open_listener(host: str, port: int) -> socket.socket:
    """A non-blocking socket listening on ``host:port`` (0: a free port), with
    ``SO_REUSEPORT`` so that the direct upgrade can open TCP from the same port.

    Raises:
        OSError: the port is taken, or the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    if port:
        _refuse_a_taken_port(family, host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def _refuse_a_taken_port(family: socket.AddressFamily, host: str, port: int) -> None:
    """Bind ``port`` once without ``SO_REUSEPORT``: with it, a second node of the same
    user would bind a port another node listens on and share its connections. A socket
    listening there (with or without the option) makes this bind fail with
    ``EADDRINUSE``; connections in TIME_WAIT do not (``SO_REUSEADDR``)."""
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
