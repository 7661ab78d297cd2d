"""A lean HTTP/1.1 keep-alive protocol for plain signed calls (spec §3.3, §11).

The front door gives a connection whose first request is ``POST /bus/v1/call`` to a
:class:`CallConnection` instead of aiohttp. It answers each request whose head
:func:`~hearthnet.transport.callhead.plain_call` accepts (one ``Content-Length`` body,
no chunking, encodings, ``Expect``, ``Origin``, upgrade or SSE) itself: one parse of the
head, the call, one write of the answer. At the first request that is anything else,
from its first byte, the connection goes to aiohttp's handler for good (the bytes read
so far included), so every other path, method, error answer and upgrade is served as
before on the same port.

Requests are answered in order: bytes sent behind a request (pipelining) wait, up to a
bound, until its answer is written; past the bound the socket is not read. Each
connection has one deadline at a time (spec §2.5): idle keep-alive
(``[transport] keepalive_idle_s``), the rest of a head (``head_timeout_s``), the whole
body (``body_grace_s`` plus its length at ``body_min_bytes_per_s``); a request late
past it is answered ``timeout`` and the connection closed. The front door's pre-auth
limits still hold for the first request as for any connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from typing import Protocol, cast

import orjson

from hearthnet.errors import DeadlineExceeded, HeadersTooLarge, InternalError, WireError
from hearthnet.metrics import Counter
from hearthnet.transport.callhead import CallHeadLimits, PlainCall, plain_call

log = logging.getLogger("hearthnet.transport")

_NEVER = float("inf")
# Bytes a request line may add to the header block before a head is refused unseen.
_REQUEST_LINE_BYTES = 8 * 1024
_LINGER_S = 1.0  # how long input is drained after a refusal before the socket closes


class CallService(Protocol):
    """What the lean path calls: a unary call's JSON answer from its headers and body."""

    def unary_call(
        self, headers: Mapping[str, str], raw: bytes, *, alone: bool = False
    ) -> Awaitable[bytes]:
        """The answer body, or a :class:`WireError` raised. ``alone``: no other call is
        being answered on the path (work is best done at once, not handed off)."""


@dataclass(frozen=True, slots=True)
class CallPathLimits:
    """The lean path's bounds (spec §2.5; ``[transport]`` keys)."""

    head: CallHeadLimits = field(default_factory=CallHeadLimits)
    keepalive_idle_s: float = 15.0
    head_timeout_s: float = 10.0
    body_grace_s: float = 10.0
    body_min_bytes_per_s: float = 1024.0

    @property
    def held_bytes(self) -> int:
        """Bytes read ahead of the request being answered before the socket is not read."""
        return self.head.max_header_bytes + _REQUEST_LINE_BYTES + self.head.max_body_bytes


def _status_line(status: int) -> bytes:
    try:
        reason = HTTPStatus(status).phrase
    except ValueError:  # 499 cancelled has no standard phrase
        reason = "Error"
    return f"HTTP/1.1 {status} {reason}\r\n".encode("latin-1")


class _Date:
    """The ``Date`` header line, formatted once a second."""

    __slots__ = ("line", "second")

    def __init__(self) -> None:
        self.second = -1
        self.line = b""

    def now(self) -> bytes:
        second = int(time.time())
        if second != self.second:
            self.second = second
            self.line = b"Date: " + formatdate(second, usegmt=True).encode("ascii") + b"\r\n"
        return self.line


def answer_bytes(status: int, body: bytes, date: bytes, *, close: bool, retry_after: str) -> bytes:
    """A whole JSON response: status line, headers, body."""
    return b"".join(
        (
            _STATUS_LINES.get(status) or _status_line(status),
            b"Content-Type: application/json\r\nContent-Length: ",
            str(len(body)).encode("ascii"),
            b"\r\n",
            date,
            f"Retry-After: {retry_after}\r\n".encode("ascii") if retry_after else b"",
            b"Connection: close\r\n\r\n" if close else b"\r\n",
            body,
        )
    )


_STATUS_LINES = {200: _status_line(200)}


def error_answer(error: WireError, date: bytes, *, close: bool) -> bytes:
    """The spec §2.2 error body with the code's status (and ``Retry-After`` when known)."""
    retry = ""
    if error.retry_after_ms is not None:
        retry = str(max(1, (error.retry_after_ms + 999) // 1000))
    return answer_bytes(
        error.http_status, orjson.dumps(error.to_wire()), date, close=close, retry_after=retry
    )


class _Drain(asyncio.Protocol):
    """What a refused connection's input goes to until it closes: nowhere."""

    def data_received(self, data: bytes) -> None:
        """Dropped."""


class CallPath:
    """What every lean connection shares: the service, the limits, aiohttp's handler to
    hand over to, the open connections and their deadline sweep."""

    def __init__(
        self,
        service: CallService,
        limits: CallPathLimits,
        http: Callable[[], asyncio.BaseProtocol],
        refused: Counter,
    ) -> None:
        self.service = service
        self.limits = limits
        self.http = http
        self.refused = refused
        self.connections: set[CallConnection] = set()
        self.busy = 0  # connections with a call started and not answered (or dropped) yet
        self.closing = False
        self.date = _Date()
        self.loop = asyncio.get_running_loop()
        self._drained = asyncio.Event()  # set when the last connection goes while closing

    def forget(self, conn: CallConnection) -> None:
        """``conn`` is closed or no longer lean."""
        self.connections.discard(conn)
        if self.closing and not self.connections:
            self._drained.set()

    def protocol(self) -> CallConnection:
        """A protocol for one connection."""
        return CallConnection(self)

    def sweep(self) -> None:
        """Close connections past their deadline."""
        now = self.loop.time()
        for conn in [c for c in self.connections if c.deadline <= now]:
            conn.expire()

    async def run_sweeps(self, tick_s: float) -> None:
        """Check deadlines every ``tick_s`` until cancelled."""
        while True:
            await asyncio.sleep(tick_s)
            self.sweep()

    async def shutdown(self, grace_s: float) -> None:
        """Close idle connections now, the others once their answer is written; after
        ``grace_s`` cancel what is left."""
        self.closing = True
        for conn in list(self.connections):
            conn.going_away()
        if self.connections:
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that
            # arrives in the turn the event is set, and the node's stop would then hang
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(grace_s):
                    await self._drained.wait()
        for conn in list(self.connections):
            conn.abort()


class CallConnection(asyncio.Protocol):
    """One connection on the lean path (see the module docstring)."""

    __slots__ = (
        "_body_at",
        "_buf",
        "_close",
        "_next",
        "_path",
        "_plain",
        "_reading",
        "_task",
        "_transport",
        "_writable",
        "deadline",
    )

    def __init__(self, path: CallPath) -> None:
        self._path = path
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._plain: PlainCall | None = None  # the head being served or awaiting its body
        self._body_at = 0
        self._task: asyncio.Task[None] | None = None
        self._close = False  # close once the answer is written
        self._next: asyncio.Protocol | None = None  # aiohttp, once handed over
        self._reading = True
        self._writable = True
        self.deadline = _NEVER

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Counted among the lean connections; the first request follows at once."""
        self._transport = cast(asyncio.Transport, transport)
        path = self._path
        path.connections.add(self)
        self.deadline = path.loop.time() + path.limits.head_timeout_s

    def data_received(self, data: bytes) -> None:
        """Gather; serve what is whole when nothing is being answered."""
        nxt = self._next
        if nxt is not None:
            nxt.data_received(data)
            return
        buf = self._buf
        if not buf and self._task is None:  # the first byte of a request
            limits = self._path.limits
            self.deadline = self._path.loop.time() + limits.head_timeout_s
        buf += data
        if self._task is None and self._writable:
            self._serve()
        elif len(buf) > self._path.limits.held_bytes and self._reading:
            self._pause_reading()

    def _serve(self) -> None:
        """Take the next whole request from the buffer and start its call, hand the
        connection over, or wait for more bytes."""
        buf = self._buf
        path = self._path
        limits = path.limits
        plain = self._plain
        if plain is None:
            if buf[:2] == b"\r\n":  # RFC 9112 §2.2: blank lines before a request
                del buf[: len(buf) - len(buf.lstrip(b"\r\n"))]
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > limits.head.max_header_bytes + _REQUEST_LINE_BYTES:
                    max_bytes = limits.head.max_header_bytes
                    self._refuse(HeadersTooLarge(f"request head over {max_bytes} bytes"))
                return
            plain = plain_call(bytes(buf[:end]), limits.head)
            if plain is None:
                self._hand_over()
                return
            self._plain = plain
            self._body_at = end + 4
            self.deadline = path.loop.time() + (
                limits.body_grace_s + plain.content_length / limits.body_min_bytes_per_s
            )
        need = self._body_at + plain.content_length
        if len(buf) < need:
            return
        body = bytes(buf[self._body_at : need])
        del buf[:need]
        self._plain = None
        self._close = plain.close
        self.deadline = _NEVER
        path.busy += 1
        self._task = path.loop.create_task(self._call(plain, body))

    async def _call(self, plain: PlainCall, body: bytes) -> None:
        path = self._path
        close = self._close or path.closing
        try:
            answer = await path.service.unary_call(plain.headers, body, alone=path.busy == 1)
            data = answer_bytes(200, answer, path.date.now(), close=close, retry_after="")
        except WireError as exc:
            path.refused.inc(exc.code, "http")
            data = error_answer(exc, path.date.now(), close=close)
        except Exception:
            log.exception("handler failed on POST /bus/v1/call")
            path.refused.inc("internal_error", "http")
            error = InternalError("unexpected failure; see the node log")
            data = error_answer(error, path.date.now(), close=close)
        if self._task is not None:  # else connection_lost has let it go already
            path.busy -= 1
            self._task = None
        transport = self._transport
        assert transport is not None
        if transport.is_closing():
            return
        transport.write(data)
        if close or path.closing:
            transport.close()
            return
        self._next_request()

    def _next_request(self) -> None:
        """After an answer: serve what is buffered, or wait (idle) for the next request."""
        path = self._path
        if self._buf:
            self.deadline = path.loop.time() + path.limits.head_timeout_s
            if self._writable:
                self._serve()
        else:
            self.deadline = path.loop.time() + path.limits.keepalive_idle_s
        if not self._reading and self._next is None and len(self._buf) <= path.limits.held_bytes:
            self._reading = True
            assert self._transport is not None
            self._transport.resume_reading()

    def _pause_reading(self) -> None:
        self._reading = False
        assert self._transport is not None
        self._transport.pause_reading()

    def _hand_over(self) -> None:
        """Give the connection, from the current request on, to aiohttp."""
        path = self._path
        transport = self._transport
        assert transport is not None
        path.forget(self)
        self.deadline = _NEVER
        rest = bytes(self._buf)
        self._buf = bytearray()
        nxt = cast(asyncio.Protocol, path.http())
        self._next = nxt
        if not self._reading:
            self._reading = True
            transport.resume_reading()
        nxt.connection_made(transport)
        if not self._writable:
            nxt.pause_writing()
        if rest and not transport.is_closing():
            nxt.data_received(rest)

    def expire(self) -> None:
        """Past the deadline: idle closes quietly, a late request is answered ``timeout``."""
        transport = self._transport
        self._path.forget(self)
        if transport is None or transport.is_closing():
            return
        if self._buf or self._plain is not None:
            self._refuse(DeadlineExceeded("request not complete in time"))
        else:
            transport.close()

    def _refuse(self, error: WireError) -> None:
        """Answer ``error`` and close; input still arriving is read and dropped for a
        moment first (RFC 9112 §9.6: closing on unread input resets the connection and
        can destroy the answer)."""
        path = self._path
        path.forget(self)
        path.refused.inc(error.code, "http")
        self.deadline = _NEVER
        self._buf = bytearray()
        self._plain = None
        self._next = _Drain()
        transport = self._transport
        assert transport is not None
        transport.write(error_answer(error, path.date.now(), close=True))
        if transport.can_write_eof():
            transport.write_eof()
            path.loop.call_later(_LINGER_S, transport.close)
        else:
            transport.close()

    def going_away(self) -> None:
        """The node is stopping: close now when idle, else after the answer."""
        transport = self._transport
        if self._task is None and transport is not None:
            self._path.forget(self)
            transport.close()

    def abort(self) -> None:
        """The node is stopping and the grace is over."""
        self._path.forget(self)
        if self._task is not None:
            self._task.cancel()
        if self._transport is not None:
            self._transport.abort()

    def eof_received(self) -> bool | None:
        """Forwarded once handed over; before, the connection closes (as aiohttp's does)."""
        if self._next is not None:
            return self._next.eof_received()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        """A call being answered is cancelled (the client's cancel, spec §3.6)."""
        self._path.forget(self)
        if self._task is not None:  # cancelled, perhaps before it started: counted here
            self._task.cancel()
            self._task = None
            self._path.busy -= 1
        self._buf = bytearray()
        if self._next is not None:
            self._next.connection_lost(exc)

    def pause_writing(self) -> None:
        """The client does not read its answers: stop taking requests."""
        self._writable = False
        if self._next is not None:
            self._next.pause_writing()
        elif self._reading:
            self._pause_reading()

    def resume_writing(self) -> None:
        """Take requests again."""
        self._writable = True
        if self._next is not None:
            self._next.resume_writing()
        elif self._task is None:
            self._next_request()
