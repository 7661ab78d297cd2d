"""Fan-out writes straight into a plain TCP socket while its transport has nothing queued.

uvloop keeps the GIL for the whole ``send`` inside ``transport.write``. A fan-out write is
one batch of frames to one subscriber, often ~100 KB into a loopback socket, and on loopback
the kernel does the receiver's TCP work in that call too: with 100 subscribers a commit's
fan-out held the GIL for milliseconds, and the message log's writer thread (which signs and
commits the next batch) waited that long to start. ``os.write`` drops the GIL for the
syscall, so the next batch is signed while this one is being sent.

Only a plain TCP transport qualifies (never TLS: its socket carries ciphertext), and only
when the transport's own buffer is empty, so bytes still leave in the order they were
written. What the socket does not take goes to ``transport.write``, which queues it and
waits for the socket to drain as usual; an error is left to the transport to report.
"""

from __future__ import annotations

import os
import socket
from typing import Any, Protocol


class SocketTransport(Protocol):
    """What these functions use of an asyncio (or uvloop) transport."""

    def write(self, data: bytes) -> None:
        """Queue bytes."""

    def get_write_buffer_size(self) -> int:
        """Bytes queued and not yet sent."""

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """``socket``, ``ssl_object``, ``sslcontext``..."""


def plain_socket_fd(transport: SocketTransport) -> int:
    """The file descriptor of ``transport``'s TCP socket, or -1 when writes must go through
    the transport (TLS, not a stream socket, or no socket at all)."""
    if transport.get_extra_info("ssl_object") is not None:
        return -1
    if transport.get_extra_info("sslcontext") is not None:
        return -1
    sock = transport.get_extra_info("socket")
    if sock is None or sock.type != socket.SOCK_STREAM:
        return -1
    return int(sock.fileno())


def write_through(transport: SocketTransport, fd: int, data: bytes) -> None:
    """Write ``data`` as ``transport.write`` would, but with the GIL released for the send
    when the transport has nothing queued (``fd`` from :func:`plain_socket_fd`; -1: always
    the transport)."""
    if fd < 0 or transport.get_write_buffer_size():
        transport.write(data)
        return
    try:
        sent = os.write(fd, data)
    except BlockingIOError:
        sent = 0
    except OSError:
        transport.write(data)  # the transport sees the same error and closes as it does
        return
    if sent < len(data):
        transport.write(data[sent:])
