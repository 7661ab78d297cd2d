"""TCP through NAT, run inside lab namespaces: a rendezvous server and its clients.

Standard library only (it runs as a script under ``ip netns exec``); every step is bounded
in time. Output is one JSON object per line, for ``HostProcess.wait_for_json``.

- ``punch.py serve IP PORT [PORT ...]`` (on a public host): answers every client with
  the address it sees (``YOU ip port``); clients that name the same pair key are told
  each other's observed address (``PEER ip port``) at the same moment, as a relay will
  (spec §8, direct upgrade). Prints ``{"event": "listening"}``, then one ``seen`` per client.
- ``punch.py observe SERVER_IP PORT[,PORT ...] --local-port P``: from local port P,
  connects to each port in turn (keeping the earlier connections open, as a node keeps
  its relay link) and prints the public address the server saw: ``observed``.
- ``punch.py connect IP PORT [--within S]``: one plain connect(); prints ``connect`` with
  the result, ``connected`` or the error (``timeout``, ``ECONNREFUSED``, ``ENETUNREACH``...).
- ``punch.py punch SERVER_IP PORT --local-port P --pair KEY``: learns its own and the
  peer's public address from the server, then attempts a simultaneous open from P to the
  peer's public address (:func:`simultaneous_open`) and exchanges one line over it.
  Prints ``established`` (exit 0) or ``failed`` (exit 1).
"""

from __future__ import annotations

import argparse
import errno
import json
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

Address = tuple[str, int]

# Pause after a connect() that failed at once (a refusal, or the 4-tuple of an aborted
# attempt still in use) before the next SYN: without it such a failure is a busy loop.
RETRY_PAUSE_S = 0.1
# A line's wait: at 10 % loss a lost segment can need several retransmits (TCP's timer
# doubles from 0.2-1 s), more than 5 s once in a few hundred runs.
LINE_TIMEOUT_S = 15.0
MAX_LINE = 256


def reusable_socket(local_port: int | None = None) -> socket.socket:
    """A TCP socket with SO_REUSEADDR and SO_REUSEPORT, bound to ``local_port`` if given.

    Both options on every socket of the port: the link to the rendezvous server stays
    open while the punch socket binds the same port.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if local_port is not None:
        sock.bind(("0.0.0.0", local_port))
    return sock


@dataclass
class PunchOutcome:
    """What a simultaneous-open attempt did: the connected socket (or None) and why."""

    sock: socket.socket | None
    tries: int = 0
    errors: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0


def simultaneous_open(
    local_port: int,
    peer: Address,
    within_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> PunchOutcome:
    """Connect from ``local_port`` to ``peer`` while the peer does the same towards us.

    Both sides' SYNs leave their NATs and create the mappings; the first SYN to arrive
    at the other NAT is dropped, the later one matches the mapping its own SYN made and
    gets through, and the two connect() calls meet as one TCP simultaneous open.

    One connect() waits for the whole window: the kernel retransmits a lost SYN (after
    1 s, then 3 s) and a lost SYN-ACK of a half-done simultaneous open. Closing the socket
    early to send a fresh SYN would abort such a half-done handshake, and its 4-tuple
    would then refuse the next connect() (EADDRNOTAVAIL) for a while. A connect() that
    fails at once (ECONNREFUSED from a router that answers RST) is retried after
    :data:`RETRY_PAUSE_S` until ``within_s`` has passed.
    """
    start = clock()
    outcome = PunchOutcome(sock=None)
    while (left := within_s - (clock() - start)) > 0.01:
        sock = reusable_socket(local_port)
        sock.settimeout(left)
        outcome.tries += 1
        try:
            sock.connect(peer)
        except TimeoutError:
            sock.close()
            outcome.errors.append("timeout")
            continue
        except OSError as exc:
            sock.close()
            outcome.errors.append(errno.errorcode.get(exc.errno or 0, repr(exc)))
            time.sleep(min(RETRY_PAUSE_S, max(0.0, within_s - (clock() - start))))
            continue
        outcome.sock = sock
        break
    outcome.elapsed_s = clock() - start
    return outcome


def _emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def _read_line(sock: socket.socket) -> str:
    """One line from ``sock`` (without the newline), read byte by byte so nothing that
    follows is consumed; '' at EOF."""
    data = bytearray()
    while len(data) < MAX_LINE:
        byte = sock.recv(1)
        if not byte or byte == b"\n":
            break
        data += byte
    return data.decode()


# --- server ----------------------------------------------------------------------------


class Rendezvous:
    """Answers each client with its observed address and pairs clients by key."""

    def __init__(self) -> None:
        self._waiting: dict[str, tuple[socket.socket, Address]] = {}
        self._open: list[socket.socket] = []  # every client's connection, never closed here
        self._lock = threading.Lock()

    def serve(self, ip: str, ports: list[int], lifetime_s: float) -> None:
        """Listen on every port until ``lifetime_s`` has passed."""
        for port in ports:
            listener = reusable_socket()
            listener.bind((ip, port))
            listener.listen(16)
            threading.Thread(target=self._accept, args=(listener, port), daemon=True).start()
        _emit("listening", ip=ip, ports=ports)
        threading.Event().wait(lifetime_s)

    def _accept(self, listener: socket.socket, port: int) -> None:
        while True:
            conn, addr = listener.accept()
            threading.Thread(target=self._client, args=(conn, addr, port), daemon=True).start()

    def _client(self, conn: socket.socket, addr: Address, port: int) -> None:
        with self._lock:
            self._open.append(conn)
        conn.settimeout(LINE_TIMEOUT_S)
        try:
            words = _read_line(conn).split()
        except OSError:
            return
        name = words[1] if len(words) > 1 else "?"
        _emit("seen", name=name, port=port, observed=[addr[0], addr[1]])
        conn.sendall(f"YOU {addr[0]} {addr[1]}\n".encode())
        if len(words) > 2:
            self._pair(words[2], conn, addr)
        # The connection stays open (referenced in self._open) until the client closes
        # it, as a relay link does: the client's NAT mapping lives with it.

    def _pair(self, key: str, conn: socket.socket, addr: Address) -> None:
        with self._lock:
            other = self._waiting.pop(key, None)
            if other is None:
                self._waiting[key] = (conn, addr)
                return
        other_conn, other_addr = other
        # Both told at the same moment: their SYNs cross within a round trip.
        other_conn.sendall(f"PEER {addr[0]} {addr[1]}\n".encode())
        conn.sendall(f"PEER {other_addr[0]} {other_addr[1]}\n".encode())


# --- clients ---------------------------------------------------------------------------


def _hello(server: Address, local_port: int, name: str, pair: str = "") -> socket.socket:
    sock = reusable_socket(local_port)
    sock.settimeout(LINE_TIMEOUT_S)
    sock.connect(server)
    sock.sendall(f"HELLO {name} {pair}".rstrip().encode() + b"\n")
    return sock


def _address(line: str, tag: str) -> Address:
    words = line.split()
    if len(words) != 3 or words[0] != tag:
        raise ValueError(f"expected {tag!r} ip port, got {line!r}")
    return words[1], int(words[2])


def observe(server_ip: str, ports: list[int], local_port: int, name: str) -> int:
    """Print the public address seen by the server on each port; exit status 0."""
    kept = []
    for port in ports:
        sock = _hello((server_ip, port), local_port, name)
        kept.append(sock)
        public = _address(_read_line(sock), "YOU")
        _emit("observed", server_port=port, local_port=local_port, public=list(public))
    for sock in kept:
        sock.close()
    return 0


def connect(ip: str, port: int, within_s: float) -> int:
    """Print how a connect() to ``ip:port`` ends; exit status 0."""
    sock = reusable_socket()
    sock.settimeout(within_s)
    try:
        sock.connect((ip, port))
        result = "connected"
    except TimeoutError:
        result = "timeout"
    except OSError as exc:
        result = errno.errorcode.get(exc.errno or 0, repr(exc))
    finally:
        sock.close()
    _emit("connect", target=[ip, port], result=result)
    return 0


def punch(server_ip: str, port: int, local_port: int, name: str, pair: str, within_s: float) -> int:
    """Rendezvous, then simultaneous open to the peer; 0 iff a line came back over it."""
    rendezvous = _hello((server_ip, port), local_port, name, pair)
    public = _address(_read_line(rendezvous), "YOU")
    rendezvous.settimeout(within_s + LINE_TIMEOUT_S)
    peer = _address(_read_line(rendezvous), "PEER")
    _emit("peer", public=list(public), peer=list(peer))
    outcome = simultaneous_open(local_port, peer, within_s)
    report = {"tries": outcome.tries, "errors": sorted(set(outcome.errors))}
    if outcome.sock is None:
        _emit("failed", after_s=round(outcome.elapsed_s, 2), **report)
        return 1
    with outcome.sock as sock:
        sock.settimeout(LINE_TIMEOUT_S)
        sock.sendall(f"hello from {name}\n".encode())
        got = _read_line(sock)
        local, remote = sock.getsockname(), sock.getpeername()
    _emit(
        "established",
        local=list(local),
        remote=list(remote),
        got=got,
        after_s=round(outcome.elapsed_s, 2),
        **report,
    )
    rendezvous.close()
    return 0 if got else 1


def main(argv: list[str]) -> int:
    """The command line described in the module docstring."""
    parser = argparse.ArgumentParser(prog="punch.py")
    sub = parser.add_subparsers(dest="command", required=True)
    serve_cmd = sub.add_parser("serve")
    serve_cmd.add_argument("ip")
    serve_cmd.add_argument("ports", nargs="+", type=int)
    serve_cmd.add_argument("--lifetime", type=float, default=60.0)
    connect_cmd = sub.add_parser("connect")
    connect_cmd.add_argument("ip")
    connect_cmd.add_argument("port", type=int)
    connect_cmd.add_argument("--within", type=float, default=1.0)
    for command in ("observe", "punch"):
        client = sub.add_parser(command)
        client.add_argument("server_ip")
        client.add_argument("ports")
        client.add_argument("--local-port", type=int, required=True)
        client.add_argument("--name", default=command)
        client.add_argument("--pair", default="pair")
        client.add_argument("--within", type=float, default=3.0)
    args = parser.parse_args(argv)
    if args.command == "serve":
        Rendezvous().serve(args.ip, args.ports, args.lifetime)
        return 0
    if args.command == "connect":
        return connect(args.ip, args.port, args.within)
    ports = [int(p) for p in args.ports.split(",")]
    if args.command == "observe":
        return observe(args.server_ip, ports, args.local_port, args.name)
    return punch(args.server_ip, ports[0], args.local_port, args.name, args.pair, args.within)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
