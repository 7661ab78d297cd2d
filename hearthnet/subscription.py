"""Client-side subscriptions that survive disconnects (spec §3.7, §6.5, §6.8).

``Client.subscribe(patterns)`` returns a :class:`Subscription`: an async iterator of
:class:`Delivery` and :class:`Gap` items over one WebSocket session that reconnects by
itself (backoff 0.5 s doubling to 30 s) and resumes from its cursor, so within retention
nothing is lost and, thanks to an id cache, nothing is seen twice.

:class:`ResumeState` is the pure core: cursor, dedupe, where to resume, when to ack.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cbor2
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Subprotocol

from hearthnet.errors import (
    CapacityExceeded,
    HearthNetError,
    RateLimited,
    Unavailable,
    WireError,
    error_from_wire,
)
from hearthnet.pubsub.envelope import Message
from hearthnet.pubsub.payload import payload_of
from hearthnet.transport.codec import SUBPROTOCOL_CBOR, SUBPROTOCOL_JSON
from hearthnet.transport.keepalive import CLOSE_TAKEN_OVER, DELETED_REASON

if TYPE_CHECKING:
    from hearthnet.client import Client

log = logging.getLogger("hearthnet.client.subscription")

SEEN_IDS = 20_000
ACK_IDLE_S = 0.05
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
# Refusals a reconnect waits out (a full node, a busy one, a network down); anything else
# (a revoked or expired credential, a forbidden topic) ends the subscription with its error.
RETRYABLE = (Unavailable, CapacityExceeded, RateLimited, OSError)
# Error frames that end the iteration: the subscribe (or the credentials) can never succeed
# as sent, so resubscribing would only repeat the refusal.
FATAL_CODES = frozenset(
    {"bad_request", "forbidden", "unauthorized", "revoked", "expired", "invalid_signature"}
)


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message, at its position in the node's log."""

    seq: int
    envelope: dict[str, Any]

    @property
    def id(self) -> str:
        """The message id."""
        return str(self.envelope["id"])

    @property
    def topic(self) -> str:
        """The topic."""
        return str(self.envelope["topic"])

    @property
    def type(self) -> str:
        """The message type."""
        return str(self.envelope["type"])

    @property
    def data(self) -> Any:
        """The envelope's ``data`` as received: for a bytes message, a byte string over
        CBOR and base64url text (with ``data_enc``) over JSON; :attr:`payload` is bytes
        either way."""
        return self.envelope["data"]

    @property
    def payload(self) -> Any:
        """The payload as published: bytes for a bytes message, else the JSON value."""
        return payload_of(self.envelope)

    @property
    def ts(self) -> int:
        """When the origin accepted it (Unix ms)."""
        return int(self.envelope["ts"])


@dataclass(frozen=True, slots=True)
class Gap:
    """Messages ``from_seq..to_seq`` were dropped for this (slow) subscriber (spec §6.7);
    read them from history if you still want them."""

    from_seq: int
    to_seq: int


@dataclass(frozen=True, slots=True)
class Reset:
    """The node could not use the start asked for (spec §6.5): ``since`` (None: the
    node's stored cursor). ``reason`` is ``epoch_changed`` (the node's store is another
    one: resumed by the time of the last message received, else live from the head) or
    ``cursor_ahead`` (resumed from ``head_seq``); ``epoch`` is the node's."""

    reason: str
    since: dict[str, Any] | None
    epoch: str | None
    head_seq: int | None


@dataclass
class ResumeState:
    """Cursor, dedupe and acks of one subscription. Pure.

    ``seq`` is the cursor: the highest seq received, or, for a live-only start, the head
    at subscribe time. ``start`` is the ``since`` the last subscribe frame carried: until
    a message arrives, a reconnect asks for the same start again (a ``last: N`` backlog
    not yet received is asked for again, not skipped). Acks name what the current
    session received (never more, and duplicates redelivered after a reconnect count
    too), so a backlog larger than the window keeps flowing. A durable consumer's
    start comes from the node's stored cursor (``consumer``): its backlog is below the
    head, so the head is never taken as its cursor.
    """

    window: int = 1024
    consumer: bool = False
    epoch: str | None = None
    seq: int = 0
    start: dict[str, Any] | None = None
    last_ts: int | None = None
    # Acks belong to one session: what it received and acked (reset on each subscribe).
    unacked: int = 0
    received_seq: int = 0
    acked_seq: int = 0
    seen: OrderedDict[str, None] = field(default_factory=OrderedDict)

    def since(self) -> dict[str, Any] | None:
        """What to send as ``since`` when (re)subscribing; None for a live-only start (or,
        for a durable consumer, for the node's stored cursor)."""
        if self.epoch is not None and (self.seq > 0 or self.start is None):
            return {"epoch": self.epoch, "seq": self.seq}
        if self.start is not None:
            return self.start  # nothing received yet: the same start again
        if self.last_ts is not None:
            return {"ts": self.last_ts}
        return None

    def subscribing(self, since: dict[str, Any] | None) -> None:
        """A subscribe frame is about to go with this ``since`` (on a new session, or
        again after a reset): acks start over with what this one delivers."""
        self.start = since
        self.unacked = self.received_seq = self.acked_seq = 0

    def subscribed(self, epoch: str, head_seq: int) -> None:
        """The node accepted the subscription; a live-only start takes its head as cursor."""
        if self.epoch is None and self.start is None and not self.consumer:
            self.seq = max(self.seq, head_seq)
        self.epoch = epoch

    def reset(
        self, reason: str = "epoch_changed", epoch: str | None = None, head_seq: int | None = None
    ) -> None:
        """The node cannot use the cursor (spec §6.5); the next :meth:`since` resumes from
        what it has.

        ``cursor_ahead`` (the cursor is beyond the head of the node's epoch: it has fewer
        messages than were counted): resume from its head, ``(epoch, head_seq)``. Nothing
        after the head exists yet, so nothing is lost, and the id cache drops a message
        seen before. ``epoch_changed`` (or a reset without a head): the seqs mean other
        messages now, so resume by the time of the last message received.
        """
        self.start = None
        if reason == "cursor_ahead" and epoch is not None and head_seq is not None:
            self.epoch = epoch
            self.seq = head_seq
            return
        self.epoch = None
        self.seq = 0

    def accept(self, seq: int, envelope: dict[str, Any]) -> Delivery | None:
        """A message frame: the delivery to hand out, or None for a duplicate."""
        self.seq = max(self.seq, seq)
        self.received_seq = max(self.received_seq, seq)
        self.unacked += 1
        ts = envelope.get("ts")
        if ts is not None:  # a lean frame may leave it out: no resume by time then
            self.last_ts = max(self.last_ts or 0, int(ts))
        msg_id = envelope.get("id")
        if msg_id is None:  # a lean frame without id (subscribe fields): seq orders it
            return Delivery(seq, envelope)
        msg_id = str(msg_id)
        if msg_id in self.seen:
            return None
        self.seen[msg_id] = None
        if len(self.seen) > SEEN_IDS:
            self.seen.popitem(last=False)
        return Delivery(seq, envelope)

    def ack_due(self, *, idle: bool) -> int | None:
        """The seq to ack now: at half a window, or whenever the reader is about to wait."""
        if (
            self.unacked
            and (self.unacked >= max(1, self.window // 2) or idle)
            and self.received_seq > self.acked_seq
        ):
            self.unacked = 0
            self.acked_seq = self.received_seq
            return self.received_seq
        return None


def backoff_delays(
    start: float = BACKOFF_START_S, cap: float = BACKOFF_MAX_S
) -> AsyncIterator[float]:
    """0.5 s doubling to 30 s, with ±20 % jitter (so a restarted node is not stampeded)."""

    async def gen() -> AsyncIterator[float]:
        delay = start
        while True:
            yield delay * random.uniform(0.8, 1.2)
            delay = min(cap, delay * 2)

    return gen()


def encode_frame(obj: dict[str, Any], cbor: bool) -> str | bytes:
    """A client frame for the session's subprotocol: JSON text, or CBOR (binary)."""
    return cbor2.dumps(obj) if cbor else orjson.dumps(obj).decode()


def consumer_closed(reason: str) -> str:
    """What a durable consumer's session closed 4409 (spec §6.8) says: deleted on the node,
    or taken over by a newer connection."""
    if reason == DELETED_REASON:
        return "this durable consumer was deleted on the node (hearthnet consumer rm)"
    return "this durable consumer was taken over by another connection"


def decode_frame(raw: str | bytes) -> Any:
    """A server frame: CBOR arrives in binary messages, JSON in text ones."""
    return cbor2.loads(raw) if isinstance(raw, bytes) else orjson.loads(raw)


async def open_session(
    client: Client, window: int, *, cbor: bool = False
) -> tuple[ClientConnection, dict[str, Any]]:
    """Open a pub/sub WebSocket session (spec §2.2) and authenticate it as ``client``,
    announcing ``window`` (spec §3.6); returns the socket and the ``auth.ok`` data.
    ``cbor``: speak ``hearthnet-bus.v2+cbor`` (bytes payloads arrive as byte strings).

    Raises:
        Unavailable: no connection, or the upgrade refused (the ``OSError`` is the cause).
        WireError: the node refused the credentials (``auth.error``).
    """
    url = "ws" + client.url[4:] + "/pubsub/v1/subscribe"
    try:
        ws = await connect(
            url,
            subprotocols=[Subprotocol(SUBPROTOCOL_CBOR if cbor else SUBPROTOCOL_JSON)],
            compression=None,
            proxy=None,
            ping_interval=None,
            max_size=16 * 1024 * 1024,
            open_timeout=10,
        )
    except InvalidStatus as exc:
        raise Unavailable(f"subscribe refused with HTTP {exc.response.status_code}") from exc
    except OSError as exc:
        raise Unavailable(f"cannot connect to {client.url}: {exc}") from exc
    try:
        await ws.send(
            encode_frame({"type": "auth", "window": window, **await client.session_auth()}, cbor)
        )
        reply = decode_frame(await ws.recv())
        if reply.get("event") != "auth.ok":
            raise error_from_wire(reply.get("data", {}))
    except (ConnectionClosed, OSError) as exc:
        await ws.close()
        raise Unavailable("the node closed the session while it was opening") from exc
    except BaseException:
        await ws.close()
        raise
    accepted: dict[str, Any] = reply["data"]
    return ws, accepted


class Subscription:
    """A resuming subscription: ``async with client.subscribe(...) as sub``, then
    ``async for item in sub``."""

    def __init__(
        self,
        client: Client,
        patterns: list[str],
        *,
        since: dict[str, Any] | None = None,
        consumer: str | None = None,
        presence: dict[str, Any] | None = None,
        window: int = 1024,
        on_presence: Callable[[dict[str, Any]], None] | None = None,
        on_gap: Callable[[Gap], None] | None = None,
        on_reset: Callable[[Reset], None] | None = None,
        max_backoff_s: float = BACKOFF_MAX_S,
        first_backoff_s: float = BACKOFF_START_S,
        verify: bool = False,
        cbor: bool = False,
        fields: list[str] | None = None,
    ) -> None:
        self.client = client
        # Lean message frames: only these envelope fields (subscribe ``fields``).
        self.fields = list(fields) if fields is not None else None
        self.cbor = cbor
        # spec §6.2: with verify, each message's origin signature (single or batch) is
        # checked here; one that fails is skipped (its seq still counts) and counted.
        self.verify = verify
        self.rejected = 0
        self.patterns = list(patterns)
        self.consumer = consumer
        self.presence = presence
        self.on_presence = on_presence
        self.on_gap = on_gap
        self.on_reset = on_reset
        self.state = ResumeState(window=window, consumer=consumer is not None)
        self._initial_since = since
        self.max_backoff_s = max_backoff_s
        self.first_backoff_s = first_backoff_s
        self._ws: ClientConnection | None = None
        self._closed = False
        self.reconnects = 0
        self.client_id: str | None = None

    async def __aenter__(self) -> Subscription:
        await self._connect(first=True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop (the node keeps a durable consumer's cursor)."""
        self._closed = True
        if self._ws is not None:
            await self._ws.close()

    async def _connect(self, *, first: bool = False) -> None:
        """Open a session, authenticate, subscribe (resuming from the cursor)."""
        ws, accepted = await open_session(self.client, self.state.window, cbor=self.cbor)
        try:
            self.client_id = accepted.get("client_id")
            frame: dict[str, Any] = {"type": "subscribe", "topics": self.patterns}
            if first and self._initial_since:
                since: dict[str, Any] | None = self._initial_since
            elif self.consumer is not None:
                since = None  # the node's stored cursor: everything after the last ack
            else:
                since = self.state.since()
            self.state.subscribing(since)
            if since is not None:
                frame["since"] = since
            if self.consumer is not None:
                frame["consumer"] = self.consumer
            if self.presence is not None:
                frame["presence"] = self.presence
            if self.verify:
                frame["verify"] = True  # spec §6.2: else the node may leave sig out
            if self.fields is not None:
                frame["fields"] = self.fields
            await ws.send(encode_frame(frame, self.cbor))
        except (ConnectionClosed, OSError) as exc:
            await ws.close()
            raise Unavailable("the node closed the subscription while opening it") from exc
        except BaseException:
            await ws.close()
            raise
        self._ws = ws

    async def _resubscribe(self) -> None:
        """After a ``reset`` (the node made no subscription): subscribe again from where
        :meth:`ResumeState.reset` left the cursor."""
        assert self._ws is not None
        frame: dict[str, Any] = {"type": "subscribe", "topics": self.patterns}
        since = self.state.since()
        self.state.subscribing(since)
        if since is not None:
            frame["since"] = since
        if self.consumer is not None:
            frame["consumer"] = self.consumer
        if self.presence is not None:
            frame["presence"] = self.presence
        if self.verify:
            frame["verify"] = True
        if self.fields is not None:
            frame["fields"] = self.fields
        await self._ws.send(encode_frame(frame, self.cbor))

    def __aiter__(self) -> AsyncIterator[Delivery | Gap]:
        return self._items()

    async def _items(self) -> AsyncIterator[Delivery | Gap]:
        delays = backoff_delays(self.first_backoff_s, self.max_backoff_s)
        retry_after_s = 0.0
        while not self._closed:
            ws = self._ws
            if ws is None:
                wait = max(await anext(delays), retry_after_s)
                await asyncio.sleep(wait)
                retry_after_s = 0.0
                if self.client.relocate():
                    log.info("the node is now at %s", self.client.url)
                try:
                    await self._connect()
                    delays = backoff_delays(self.first_backoff_s, self.max_backoff_s)
                    self.reconnects += 1
                    log.info("subscription resumed after seq %d", self.state.seq)
                except RETRYABLE as exc:
                    # The node is there but full or busy (or not there yet): try again later,
                    # no sooner than it asked.
                    if isinstance(exc, WireError) and exc.retry_after_ms:
                        retry_after_s = min(exc.retry_after_ms / 1000, self.max_backoff_s)
                    log.info("subscription reconnect failed (%s); next try soon", exc)
                continue
            try:
                async for item in self._read(ws):
                    yield item
            except ConnectionClosed as exc:
                if exc.rcvd is not None and exc.rcvd.code == CLOSE_TAKEN_OVER:
                    raise Unavailable(consumer_closed(exc.rcvd.reason)) from exc
                if not self._closed:
                    why = f"{exc.rcvd.code} {exc.rcvd.reason}".strip() if exc.rcvd else "dropped"
                    log.warning("the node closed the subscription (%s); reconnecting", why)
            if self._ws is ws:
                self._ws = None

    async def _recv(self, ws: ClientConnection) -> Any:
        """The next frame; while waiting idle, ack what was consumed (a durable consumer's
        cursor then moves promptly, and the window never fills on a quiet stream)."""
        state = self.state
        due = state.ack_due(idle=False)
        if due is None and state.unacked:
            try:
                async with asyncio.timeout(ACK_IDLE_S):
                    return await ws.recv()  # cancelling recv() loses nothing (websockets docs)
            except TimeoutError:
                due = state.ack_due(idle=True)
        if due is not None:
            await self._send_ack(ws, due)
        return await ws.recv()

    async def _send_ack(self, ws: ClientConnection, upto: int) -> None:
        await ws.send(
            encode_frame({"type": "ack", "upto": upto}, True)
            if self.cbor
            else b'{"type":"ack","upto":%d}'.decode() % upto
        )

    async def ack(self) -> None:
        """Ack now every message handed out so far. The subscription acks by itself every
        half window and whenever it waits for the node; a program that stops reading (it
        leaves the loop after the message it wanted) calls this first, so that a durable
        consumer is not sent again what it has handled."""
        due = self.state.ack_due(idle=True)
        if due is not None and self._ws is not None:
            with contextlib.suppress(ConnectionClosed):
                await self._send_ack(self._ws, due)

    def _verified(self, envelope: Any) -> bool:
        """Whether a message's signature verifies (logged and counted when not)."""
        try:
            Message.parse(envelope)
        except HearthNetError as exc:
            self.rejected += 1
            log.warning("a message failed verification and was skipped: %s", exc)
            return False
        return True

    async def _read(self, ws: ClientConnection) -> AsyncIterator[Delivery | Gap]:
        state = self.state
        while True:
            frame = decode_frame(await self._recv(ws))
            event = frame.get("event")
            data = frame.get("data", {})
            if event == "message":
                delivery = state.accept(int(frame["seq"]), data)
                if delivery is not None and (not self.verify or self._verified(data)):
                    yield delivery
            elif event == "gap":
                gap = Gap(int(data["from_seq"]), int(data["to_seq"]))
                if self.on_gap is None:
                    yield gap
                else:
                    self.on_gap(gap)
            elif event == "subscribed":
                state.subscribed(str(data["epoch"]), int(data["head_seq"]))
            elif event == "reset":
                head = data.get("head_seq")
                reset = Reset(
                    str(data.get("reason", "")),
                    state.start,
                    data.get("epoch") if isinstance(data.get("epoch"), str) else None,
                    head if isinstance(head, int) else None,
                )
                state.reset(reset.reason, reset.epoch, reset.head_seq)
                if self.on_reset is not None:
                    self.on_reset(reset)
                await self._resubscribe()
            elif event == "presence" and self.on_presence is not None:
                self.on_presence(data)
            elif event == "auth.expiring":
                with contextlib.suppress(HearthNetError):
                    auth = {"type": "auth", **await self.client.session_auth()}
                    await ws.send(encode_frame(auth, self.cbor))
            elif event == "error":
                error: WireError = error_from_wire(data)
                if error.code in FATAL_CODES:
                    raise error
                log.warning("subscription error from node: %s", error)
