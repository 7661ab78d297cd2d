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

Bytes that many sockets get in one loop turn (a committed batch's frames, the same for every
subscriber) can be sent from a memory file (:class:`SharedBytes`) with ``sendfile``: the
sockets then take references to the file's pages instead of each copying the bytes into
their own buffers. Over loopback, ~54 KB to each of 100 sockets, a send cost 4-13 % less
CPU than a write, to each of 1,000 ~18 % less; the file costs ~40 µs to make, so only
large bytes going to several sockets are worth it.
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


def write_through(transport: SocketTransport, fd: int, data: bytes, source: int = -1) -> None:
    """Write ``data`` as ``transport.write`` would, but with the GIL released for the send
    when the transport has nothing queued (``fd`` from :func:`plain_socket_fd`; -1: always
    the transport). ``source``: a file holding exactly ``data`` from offset 0
    (:meth:`SharedBytes.file`), sent from with ``sendfile``; -1: none."""
    if fd < 0 or transport.get_write_buffer_size():
        transport.write(data)
        return
    try:
        sent = os.write(fd, data) if source < 0 else os.sendfile(fd, source, 0, len(data))
    except BlockingIOError:
        sent = 0
    except OSError:
        transport.write(data)  # the transport sees the same error and closes as it does
        return
    if sent < len(data):
        transport.write(data[sent:])


class SharedBytes:
    """Bytes objects that several sockets get in this loop turn, each sent from one memory
    file (``memfd``), made at the ``min_uses``-th socket that asks (the first ones are
    written: bytes only a few sockets get are not worth a file) and closed by
    :meth:`close`.

    The file's pages are never written again once made: a socket's queue may still refer to
    them after :meth:`close` (closing drops the file's own reference, not the pages).
    """

    __slots__ = ("_files", "min_bytes", "min_uses")

    def __init__(self, min_bytes: int = 40 * 1024, min_uses: int = 4) -> None:
        # Smaller bytes are written: over loopback to 100 sockets a send from a file cost
        # about what a write does at 24-32 KB (-6 to +7 % between runs), 4-13 % less at
        # 54 KB (bench/bench_shared_writes.py).
        self.min_bytes = min_bytes
        self.min_uses = min_uses
        # id(data) -> (data, its file, sockets that asked); ``data`` is held so its id stays
        # its own until close. File -1: not made yet; _NO_FILE: could not be made.
        self._files: dict[int, tuple[bytes, int, int]] = {}

    def __bool__(self) -> bool:
        return bool(self._files)

    def offer(self, data: bytes) -> None:
        """``data`` may go to several sockets before :meth:`close`."""
        if len(data) >= self.min_bytes and id(data) not in self._files:
            self._files[id(data)] = (data, -1, 0)

    def file(self, data: bytes) -> int:
        """A file holding ``data`` from offset 0 to send it from, or -1: write it (not
        offered, too few sockets asked so far, or no memory file could be made)."""
        entry = self._files.get(id(data))
        if entry is None or entry[0] is not data:
            return -1
        fd = entry[1]
        if fd == -1:
            uses = entry[2] + 1
            if uses >= self.min_uses:
                fd = _memory_file(data)
                if fd < 0:
                    fd = _NO_FILE
            self._files[id(data)] = (data, fd, uses)
        return fd if fd >= 0 else -1

    def close(self) -> None:
        """Close every file (the sockets keep the pages they still need)."""
        for _, fd, _ in self._files.values():
            if fd >= 0:
                os.close(fd)
        self._files.clear()


_NO_FILE = -2


def _memory_file(data: bytes) -> int:
    """A memory file holding ``data``, or -1 when none can be made."""
    try:
        fd = os.memfd_create("hearthnet-fanout", os.MFD_CLOEXEC)
    except (AttributeError, OSError):  # not Linux, or out of descriptors: write instead
        return -1
    try:
        view = memoryview(data)
        done = 0
        while done < len(data):
            done += os.write(fd, view[done:])
    except OSError:
        os.close(fd)
        return -1
    return fd
