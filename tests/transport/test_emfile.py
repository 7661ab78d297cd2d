"""Out of file descriptors (spec §2.5): accept-and-close with the spare descriptor, one
log line, and service again once descriptors are free; over loopback, in a process."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import orjson
import pytest


@pytest.fixture
def starved() -> Iterator[tuple[subprocess.Popen[str], int]]:
    """The server process of ``emfile_server.py`` with every descriptor taken; its port."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.transport.emfile_server"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield proc, int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait(timeout=10)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def get_health(port: int) -> tuple[int, dict[str, object]]:
    """``GET /health`` on a fresh connection, read until the server closes (5 s at most)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: n\r\nConnection: close\r\n\r\n")
        raw = b""
        while chunk := conn.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), orjson.loads(body)


def test_out_of_descriptors_refuses_at_once_and_recovers(
    starved: tuple[subprocess.Popen[str], int],
) -> None:
    """With no descriptor free, each connection gets 503 unavailable at once (not a wait in
    the backlog), the log says so once, and /health works when descriptors are back."""
    proc, port = starved
    refused = [get_health(port) for _ in range(5)]
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    proc.stdin.write("release\n")
    proc.stdin.flush()
    released = proc.stdout.readline().strip()
    served = get_health(port)
    proc.stdin.close()
    proc.wait(timeout=10)
    log_lines = [line for line in proc.stderr.read().splitlines() if "file descriptors" in line]
    assert ([(503, "unavailable")] * 5, "released", (200, {"ok": True}), 1) == (
        [(status, body["error"]) for status, body in refused],
        released,
        served,
        len(log_lines),
    )
