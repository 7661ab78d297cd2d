"""One batch of bytes to many loopback TCP sockets: ``write`` against ``sendfile`` from
one memory file (what fan-out does with a commit's joined batch, ``SharedBytes``).

The same bytes go to ``--subs`` sockets per round, rounds alternating between a plain
``os.write`` to each socket and ``SharedBytes`` with ``write_through`` (the file made at the
4th socket, its cost included). The other ends are read by a separate process, so this
thread's CPU (``time.thread_time``: user and kernel) is the sender's alone, the kernel's
loopback receive work done inside the send included. Prints the median CPU µs per socket
per round for each way and each size.

Run: python -m bench.bench_shared_writes [--subs 100 --sizes 16000,32000,54000 --rounds 300]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import select
import socket
import statistics
import time
from typing import Any

from bench.common import save
from hearthnet.transport.direct import SharedBytes, write_through


def _read_all(port: int, subs: int, stop: Any) -> None:
    """The subscribers' side: connect ``subs`` sockets and read until ``stop`` is set."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(subs)]
    poller = select.epoll()
    by_fd = {}
    for sock in socks:
        sock.setblocking(False)
        poller.register(sock.fileno(), select.EPOLLIN)
        by_fd[sock.fileno()] = sock
    buf = bytearray(1 << 18)
    deadline = time.monotonic() + 600
    while not stop.is_set() and time.monotonic() < deadline:
        for fd, _ in poller.poll(0.1):
            try:
                while by_fd[fd].recv_into(buf):
                    pass
            except BlockingIOError:
                pass
    for sock in socks:
        sock.close()


async def measure(subs: int, sizes: list[int], rounds: int) -> list[dict[str, Any]]:
    """Median CPU µs per socket per round, plain writes and shared-file sends alternated."""
    loop = asyncio.get_running_loop()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(subs)
    stop = multiprocessing.Event()
    reader = multiprocessing.Process(
        target=_read_all, args=(listener.getsockname()[1], subs, stop), daemon=True
    )
    reader.start()
    transports: list[asyncio.Transport] = []
    try:
        for _ in range(subs):
            sock, _ = listener.accept()
            sock.setblocking(False)
            transport, _ = await loop.create_connection(asyncio.Protocol, sock=sock)
            transport.set_write_buffer_limits(high=1 << 20)
            transports.append(transport)
        fds = [t.get_extra_info("socket").fileno() for t in transports]
        out = []
        for size in sizes:
            took: dict[str, list[float]] = {"write": [], "sendfile": []}
            for i in range(rounds):
                data = os.urandom(size)
                start = time.thread_time()
                if i % 2 == 0:
                    for transport, fd in zip(transports, fds, strict=True):
                        write_through(transport, fd, data)
                    took["write"].append(time.thread_time() - start)
                else:
                    shared = SharedBytes(min_bytes=0)
                    shared.offer(data)
                    for transport, fd in zip(transports, fds, strict=True):
                        write_through(transport, fd, data, shared.file(data))
                    shared.close()
                    took["sendfile"].append(time.thread_time() - start)
                await asyncio.sleep(0.004)  # the reader empties the sockets
            row = {
                "subs": subs,
                "bytes": size,
                **{
                    f"{way}_us_per_socket": round(statistics.median(t) / subs * 1e6, 2)
                    for way, t in took.items()
                },
            }
            print(row)
            out.append(row)
        return out
    finally:
        for transport in transports:
            transport.abort()
        stop.set()
        reader.join(10)
        listener.close()


def main(argv: list[str] | None = None) -> None:
    """Run and save bench/results/shared_writes.json."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    p.add_argument("--subs", type=int, default=100, help="sockets")
    p.add_argument("--sizes", default="16000,32000,54000", help="bytes per batch")
    p.add_argument("--rounds", type=int, default=300, help="rounds per size (alternated)")
    p.add_argument("--name", default="shared_writes")
    opts = p.parse_args(argv)
    sizes = [int(s) for s in opts.sizes.split(",")]
    rows = asyncio.run(measure(opts.subs, sizes, opts.rounds))
    save(opts.name, {"rows": rows})


if __name__ == "__main__":
    main()
