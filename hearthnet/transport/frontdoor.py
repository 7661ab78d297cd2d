"""The front door of every connection (spec §2.5, §3.1): the whole request head within a
deadline, oversized or malformed heads answered in JSON, raw upgrades, body pace.

:class:`FrontDoor` is the first protocol of each connection; :class:`PreAuthGate` feeds
the pure :class:`~hearthnet.transport.preauth.PreAuthTable` and closes what it returns.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import cast

import orjson

from hearthnet.config import TransportSection
from hearthnet.errors import (
    BadRequest,
    CapacityExceeded,
    DeadlineExceeded,
    HeadersTooLarge,
    Unavailable,
    WireError,
)
from hearthnet.metrics import Counter
from hearthnet.transport.callhead import CALL_PATH
from hearthnet.transport.closing import OpenTransports
from hearthnet.transport.preauth import (
    CHUNKED,
    ChunkedBodyEnd,
    PreAuthLimits,
    PreAuthTable,
    Refusal,
    screen_head,
)
from hearthnet.transport.websocket import RequestHead, parse_head

TLS_RECORD_HANDSHAKE = 0x16
# Bytes a request line may add to the header block before the head is refused unseen.
_REQUEST_LINE_BYTES = 8 * 1024
_LINGER_S = 1.0  # how long input is drained after a refusal before the socket closes

# Takes a connection whose first request is ``GET <path>`` with this head, or declines
# (None) so aiohttp serves it: returns the protocol now in charge of the transport.
RawUpgrade = Callable[[asyncio.Transport, RequestHead], asyncio.BaseProtocol | None]
# Closes one pending connection: for a refusal (answered when possible) or, with None,
# because the node is stopping (closed quietly unless a request is being served).
Closer = Callable[[Refusal | None], None]


def plain_response(error: WireError) -> bytes:
    """A whole HTTP/1.1 error response with the spec §2.2 JSON body, closing the
    connection (for answers written before aiohttp has the connection)."""
    body = orjson.dumps(error.to_wire())
    try:
        reason = HTTPStatus(error.http_status).phrase
    except ValueError:  # 499 cancelled has no standard phrase
        reason = "Error"
    retry = ""
    if error.retry_after_ms is not None:
        retry = f"Retry-After: {max(1, (error.retry_after_ms + 999) // 1000)}\r\n"
    return (
        f"HTTP/1.1 {error.http_status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{retry}Connection: close\r\n\r\n"
    ).encode("latin-1") + body


def refusal_answer(reason: Refusal) -> WireError:
    """The error a connection closed for ``reason`` is answered with (when it can be)."""
    return _REFUSAL_ANSWERS[reason]


_REFUSAL_ANSWERS: dict[Refusal, WireError] = {
    Refusal.HEAD_TIMEOUT: DeadlineExceeded("request head not complete in time"),
    Refusal.BODY_RATE: DeadlineExceeded("request body too slow"),
    Refusal.PER_SOURCE: CapacityExceeded(
        "too many unauthenticated connections from this address", retry_after_ms=1000
    ),
    Refusal.FD_RESERVE: Unavailable("the node is short of connections", retry_after_ms=1000),
    Refusal.OUT_OF_DESCRIPTORS: Unavailable("the node is out of connections", retry_after_ms=1000),
}


@dataclass(frozen=True, slots=True)
class HeadLimits:
    """Limits every first request head is checked against (spec §2.5)."""

    max_headers: int = 128
    max_header_bytes: int = 16 * 1024
    limits: PreAuthLimits = field(default_factory=PreAuthLimits)
    fd_reserve: int = 0  # 0: a tenth of RLIMIT_NOFILE (see descriptor_budget)


class PreAuthGate:
    """The asyncio side of :class:`PreAuthTable`: keys connections, closes what the table
    sheds or finds late, counts each refusal by limit."""

    def __init__(
        self,
        limits: HeadLimits,
        requests_refused: Counter,
        refused: Counter,
        http: Callable[[], asyncio.BaseProtocol],
        upgrades: Mapping[str, RawUpgrade],
        *,
        calls: Callable[[], asyncio.BaseProtocol] | None = None,
    ) -> None:
        self.head = limits
        self.requests_refused = requests_refused
        self.refused = refused
        self.http = http
        self.upgrades = upgrades
        self.calls = calls  # the lean protocol for POST /bus/v1/call, if any
        self.table = PreAuthTable(limits.limits)
        self.closers: dict[int, Closer] = {}
        self.in_body: dict[int, asyncio.Transport] = {}
        self.connections = OpenTransports()  # every connection past its TLS handshake
        self._keys = itertools.count()
        self._loop = asyncio.get_running_loop()

    def now(self) -> float:
        """The loop's clock."""
        return self._loop.time()

    def open(self, source: str) -> tuple[int, Refusal | None]:
        """A connection from ``source`` was accepted: its key, and the refusal when it
        must be closed at once (older connections shed for it are closed here)."""
        key = next(self._keys)
        own: Refusal | None = None
        for shed, reason in self.table.open(key, source, self.now()):
            self.refused.inc(reason.value)
            if shed == key:
                own = reason
            else:
                self._close(shed, reason)
        return key, own

    def shed_oldest(self) -> bool:
        """Close the oldest pending connection (out of descriptors); False if none."""
        key = self.table.shed_oldest()
        if key is None:
            return False
        self.refused.inc(Refusal.FD_RESERVE.value)
        self._close(key, Refusal.FD_RESERVE)
        return True

    def closed(self, key: int) -> None:
        """``key`` is gone."""
        self.table.closed(key)
        self.closers.pop(key, None)
        self.in_body.pop(key, None)

    def admit(self, key: int) -> None:
        """``key``'s first request is complete."""
        self.table.admit(key)
        self.in_body.pop(key, None)

    def sweep(self) -> None:
        """Close pending connections past their deadlines."""
        now = self.now()
        for key, transport in self.in_body.items():
            if not transport.is_reading():  # aiohttp holds the body back, not the client
                self.table.excuse(key, now)
        for key, reason in self.table.sweep(now):
            self.refused.inc(reason.value)
            self._close(key, reason)

    async def run_sweeps(self) -> None:
        """Check deadlines every tick until cancelled."""
        tick = self.table.limits.tick_s
        while True:
            await asyncio.sleep(tick)
            self.sweep()

    def close_pending(self) -> None:
        """The node is stopping: close connections that have not finished a request head."""
        for key in list(self.closers):
            self.table.closed(key)
            self._close(key, None)

    def _close(self, key: int, reason: Refusal | None) -> None:
        self.in_body.pop(key, None)
        closer = self.closers.pop(key, None)
        if closer is not None:
            closer(reason)


class FrontDoor(asyncio.Protocol):
    """The first protocol of every connection, and its guard until the first request is
    in (spec §2.5): reads the whole head within the head deadline, answers an oversized
    or malformed head in JSON itself, hands a raw-upgrade path (pub/sub WebSockets) to
    its protocol, plain signed calls to the lean call path
    (:mod:`hearthnet.transport.callpath`) and everything else to aiohttp, then watches
    the body's pace.

    It stays in front of the protocol it hands over to, forwarding every call, so the
    connection is counted until it closes (one method call per read)."""

    __slots__ = (
        "_answered",
        "_body_left",
        "_buf",
        "_chunked",
        "_gate",
        "_inner",
        "_key",
        "_transport",
    )

    def __init__(self, gate: PreAuthGate, key: int) -> None:
        self._gate = gate
        self._key = key
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._inner: asyncio.Protocol | None = None
        self._body_left = 0  # > 0 bytes to come, CHUNKED, 0 when admitted
        self._chunked: ChunkedBodyEnd | None = None  # a chunked first body, until it ends
        self._answered = False  # refused in JSON; input is discarded until the close

    @property
    def transport(self) -> asyncio.Transport | None:
        """The connection's transport, once it is made (after the TLS handshake)."""
        return self._transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Wait (within the head deadline, counted from the accept) for the request head."""
        # uvloop's transports are not asyncio.Transport subclasses; they behave as one.
        self._transport = cast(asyncio.Transport, transport)
        self._gate.closers[self._key] = self.refuse
        self._gate.connections.add(self._transport)

    def refuse(self, reason: Refusal | None) -> None:
        """Close for ``reason``; answered in JSON while nothing else has written. None:
        the node is stopping; a request being served is left to aiohttp's shutdown."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if reason is None or self._answered:
            if self._inner is None:
                transport.close()
            return
        if self._inner is None:
            transport.write(plain_response(refusal_answer(reason)))
        transport.close()

    def data_received(self, data: bytes) -> None:
        """Forward to the protocol in charge; before that, gather the head."""
        inner = self._inner
        if inner is not None:
            if self._body_left:
                self._count_body(data)
            inner.data_received(data)
            return
        if self._answered:
            return
        gathered = self._buf
        # a head trickled a byte at a time costs linear work: append, search the new part
        searched = max(0, len(gathered) - 3)
        gathered += data if gathered else data.lstrip(b"\r\n")
        head_end = gathered.find(b"\r\n\r\n", searched)
        limits = self._gate.head
        if head_end < 0:
            if len(gathered) > limits.max_header_bytes + _REQUEST_LINE_BYTES:
                self._answer(HeadersTooLarge(f"request head over {limits.max_header_bytes} bytes"))
            return
        buf = bytes(gathered)
        self._buf = bytearray()
        try:
            head = screen_head(buf[:head_end], limits.max_headers, limits.max_header_bytes)
        except WireError as exc:
            self._answer(exc)
            return
        transport = self._transport
        assert transport is not None
        upgrade = self._gate.upgrades.get(head.path) if head.method == b"GET" else None
        if upgrade is not None:
            parsed = parse_head(buf[:head_end])
            protocol = upgrade(transport, parsed) if parsed is not None else None
            if protocol is not None:
                # a WebSocket session has its own first-frame deadline (spec §3.5)
                self._gate.admit(self._key)
                self._hand_over(cast(asyncio.Protocol, protocol), buf[head_end + 4 :])
                return
        if not head.host:  # aiohttp would answer in plain text
            self._answer(BadRequest("an HTTP/1.1 request needs a Host header"))
            return
        if head.body:
            self._body_left = head.body
            self._gate.table.body(self._key, self._gate.now())
            self._gate.in_body[self._key] = transport
        else:
            self._gate.admit(self._key)
        calls = self._gate.calls
        if calls is not None and head.method == b"POST" and head.path == CALL_PATH:
            self._hand_over(cast(asyncio.Protocol, calls()), b"")
        else:
            self._hand_over(cast(asyncio.Protocol, self._gate.http()), b"")
        if transport.is_closing():
            return
        assert self._inner is not None
        if self._body_left:
            self._count_body(buf[head_end + 4 :])
        self._inner.data_received(buf)

    def _hand_over(self, protocol: asyncio.Protocol, rest: bytes) -> None:
        transport = self._transport
        assert transport is not None
        self._inner = protocol
        protocol.connection_made(transport)
        if rest and not transport.is_closing():  # frames sent right behind the head
            protocol.data_received(rest)

    def _count_body(self, data: bytes) -> None:
        if self._body_left == CHUNKED:
            if self._chunked is None:
                self._chunked = ChunkedBodyEnd()
            done = self._chunked.feed(data)
        else:
            self._body_left = max(0, self._body_left - len(data))
            done = self._body_left == 0
        self._gate.table.received(self._key, len(data))
        if done:
            self._body_left = 0
            self._gate.admit(self._key)

    def _answer(self, error: WireError) -> None:
        self._gate.requests_refused.inc(error.code, "http")
        self._buf = bytearray()
        transport = self._transport
        assert transport is not None
        transport.write(plain_response(error))
        self._answered = True
        if transport.can_write_eof():
            # RFC 9112 §9.6: the client may still be sending; closing now would reset the
            # connection and could destroy the answer before it is read. Half-close, read
            # and drop what comes, close when the client does or after a moment.
            transport.write_eof()
            asyncio.get_running_loop().call_later(_LINGER_S, transport.close)
        else:
            transport.close()

    def eof_received(self) -> bool | None:
        """Forwarded; before a whole head there is nothing to serve."""
        if self._inner is not None:
            return self._inner.eof_received()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        """Forwarded; the connection no longer counts."""
        self._gate.closed(self._key)
        if self._transport is not None:
            self._gate.connections.lost(self._transport)
        self._buf = bytearray()
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        """Forwarded."""
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        """Forwarded."""
        if self._inner is not None:
            self._inner.resume_writing()


def drop_unserved(conn: socket.socket, door: FrontDoor) -> None:
    """Close a connection whose set-up failed or was cancelled. A TLS handshake can finish,
    and ``door`` start serving, before a cancel (the stop) reaches the set-up: the
    transport then owns the socket and is aborted, so the socket closes through it, once.
    Closing the socket under it would leave the transport and its TLS close open until
    the loop is gone ("unclosed transport")."""
    transport = door.transport
    if transport is not None:
        transport.abort()
    else:
        conn.close()


def head_limits(transport: TransportSection) -> HeadLimits:
    """The front door's limits from the ``[transport]`` section."""
    return HeadLimits(
        max_headers=transport.max_headers,
        max_header_bytes=transport.max_header_bytes,
        limits=PreAuthLimits(
            head_timeout_s=transport.head_timeout_s,
            body_grace_s=transport.body_grace_s,
            body_min_bytes_per_s=float(transport.body_min_bytes_per_s),
            per_source=transport.preauth_per_source,
        ),
        fd_reserve=transport.fd_reserve,
    )


async def readable(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
    """Until ``sock`` has a connection to accept or bytes to read."""
    ready_: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not ready_.done():
            ready_.set_result(None)

    loop.add_reader(sock.fileno(), ready)
    try:
        await ready_
    finally:
        loop.remove_reader(sock.fileno())


async def peek(loop: asyncio.AbstractEventLoop, conn: socket.socket) -> bytes:
    """The first byte the client sent, left in the socket for whoever reads next."""
    await readable(loop, conn)
    return conn.recv(1, socket.MSG_PEEK)
