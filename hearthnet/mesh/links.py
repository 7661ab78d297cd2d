"""Peer links over WebSocket (spec §7.2): aiohttp glue around :mod:`hearthnet.mesh.protocol`.

A :class:`PeerLink` is one established link: frames go out through a bounded queue (a peer
that cannot keep up is disconnected, never waited for) and come in to a handler. The same
class serves both directions: the acceptor side wraps aiohttp's server WebSocket, the dialer
side its client WebSocket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp
from aiohttp import WSMsgType

from hearthnet.errors import BadRequest, HearthNetError, NotCanonical, Unavailable, WireError
from hearthnet.mesh.frames import Bye, Peers, parse_frame
from hearthnet.mesh.linkread import reader_of
from hearthnet.mesh.protocol import (
    MAX_FRAME_BYTES,
    SUBPROTOCOL,
    TRANSITIONS,
    Handshake,
    LinkState,
    PeerInfo,
    bye_for,
    decode_frame,
    encode_frame,
)
from hearthnet.mesh.route_batch import pack_routes
from hearthnet.mesh.route_header import TAG_BYTE
from hearthnet.mesh.unsent import UnsentFrames
from hearthnet.mesh.wsbatch import BatchWriter
from hearthnet.metrics import Counter, MetricsRegistry

log = logging.getLogger("hearthnet.mesh.link")

HANDSHAKE_TIMEOUT_S = 10.0
SEND_QUEUE_FRAMES = 20_000
SEND_QUEUE_BYTES = 64 * 1024 * 1024
WRITE_BATCH_BYTES = 256 * 1024  # queued frames written with one system call, at most

# What writing to or closing a WebSocket whose connection is gone raises (aiohttp's
# ClientConnectionResetError is both a ConnectionError and a ClientError; RuntimeError
# is "cannot write to closing transport" from older versions).
_SOCKET_GONE = (ConnectionError, RuntimeError, aiohttp.ClientError)


@dataclass(slots=True)
class LinkErrors:
    """Failures around a link's socket that are survived (the link ends or was ending
    anyway): each is counted by where and exception type, and logged, at debug for a
    socket already gone, as a warning with the traceback otherwise."""

    counter: Counter = field(
        default_factory=lambda: Counter("hearthnet_link_errors_total", "", ("where", "error"))
    )

    @classmethod
    def register(cls, registry: MetricsRegistry) -> LinkErrors:
        """Create the series on ``registry``."""
        return cls(
            registry.counter(
                "hearthnet_link_errors_total",
                "Peer link socket failures survived (bye, close, writer), by where and type.",
                ("where", "error"),
            )
        )

    def swallowed(self, where: str, exc: BaseException, peer: str = "") -> None:
        """Count and log ``exc``, raised at ``where`` and not propagated."""
        self.counter.inc(where, type(exc).__name__)
        if isinstance(exc, (*_SOCKET_GONE, TimeoutError)):
            log.debug("peer link %s: %s: %r", peer or "-", where, exc, extra={"peer": peer})
        else:
            log.warning(
                "peer link %s: %s failed", peer or "-", where, exc_info=exc, extra={"peer": peer}
            )


_UNCOUNTED = LinkErrors()  # for callers that do not export metrics (tests of the pieces)


async def _close(ws: WebSocketLike, where: str, errors: LinkErrors, peer: str) -> None:
    """Close ``ws``; a failure is counted and logged, never raised (the link is ending)."""
    try:
        await ws.close()
    except Exception as exc:  # the link is ending: whatever this was, it is counted and logged
        errors.swallowed(where, exc, peer)


class WebSocketLike(Protocol):
    """What both aiohttp WebSocket classes offer that a link uses."""

    async def send_bytes(self, data: bytes) -> None:
        """Send one binary message."""

    # aiohttp's own signature, hence the timeout parameter
    async def receive(self, timeout: float | None = None) -> aiohttp.WSMessage:  # noqa: ASYNC109
        """Next message."""

    async def close(self, *, code: int = 1000, message: bytes = b"") -> bool:
        """Close."""

    @property
    def closed(self) -> bool:
        """True once closed."""


async def _next_binary(ws: WebSocketLike) -> bytes | None:
    while True:
        msg = await ws.receive()
        if msg.type == WSMsgType.BINARY:
            data: bytes = msg.data
            return data
        if msg.type in (WSMsgType.PING, WSMsgType.PONG):
            continue
        if msg.type == WSMsgType.TEXT:
            raise BadRequest("peer links carry CBOR binary frames")
        return None


async def run_handshake(
    ws: WebSocketLike,
    handshake: Handshake,
    now_ms: Callable[[], int],
    errors: LinkErrors = _UNCOUNTED,
    *,
    probe: bool = False,
) -> PeerInfo:
    """Exchange hellos until the link may go up. With ``probe`` (outbound only) the dialer
    checks which node answers (its signed hello echoing our nonce) and does not send its
    last hello, so no link comes up at the other end.

    Raises:
        WireError: the peer was refused (after a ``bye`` with the reason where possible),
            or (``remote`` true) the peer refused us with its ``bye``'s code.
        Unavailable: the socket closed or the exchange timed out.
    """
    try:
        async with asyncio.timeout(HANDSHAKE_TIMEOUT_S):
            if handshake.outbound:
                await ws.send_bytes(handshake.start())
            while not handshake.done:
                data = await _next_binary(ws)
                if data is None:
                    raise Unavailable("the peer closed during the handshake")
                reply = handshake.receive(decode_frame(data), now_ms())
                if reply is not None and not (probe and handshake.done):
                    await ws.send_bytes(reply)
    except TimeoutError as exc:
        raise Unavailable("peer handshake timed out") from exc
    except WireError as exc:
        if not exc.remote:  # the peer's own refusal (its bye) is not answered with one
            try:
                await ws.send_bytes(bye_for(exc))
            except _SOCKET_GONE as send_exc:  # refused peer already gone: nothing to tell
                errors.swallowed("handshake_bye", send_exc)
        raise
    except (aiohttp.ClientError, ConnectionError, RuntimeError) as exc:
        raise Unavailable(f"peer handshake failed: {exc}") from exc
    assert handshake.peer is not None
    return handshake.peer


async def send_referral(
    ws: WebSocketLike, peers: list[dict[str, Any]], errors: LinkErrors = _UNCOUNTED
) -> None:
    """A full node's answer to a member it cannot link: addresses to try, then ``bye``."""
    try:
        await ws.send_bytes(Peers(tuple(peers)).encode())
        await ws.send_bytes(Bye("full", "this node has all the links it takes").encode())
    except _SOCKET_GONE as exc:  # the member left before its referral: nothing to tell
        errors.swallowed("referral", exc)
    await ws.close(code=1000, message=b"full")


async def receive_referral(ws: WebSocketLike, timeout_s: float = HANDSHAKE_TIMEOUT_S) -> list[Any]:
    """The dialer's side of :func:`send_referral`: the addresses sent before ``bye``."""
    peers: list[Any] = []
    with contextlib.suppress(TimeoutError, WireError, aiohttp.ClientError, ConnectionError):
        async with asyncio.timeout(timeout_s):
            while (data := await _next_binary(ws)) is not None:
                frame = parse_frame(decode_frame(data))
                if isinstance(frame, Peers):
                    peers = list(frame.peers)
                elif isinstance(frame, Bye):
                    break
    await ws.close()
    return peers


FrameHandler = Callable[["PeerLink", dict[str, Any]], None]
# a binary frame (spec §8: a route frame's fixed header; hearthnet.mesh.route_header)
BinaryHandler = Callable[["PeerLink", bytes], None]
# the binary frames of one socket read, two or more, in order: True when all are taken,
# False (nothing taken) to have each handed to the BinaryHandler (spec §11)
RoutesHandler = Callable[["PeerLink", list[bytes]], bool]


class PeerLink:
    """One established link to one peer."""

    def __init__(
        self,
        peer: PeerInfo,
        ws: WebSocketLike,
        *,
        outbound: bool,
        on_frame: FrameHandler,
        on_down: Callable[[PeerLink, str], None],
        address: str | None = None,
        errors: LinkErrors = _UNCOUNTED,
        on_binary: BinaryHandler | None = None,
        on_routes: RoutesHandler | None = None,
        v2: bool = False,
        route_batches: bool = False,
    ) -> None:
        self.peer = peer
        self.errors = errors
        self.ws = ws
        self.outbound = outbound
        self.address = address
        self.on_frame = on_frame
        self.on_binary = on_binary
        self.on_routes = on_routes
        # the link speaks hearthnet-peer.v2 (protocol.py): route frames go in the binary
        # form, and frames newer than v1 (budget) may be sent; a v1 peer refuses them
        self.v2 = v2
        # the link speaks hearthnet-peer.v4: the route frames of one write go as one route
        # batch message (spec §11; mesh/route_batch.py)
        self.route_batches = route_batches
        self.on_down = on_down
        self.state = LinkState.HANDSHAKING
        self._queue: deque[bytes] = deque()
        self._queued_bytes = 0
        self._wake = asyncio.Event()
        # spec §11: while the writer task waits, what is queued goes out from a callback
        # at the end of the loop turn (no task step or future per wake-up): see _flush
        self._writer: BatchWriter | None = None  # the write loop's, while it waits
        self._flushing = False  # a _flush is scheduled
        # the loop the link runs on, once known (asyncio.get_running_loop() costs a
        # getpid system call on Python 3.11, once per wake-up on the hot path)
        self._loop: asyncio.AbstractEventLoop | None = None
        self.down_reason = ""
        self.refused_frames = 0  # well-formed frames refused for their values (spec §2.5)
        self.frames_in = 0  # frames read (a member's keepalive watches its relays' counts)
        # spec §8: while a relayed link's frames are still arriving, what is sent on the
        # direct link that replaced it continues their sequence (mesh/path_switch.py):
        # takes a frame and returns True, or False to send it plainly
        self.sequencer: Callable[[bytes], bool] | None = None
        # spec §8: what it refuses while closing, for the link that takes its place
        self.unsent = UnsentFrames()
        self._to(LinkState.UP)

    @property
    def node(self) -> str:
        """The peer's NodeID."""
        return self.peer.node

    def _to(self, state: LinkState) -> None:
        if state not in TRANSITIONS[self.state]:
            raise RuntimeError(f"illegal link transition {self.state.value} -> {state.value}")
        self.state = state

    def send(self, kind: str, **fields: Any) -> bool:
        """Queue a frame; False (and the link closes) when the peer cannot keep up."""
        return self.send_raw(encode_frame(kind, **fields))

    def send_raw(self, data: bytes) -> bool:
        """Queue pre-encoded frame bytes (gossip encodes a message once for all links)."""
        # a sequencer also takes frames sent once the link is closing or down: they are
        # numbered for resending, or go to the link that replaced it (path_switch.py)
        if self.sequencer is not None and self.sequencer(data):
            return True
        return self.enqueue(data)

    def enqueue(self, data: bytes) -> bool:
        """Queue frame bytes as they are (no ``sequencer``); False (and the link closes)
        when the peer cannot keep up."""
        if self.state is not LinkState.UP:
            if self.state is LinkState.CLOSING:  # a fall-back may hand it on (unsent.py)
                self.unsent.keep(data)
            return False
        if (
            len(self._queue) >= SEND_QUEUE_FRAMES
            or self._queued_bytes + len(data) > SEND_QUEUE_BYTES
        ):
            log.warning(
                "peer %s cannot keep up; dropping the link", self.node, extra={"peer": self.node}
            )
            self.close("overloaded", send_bye=False)
            return False
        self._queue.append(data)
        self._queued_bytes += len(data)
        if self._writer is None:
            self._wake.set()  # the write loop is writing or draining: it takes this too
        elif not self._flushing:
            self._flushing = True
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self._flush)
        return True

    def _flush(self) -> None:
        """What was queued this loop turn, written at once while the write loop waits and
        the socket takes it without waiting (spec §11: no task step or future per
        wake-up); anything else (a full socket buffer, closing) is left to the loop."""
        self._flushing = False
        batch = self._writer
        if batch is None or not self._queue:
            return
        if self.state is LinkState.UP and not batch.paused:
            while self._queue:
                raw = self._next_batch()
                frames = pack_routes(raw)[0] if self.route_batches and len(raw) > 1 else raw
                if not batch.send_now(frames):  # not written: the write loop will
                    self._queue.extendleft(reversed(raw))
                    self._queued_bytes += sum(len(data) for data in raw)
                    break
                if batch.paused:
                    break
        if self._queue or self.state is not LinkState.UP:
            self._wake.set()

    @property
    def queued(self) -> int:
        """Frames waiting to be written."""
        return len(self._queue)

    def take_unsent(self) -> list[bytes]:
        """Once down, what it never wrote (queued, or refused while closing), bounded, for
        the link that takes its place (spec §8; mesh/unsent.py); the queue is emptied."""
        frames = self.unsent.take(self._queue)
        self._queue.clear()
        self._queued_bytes = 0
        return frames

    def close(self, reason: str, *, send_bye: bool = True) -> None:
        """Start closing: a ``bye`` goes out last (if asked), then the socket closes."""
        if self.state is not LinkState.UP:
            return
        if send_bye:
            data = Bye("closing", reason).encode()
            self._queue.append(data)
            self._queued_bytes += len(data)
        self.down_reason = reason
        self._to(LinkState.CLOSING)
        self._wake.set()

    async def run(self) -> None:
        """Write and read until the link ends; then report it down."""
        writer = asyncio.get_running_loop().create_task(self._write_loop())
        try:
            await self._read_loop()
        finally:
            if self.state is LinkState.UP:
                self._to(LinkState.CLOSING)
            self._wake.set()
            try:
                # the bye and what was queued before it get a second to go out
                await asyncio.wait_for(writer, 1.0)
            except TimeoutError as exc:
                self.errors.swallowed("writer_drain", exc, self.node)
            except asyncio.CancelledError:
                # the writer's, or ours while already unwinding: the link ends either way
                pass
            except Exception as exc:  # a bug in the writer must not keep on_down from running
                self.errors.swallowed("writer", exc, self.node)
            writer.cancel()
            await _close(self.ws, "close", self.errors, self.node)
            self._to(LinkState.DOWN)
            self.on_down(self, self.down_reason or "closed")

    async def _write_loop(self) -> None:
        ws = self.ws
        batch = BatchWriter(ws)
        while True:
            while self._queue:
                # spec §11: what was queued since the last wake-up goes out in one write
                frames = self._next_batch()
                if self.route_batches and len(frames) > 1:
                    frames = pack_routes(frames)[0]
                try:
                    await batch.send(frames)
                except (ConnectionError, RuntimeError, aiohttp.ClientError) as exc:
                    # Nothing more can go out: stop queueing and close the socket, which
                    # ends the read loop, so run() reports the link down.
                    self.down_reason = self.down_reason or f"write failed: {exc}"
                    if self.state is LinkState.UP:
                        self._to(LinkState.CLOSING)
                    # what is still queued stays for take_unsent (a fall-back hands it on)
                    await _close(ws, "close_after_write_error", self.errors, self.node)
                    return
            if self.state is not LinkState.UP:
                await _close(ws, "close", self.errors, self.node)
                return
            self._wake.clear()
            self._writer = batch
            try:
                await self._wake.wait()
            finally:
                self._writer = None

    def _next_batch(self) -> list[bytes]:
        """Queued frames for one write: all of them, up to :data:`WRITE_BATCH_BYTES`."""
        queue = self._queue
        frames = [queue.popleft()]
        size = len(frames[0])
        while queue and size < WRITE_BATCH_BYTES:
            data = queue.popleft()
            frames.append(data)
            size += len(data)
        self._queued_bytes -= size
        return frames

    async def _read_loop(self) -> None:
        reader = reader_of(self.ws)
        if reader is None:  # aiohttp parses: one receive() per frame
            while self.state is LinkState.UP and await self._read_one():
                pass
            return
        # spec §11: frames read before the link came up wait on aiohttp's queue; once
        # they are taken, each socket read's frames come to _take in one call
        while reader.queued and self.state is LinkState.UP:
            if not await self._read_one():
                return
        reader.attach(self._take)
        while self.state is LinkState.UP:
            # only what is not a binary frame comes here: the end, an error, a stop
            if not await self._read_one():
                return

    async def _read_one(self) -> bool:
        """Await one message from the socket and handle it; False when reading ends."""
        try:
            data = await _next_binary(self.ws)
        except BadRequest as exc:
            self.down_reason = exc.message
            return False
        except (ConnectionError, aiohttp.ClientError) as exc:
            self.down_reason = f"read failed: {exc}"
            return False
        if data is None:
            self.down_reason = self.down_reason or "peer closed"
            return False
        self.frames_in += 1
        return self._handle(data)

    def _take(self, frames: list[bytes]) -> bool:
        """The binary frames of one socket read, in order (spec §11: route frames go to
        ``on_routes`` together, or to ``on_binary`` one by one, from here, with no
        message object or wake-up per frame); False when the link stops reading."""
        on_binary = self.on_binary
        group: list[bytes] = []  # consecutive binary frames (route frames, batches)
        for data in frames:
            if on_binary is not None and data[:1] == TAG_BYTE:
                group.append(data)
                continue
            if group:
                if not self._binaries(group):
                    return False
                group = []
            if self.state is not LinkState.UP:
                return False
            self.frames_in += 1
            if not self._handle(data):
                return False
        return not group or self._binaries(group)

    def _binaries(self, group: list[bytes]) -> bool:
        """Binary frames read together: to ``on_routes`` at once where there are several
        and it takes them, else one by one to ``on_binary``; False when the link stops
        reading."""
        on_binary, on_routes = self.on_binary, self.on_routes
        assert on_binary is not None
        if on_routes is not None and len(group) > 1 and self.state is LinkState.UP:
            try:
                taken = on_routes(self, group)
            except HearthNetError as exc:  # refused after some were taken: as for a frame
                log.warning(
                    "binary frames from %s refused: %s", self.node, exc, extra={"peer": self.node}
                )
                taken = True
            except Exception:  # a bug behind the link: logged, as for a frame alone
                log.exception(
                    "handling frames from %s failed", self.node, extra={"peer": self.node}
                )
                taken = True
            if taken:
                self.frames_in += len(group)
                return True
        for data in group:
            if self.state is not LinkState.UP:
                return False
            self.frames_in += 1
            self._binary(on_binary, data)
        return True

    def _binary(self, on_binary: BinaryHandler, data: bytes) -> None:
        # spec §11: a route frame is handled from its fixed header, never decoded
        try:
            on_binary(self, data)
        except HearthNetError as exc:
            log.warning(
                "binary frame from %s refused: %s", self.node, exc, extra={"peer": self.node}
            )
        except Exception:
            log.exception(
                "handling a binary frame from %s failed", self.node, extra={"peer": self.node}
            )

    def _handle(self, data: bytes) -> bool:
        """One frame read off the link; False when the link stops reading."""
        if self.on_binary is not None and data[:1] == TAG_BYTE:
            self._binary(self.on_binary, data)
            return True
        try:
            frame = decode_frame(data)
        except NotCanonical as exc:
            # spec §2.5: the frame is refused and counted; the link goes on.
            self.refused_frames += 1
            log.warning("frame from %s refused: %s", self.node, exc, extra={"peer": self.node})
            return True
        except WireError as exc:
            log.warning("bad frame from %s: %s", self.node, exc, extra={"peer": self.node})
            self.down_reason = f"protocol violation: {exc.message}"
            return False
        if frame["t"] == "bye":
            self.down_reason = f"peer said bye: {str(frame.get('reason', ''))[:200]}"
            return False
        try:
            self.on_frame(self, frame)
        except HearthNetError as exc:
            log.warning(
                "frame %s from %s refused: %s",
                frame.get("t"),
                self.node,
                exc,
                extra={"peer": self.node},
            )
        except Exception:
            log.exception(
                "handling frame %s from %s failed",
                frame.get("t"),
                self.node,
                extra={"peer": self.node},
            )
        return True


__all__ = ["MAX_FRAME_BYTES", "SUBPROTOCOL", "LinkErrors", "PeerLink", "run_handshake"]
