"""The direct upgrade on a member (spec §8): hole punching by TCP simultaneous open.

:class:`~hearthnet.mesh.paths.PathCore` decides when (candidates through the relay, then
``punch`` so both ends start together) and returns
:class:`~hearthnet.mesh.paths.StartPunch`; :class:`Puncher` carries it out:

- both ends open TCP from the port the node listens on (SO_REUSEADDR and SO_REUSEPORT on
  the listener and on the punching socket), towards the peer's candidate, at the agreed
  moment. A NAT that maps endpoint-independently and keeps the inside port when it is free
  (Linux ``masquerade``, most home routers) gives that connection the public port
  :func:`candidate` names: the relay's observed address with our listening port;
- the lower NodeID (the leader, PathCore's initiator) acts as client: its connect is a
  normal dial through :meth:`~hearthnet.mesh.dialer.Dialer.dial_punched` (TLS, the
  WebSocket upgrade, the signed hellos); the other end's connected socket is served by
  the node's HTTP server as if it had been accepted, so the peer-link handshake is the
  one every link goes through;
- the attempt succeeded when a direct link to the peer is up within the window (the mesh's
  :class:`~hearthnet.mesh.routing.Routes` lets it replace the relayed link); else it is
  reported failed and the peer stays relayed (a symmetric NAT maps the punch to another
  port, so it always ends here).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from hearthnet.mesh.frame_fields import punchable_addr
from hearthnet.mesh.paths import StartPunch
from hearthnet.metrics import MetricsRegistry

log = logging.getLogger("hearthnet.mesh.punching")

SocketFactory = Callable[[Any], socket.socket]  # aiohttp's socket_factory: addrinfo -> socket

PUNCH_WINDOW_S = 6.0  # the connect waits this long (the kernel resends a lost SYN at 1 s, 3 s)
LINK_WAIT_S = 10.0  # after the connect: TLS, upgrade and hellos
RETRY_PAUSE_S = 0.2  # a connect refused at once is tried again after this


def split_addr(addr: str) -> tuple[str, int]:
    """``ip:port`` or ``[v6]:port`` to ``(ip, port)`` (raises ValueError)."""
    host, _, port = addr.rpartition(":")
    if not host:
        raise ValueError(f"{addr!r} is not ip:port")
    return host.strip("[]"), int(port)


def candidate(observed_addr: str | None, listen_port: int) -> str | None:
    """What we offer the peer to punch to: the public IP the relay saw our link come from,
    with the port we listen (and punch) on, which an endpoint-independent NAT keeps."""
    if observed_addr is None or listen_port <= 0:
        return None
    try:
        host, _ = split_addr(observed_addr)
    except ValueError:
        return None
    ours = f"[{host}]:{listen_port}" if ":" in host else f"{host}:{listen_port}"
    return ours if punchable_addr(ours) else None


def reusable_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to the listening ``host:port`` beside the listener."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


@dataclass
class PunchCounts:
    """Punches carried out, and how they ended (``/metrics``)."""

    tried: int = 0
    succeeded: int = 0
    failed: int = 0


class Puncher:
    """Carries out :class:`StartPunch` actions for one node.

    Args:
        node_id: this node (the lower NodeID of a pair dials).
        linked_direct: True while a direct (not relayed) link to the peer is up.
        dial: the dialer's :meth:`~hearthnet.mesh.dialer.Dialer.dial_punched`.
        serve: hands a connected socket to the HTTP server (the accepting side).
        spawn: starts a task in the mesh's task group.
        report: ``(peer, nonce, ok)`` when an attempt ended.
    """

    def __init__(
        self,
        *,
        node_id: str,
        linked_direct: Callable[[str], bool],
        dial: Callable[
            [str, str, Callable[[Any], socket.socket], float], Coroutine[Any, Any, bool]
        ],
        serve: Callable[[socket.socket, str], bool] | None,
        spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]],
        report: Callable[[str, str, bool], None],
    ) -> None:
        self.node_id = node_id
        self.linked_direct = linked_direct
        self.dial = dial
        self.serve = serve
        self.spawn = spawn
        self.report = report
        self.host = ""
        self.port = 0
        self.counts = PunchCounts()
        self._running: set[str] = set()

    def register(self, m: MetricsRegistry) -> None:
        """``hearthnet_path_upgrades{outcome}``: punches tried, succeeded, failed."""
        counts = self.counts
        m.read_counter(
            "hearthnet_path_upgrades",
            "Direct upgrades (hole punches) by outcome: tried, succeeded, failed.",
            lambda: {
                ("tried",): float(counts.tried),
                ("succeeded",): float(counts.succeeded),
                ("failed",): float(counts.failed),
            },
            ("outcome",),
        )

    def listening(self, host: str, port: int) -> None:
        """Where the node listens: punches go out from there."""
        self.host, self.port = host, port

    def candidate(self, observed_addr: str | None) -> str | None:
        """Our candidate for an observed address (see :func:`candidate`)."""
        return candidate(observed_addr, self.port)

    def start(self, action: StartPunch) -> None:
        """Carry out one punch (at most one per peer at a time)."""
        if action.peer in self._running or not action.addrs or self.serve is None:
            self.report(action.peer, action.nonce, False)
            return
        self._running.add(action.peer)
        self.counts.tried += 1
        self.spawn(self._run(action), f"punch-{action.peer[:16]}")

    async def _run(self, action: StartPunch) -> None:
        ok = False
        try:
            ok = await self._punch(action)
        except OSError as exc:
            log.info("punch to %s failed: %s", action.peer, exc, extra={"peer": action.peer})
        finally:
            self._running.discard(action.peer)
            if ok:
                self.counts.succeeded += 1
            else:
                self.counts.failed += 1
            log.info(
                "direct upgrade with %s %s",
                action.peer,
                "succeeded" if ok else "failed",
                extra={"peer": action.peer},
            )
            self.report(action.peer, action.nonce, ok)

    async def _punch(self, action: StartPunch) -> bool:
        await asyncio.sleep(max(0.0, action.at - time.monotonic()))
        addr = action.addrs[0]
        ip, port = split_addr(addr)
        # beside the listener: the same address it is bound to (every interface, if so)
        bind_host = self.host or ("::" if ":" in ip else "0.0.0.0")  # noqa: S104

        if self.node_id < action.peer:  # the leader dials; its connect is the punch

            def factory(_addr_info: Any) -> socket.socket:
                return reusable_socket(bind_host, self.port)

            dialing: asyncio.Task[Any] | None = self.spawn(
                self.dial(addr, action.peer, factory, PUNCH_WINDOW_S), "punch-dial"
            )
        else:
            dialing = None
            sock = await self._simultaneous_open(bind_host, (ip, port))
            # no socket: the leader's dial may still have reached our listener (where
            # nothing filters inbound), so wait for the link all the same
            assert self.serve is not None
            if sock is not None and not self.serve(sock, ip):
                return False
        deadline = time.monotonic() + PUNCH_WINDOW_S + LINK_WAIT_S
        while time.monotonic() < deadline:
            if self.linked_direct(action.peer):
                return True
            if dialing is not None and dialing.done():
                return False  # the dial failed (a dial that linked runs until the link ends)
            await asyncio.sleep(0.1)
        return False

    async def _simultaneous_open(
        self, bind_host: str, peer: tuple[str, int]
    ) -> socket.socket | None:
        """One connect() per window from our listening port (a lost SYN is resent by
        the kernel; closing early would abort a half-done simultaneous open)."""
        loop = asyncio.get_running_loop()
        end = time.monotonic() + PUNCH_WINDOW_S
        while (left := end - time.monotonic()) > 0.01:
            sock = reusable_socket(bind_host, self.port)
            try:
                async with asyncio.timeout(left):
                    await loop.sock_connect(sock, peer)
                return sock
            except TimeoutError:
                sock.close()
                return None
            except OSError as exc:
                sock.close()
                log.debug("punch connect to %s: %s", peer, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.sleep(min(RETRY_PAUSE_S, max(0.0, end - time.monotonic())))
        return None
