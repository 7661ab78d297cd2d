"""Pub/sub over HTTP (spec §3.2, §6.4–6.6): publish, history, presence, topics, and
``GET /pubsub/v1/subscribe`` as WebSocket (upgrade), SSE (``Accept: text/event-stream``)
or long-poll (JSON).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import orjson
from aiohttp import web

from hearthnet.caller import Caller
from hearthnet.clock import now_ms
from hearthnet.errors import BadRequest, Expired, WireError
from hearthnet.ids import new_ulid
from hearthnet.pubsub.channel import ChannelState, SubscriberChannel
from hearthnet.pubsub.consumers_http import ConsumersHttp
from hearthnet.pubsub.frames import Since, parse_fields
from hearthnet.pubsub.payload import from_publish
from hearthnet.pubsub.service import publish_once
from hearthnet.pubsub.sinks import AiohttpSink, LongPollSink
from hearthnet.pubsub.subscriber import Subscriber
from hearthnet.pubsub.sweeper import EXPIRY_REASON, sweep_token
from hearthnet.pubsub.topics import TopicPattern
from hearthnet.pubsub.wire import control_frame
from hearthnet.pubsub.ws import PubSubDeps
from hearthnet.pubsub.wsupgrade import PubSubWebSocket
from hearthnet.shapes import Shape
from hearthnet.transport.codec import SSE_KEEPALIVE, loads
from hearthnet.transport.frontdoor import RawUpgrade
from hearthnet.transport.headers import parse_int, read_signed_headers
from hearthnet.transport.keepalive import CLOSE_TOKEN_EXPIRED
from hearthnet.transport.server import json_response

SSE_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
LONG_POLL_LIMIT = 500

# spec §6.4-6.5: the body of an HTTP publish, and the query parameters of each endpoint.
# One table: a field or parameter not listed is refused with bad_request, never ignored
# (``token`` everywhere: a browser EventSource cannot set headers, spec §2.2).
PUBLISH_BODY = Shape.of(
    "publish body",
    ("type", "data", "data_enc", "ttl_s", "idempotency_key"),
    {
        "msg_type": "the HTTP body names it type",
        "ttl": "did you mean ttl_s?",
        "key": "did you mean idempotency_key?",
    },
)
_BODY = '{"type", "data", "data_enc"?, "ttl_s"?, "idempotency_key"?}'
PUBLISH_QUERY = Shape(
    "publish query",
    frozenset({"token"}),
    {
        f: f"the body carries it: {_BODY}"
        for f in ("type", "data", "data_enc", "ttl_s", "ttl", "idempotency_key")
    },
    "parameter",
)
_SINCE = ("since_epoch", "since_seq", "since_ts", "last")
SUBSCRIBE_QUERY = Shape.query(
    "subscribe query",
    ("topics", "topic", *_SINCE, "timeout_s", "consumer", "verify", "fields", "token"),
)
HISTORY_QUERY = Shape.query(
    "history query", ("since_seq", "since_ts", "before_seq", "limit", "token")
)
PRESENCE_QUERY = Shape.query("presence query", ("token",))
TOPICS_QUERY = Shape.query("topics query", ("prefix", "limit", "token"))


def _int_query(
    request: web.Request, name: str, *, minimum: int = 0, default: int | None = None
) -> int | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    return parse_int(raw, name, minimum=minimum)


def verify_query(request: web.Request) -> bool:
    """``verify=true|false`` (default false): whether message frames carry ``sig`` (spec
    §6.2)."""
    raw = request.query.get("verify", "false").lower()
    if raw in ("true", "1"):
        return True
    if raw in ("false", "0", ""):
        return False
    raise BadRequest("verify is true or false")


def fields_query(request: web.Request) -> tuple[str, ...] | None:
    """``fields=topic,type,data``: lean message frames with only those envelope fields
    (None when absent); not with ``verify=true``."""
    raw = request.query.get("fields")
    if raw is None:
        return None
    fields = parse_fields(raw.split(","))
    if fields is not None and verify_query(request):
        raise BadRequest("fields and verify=true exclude each other (sig signs all)")
    return fields


def _lean(sub: Subscriber, request: web.Request) -> Subscriber:
    """``sub`` with the request's ``fields`` applied."""
    fields = fields_query(request)
    if fields is not None:
        sub.ask_fields(fields)
    return sub


def _patterns(request: web.Request) -> tuple[TopicPattern, ...]:
    if "topics" in request.query and "topic" in request.query:
        raise BadRequest("give topics or topic in subscribe query, not both")
    raw = request.query.get("topics") or request.query.get("topic")
    if not raw:
        raise BadRequest("topics=PATTERN[,PATTERN...] is required")
    parts = [p for p in raw.split(",") if p]
    if not 1 <= len(parts) <= 64:
        raise BadRequest("topics lists 1..64 patterns")
    return tuple(TopicPattern.parse(p) for p in parts)


class PubSubHttp:
    """HTTP endpoints of pub/sub."""

    def __init__(self, deps: PubSubDeps) -> None:
        self.deps = deps
        self.ws = PubSubWebSocket(deps)
        self.consumers = ConsumersHttp(deps, self.caller)

    def routes(self) -> list[web.RouteDef]:
        """The routes."""
        return [
            web.post("/pubsub/v1/topics/{topic}/messages", self.publish),
            web.get("/pubsub/v1/topics/{topic}/history", self.history),
            web.get("/pubsub/v1/topics/{topic}/presence", self.presence),
            web.get("/pubsub/v1/topics", self.topics),
            web.get("/pubsub/v1/subscribe", self.subscribe),
            *self.consumers.routes(),
        ]

    def upgrades(self) -> dict[str, RawUpgrade]:
        """WebSocket subscribes served without aiohttp when they open a connection."""
        return {"/pubsub/v1/subscribe": self.ws.upgrade}

    def caller(self, request: web.Request, body: Any) -> Caller:
        """Authenticate a request: signed headers over the request envelope, or a token
        (header, or ``?token=`` since a browser EventSource cannot set headers)."""
        return self.deps.authenticator.authenticate_headers(
            method=request.method,
            path=request.raw_path,
            body=body,
            signed=read_signed_headers(request.headers, query_token=request.query.get("token")),
            now_ms=now_ms(),
        )

    async def publish(self, request: web.Request) -> web.Response:
        """``POST /pubsub/v1/topics/{topic}/messages``
        ``{"type","data","data_enc"?,"ttl_s"?,"idempotency_key"?}`` (``data_enc:
        "base64url"``: data is bytes, sent as base64url text; the key:
        :mod:`hearthnet.pubsub.idempotency`)."""
        PUBLISH_QUERY.check(request.query)
        raw = await request.read()
        body = loads(raw) if raw else None
        if not isinstance(body, dict):
            raise BadRequest(f"the body is {_BODY}")
        PUBLISH_BODY.check(body)
        for field in ("type", "data"):
            if field not in body:
                raise BadRequest(f"the body is {_BODY}: {field} is missing")
        caller = self.caller(request, body)
        data = from_publish(body["data"], body.get("data_enc"))
        topic, msg_type, ttl_s = request.match_info["topic"], body.get("type"), body.get("ttl_s")
        key = body.get("idempotency_key")
        if key is not None:
            receipt = await publish_once(
                self.deps.service, caller, topic, msg_type, data, ttl_s=ttl_s, key=key
            )
            return json_response(receipt.answer())
        stored = await self.deps.service.publish(caller, topic, msg_type, data, ttl_s)
        msg = stored.message
        return json_response(
            {"id": msg.id, "seq": stored.seq, "origin_seq": msg.origin_seq, "ts": msg.ts}
        )

    async def history(self, request: web.Request) -> web.Response:
        """``GET /pubsub/v1/topics/{topic}/history`` (default 50, at most 500 per page);
        the answer names the log's epoch, so a client paging by ``seq`` sees when the log
        was recreated under it (its seqs then number other messages)."""
        HISTORY_QUERY.check(request.query)
        caller = self.caller(request, None)
        rows, has_more = await self.deps.service.history(
            caller,
            request.match_info["topic"],
            since_seq=_int_query(request, "since_seq"),
            since_ts=_int_query(request, "since_ts"),
            before_seq=_int_query(request, "before_seq"),
            limit=_int_query(request, "limit", minimum=1, default=50) or 50,
        )
        body = (
            b'{"messages":['
            + b",".join(r.frame_bytes() for r in rows)
            + b'],"has_more":'
            + (b"true" if has_more else b"false")
            + b',"epoch":'
            + orjson.dumps(self.deps.service.log.epoch)
            + b"}"
        )
        return web.Response(body=body, content_type="application/json")

    async def presence(self, request: web.Request) -> web.Response:
        """``GET /pubsub/v1/topics/{topic}/presence``."""
        PRESENCE_QUERY.check(request.query)
        caller = self.caller(request, None)
        topic = request.match_info["topic"]
        return json_response({"topic": topic, "members": self.deps.service.members(caller, topic)})

    async def topics(self, request: web.Request) -> web.Response:
        """``GET /pubsub/v1/topics?prefix=&limit=``: topics with messages the caller may read."""
        TOPICS_QUERY.check(request.query)
        caller = self.caller(request, None)
        limit = _int_query(request, "limit", minimum=1, default=100) or 100
        return json_response(
            {
                "topics": self.deps.service.topics(
                    caller, request.query.get("prefix", ""), min(limit, 1000)
                )
            }
        )

    async def subscribe(self, request: web.Request) -> web.StreamResponse:
        """WebSocket, SSE or long-poll, by what the client asks for."""
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await self.ws.handle(request)
        SUBSCRIBE_QUERY.check(request.query)
        fields_query(request)  # a bad value (or verify) is refused before a stream starts
        caller = self.caller(request, None)
        patterns = _patterns(request)
        if "text/event-stream" in request.headers.get("Accept", ""):
            return await self._sse(request, caller, patterns)
        return await self._long_poll(request, caller, patterns)

    def _since(self, request: web.Request, *, last_event_id: bool) -> Since | None:
        """Where a subscribe starts: ``Last-Event-ID`` (SSE), else ``since_epoch`` +
        ``since_seq``, ``since_ts`` or ``last`` from the query."""
        # The URL gives one starting point, as `since` does on WebSocket: a mix would be
        # half applied, so it is refused (an empty value counts as absent).
        given = [name for name in ("since_seq", "since_ts", "last") if request.query.get(name)]
        if len(given) > 1:
            raise BadRequest(f"give one of since_seq, since_ts and last, not {' and '.join(given)}")
        if request.query.get("since_epoch") and given != ["since_seq"]:
            raise BadRequest("since_epoch goes with since_seq")
        last_event = request.headers.get("Last-Event-ID") if last_event_id else None
        if last_event:
            # An EventSource reconnects to the URL it was opened with and adds the id of the
            # last event it got: that id wins over the URL's starting point. The URL's
            # since_epoch is not applied to it: ids are seqs of the epoch the stream was in,
            # which after a reset is no longer the URL's.
            return Since(seq=parse_int(last_event, "Last-Event-ID", minimum=0))
        epoch = request.query.get("since_epoch")
        seq = _int_query(request, "since_seq")
        if seq is not None:
            return Since(epoch=epoch, seq=seq)
        ts = _int_query(request, "since_ts")
        if ts is not None:
            return Since(ts=ts)
        last = _int_query(request, "last")
        return Since(last=min(last, 10_000)) if last is not None else None

    async def _sse(
        self, request: web.Request, caller: Caller, patterns: tuple[TopicPattern, ...]
    ) -> web.StreamResponse:
        deps = self.deps
        since = self._since(request, last_event_id=True)
        if "consumer" in request.query:
            raise BadRequest("durable consumers need acks: subscribe over WebSocket")
        # Every refusal must happen before the 200 and the event-stream headers go out.
        for pattern in patterns:
            deps.service.policy.check_subscribe(caller, pattern.text)
        deps.connections.open(caller.identity)
        session = SseSession(deps, request, caller)
        session_key = deps.sessions.add(caller, session.revoke, session.expire_token_at)
        try:
            response = web.StreamResponse(headers=SSE_HEADERS)
            if request.version >= (1, 1):
                response.enable_chunked_encoding()
            await response.prepare(request)
            session.start(response)
            task = asyncio.current_task()
            if task is not None:
                deps.streams.add(task)
            assert session.sub is not None
            await deps.service.subscribe(session.sub, patterns, since=since)
            if session.sub.channel.state is ChannelState.CATCHING_UP:
                # A reset was sent and nothing subscribed: an EventSource would reconnect with
                # the same Last-Event-ID forever, so the stream goes on live from the head.
                await deps.service.subscribe(session.sub, patterns)
            await session.closed.wait()
            with contextlib.suppress(ConnectionError, RuntimeError):
                await response.write_eof()
            return response
        finally:
            session.end()
            deps.sessions.remove(session_key)
            deps.connections.close(caller.identity)

    async def _long_poll(
        self, request: web.Request, caller: Caller, patterns: tuple[TopicPattern, ...]
    ) -> web.Response:
        deps = self.deps
        service = deps.service
        timeout = min(
            float(_int_query(request, "timeout_s", default=30) or 0), deps.config.long_poll_max_s
        )
        since = self._since(request, last_event_id=False)
        if "consumer" in request.query:
            raise BadRequest("durable consumers need acks: subscribe over WebSocket")
        if caller.token is not None:  # a parked poll ends when its token does
            timeout = min(timeout, max(0.0, (caller.token.exp_ms - now_ms()) / 1000))
        sink = LongPollSink()
        arrived, frames = sink.arrived, sink.frames
        ended: list[WireError] = []  # revoked while parked

        def revoke(error: WireError) -> None:
            ended.append(error)
            arrived.set()

        def has_news() -> bool:
            # a message, or a reset: the cursor cannot be used and the client must know now
            return bool(ended) or any(
                f.startswith((b'{"event":"message"', b'{"event":"reset"')) for f in frames
            )

        channel = SubscriberChannel(
            window=None,
            queue_max=LONG_POLL_LIMIT,
            catching_up=True,
            encode_gap=lambda a, b: control_frame("json", "gap", {"from_seq": a, "to_seq": b}),
        )
        sub = _lean(
            Subscriber(
                caller=caller,
                client_id="lp_" + new_ulid().lower(),
                form="json",
                channel=channel,
                sink=sink,
                verify=verify_query(request),
            ),
            request,
        )
        # A long-poll holds a socket for up to timeout_s: it counts like any stream, and a
        # revocation ends it like any stream.
        deps.connections.open(caller.identity)
        session_key = deps.sessions.add(caller, revoke)
        service.register(sub)
        try:
            # Read no more backlog than one response can return.
            await service.subscribe(sub, patterns, since=since, backlog_limit=LONG_POLL_LIMIT)
            sub.write_out()
            # spec §6.5: return at once when there is backlog; else wait for the first message
            if not has_news() and timeout > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        while not has_news():
                            arrived.clear()
                            await arrived.wait()
            sub.write_out()
        finally:
            service.detach(sub)
            deps.sessions.remove(session_key)
            deps.connections.close(caller.identity)
        if ended:
            raise ended[0]
        messages, resume = _long_poll_page(frames, service.log.head_seq)
        if not messages and caller.token is not None and caller.token.exp_ms <= now_ms():
            raise Expired("token expired")
        service.fanout.count_sent(
            sum(1 for f in messages if f.startswith(b'{"event":"message"')),
            sum(1 for f in messages if f.startswith(b'{"event":"gap"')),
        )
        body = (
            b'{"messages":['
            + b",".join(messages)
            + b'],"epoch":'
            + orjson.dumps(service.log.epoch)
            + b',"head_seq":'
            + str(resume).encode()
            + b"}"
        )
        return web.Response(body=body, content_type="application/json")


def _long_poll_page(frames: list[bytes], head_seq: int) -> tuple[list[bytes], int]:
    """The message and gap frames of one long-poll response, and the cursor to resume from.

    At most ``LONG_POLL_LIMIT`` messages go out. A full page claims no more than it
    returns: its cursor is the last returned seq, not the log's head, so a client that
    continues with ``since_seq=head_seq`` misses nothing (a gap frame after the cut concerns
    messages the next poll reads from the log).
    """
    out: list[bytes] = []
    count = 0
    for frame in frames:
        if frame.startswith(b'{"event":"message"'):
            out.append(frame)
            count += 1
            if count == LONG_POLL_LIMIT:
                return out, int(orjson.loads(frame)["seq"])
        elif frame.startswith((b'{"event":"gap"', b'{"event":"reset"')):
            out.append(frame)
    return out, head_seq


class SseSession:
    """One SSE subscription: raw chunked writes, keepalive comments, token expiry."""

    def __init__(self, deps: PubSubDeps, request: web.Request, caller: Caller) -> None:
        self.deps = deps
        self.request = request
        self.caller = caller
        self.sub: Subscriber | None = None
        self.token_exp_ms = caller.token.exp_ms if caller.token is not None else None
        self.token_end = EXPIRY_REASON  # why the stream ends at token_exp_ms
        self.warned = False
        self.closed = asyncio.Event()
        self.chunked = request.version >= (1, 1)  # we write the chunk framing ourselves
        self.sink: AiohttpSink | None = None

    def start(self, response: web.StreamResponse) -> None:
        """Headers are out: start the subscriber and the sweeper's care."""
        channel = SubscriberChannel(
            window=None,
            queue_max=self.deps.config.queue_max,
            catching_up=True,
            encode_gap=lambda a, b: control_frame("sse", "gap", {"from_seq": a, "to_seq": b}),
        )
        transport = self.request.transport
        if transport is not None:  # None: the client left already (nothing is written)
            self.sink = AiohttpSink(
                transport, self.request.protocol, self.request.writer, chunked=self.chunked
            )
        self.sub = _lean(
            Subscriber(
                caller=self.caller,
                client_id="sse_" + new_ulid().lower(),
                form="sse",
                channel=channel,
                sink=self.sink,
                verify=verify_query(self.request),
            ),
            self.request,
        )
        self.deps.service.register(self.sub)
        self.deps.sweeper.add(self)

    def sweep(self, now: float, wall_ms: int) -> None:
        """Keepalive comments after ``sse_keepalive_s`` quiet; token expiry ends the stream."""
        if sweep_token(self, wall_ms):
            return
        sub = self.sub
        if sub is None:
            return
        if time.monotonic() - sub.last_write >= self.deps.transport.sse_keepalive_s:
            sub.channel.out.append(SSE_KEEPALIVE)
            sub.wake()

    def expire_token_at(self, deadline_ms: int, reason: str) -> None:
        """A key rotation voided the token: ``auth.expiring`` now, the end of the stream at
        ``deadline_ms`` for ``reason`` (an SSE client reconnects with a fresh token)."""
        if self.token_exp_ms is None or deadline_ms < self.token_exp_ms:
            self.token_exp_ms = deadline_ms
            self.token_end = reason
            self.warned = False

    def hard_close(self, code: int, reason: str) -> None:
        """End the stream (an SSE client cannot be sent a close code; it gets an error event)."""
        if self.sub is not None:
            error = Expired(reason) if code == CLOSE_TOKEN_EXPIRED else WireError(reason)
            self.sub.send_control("error", error.to_frame_data())
            self.sub.flush()
        self.closed.set()

    def revoke(self, error: WireError) -> None:
        """The caller was revoked: an error event, then the end of the stream."""
        if self.sub is not None:
            self.sub.send_control("error", error.to_frame_data())
            self.sub.flush()
        self.closed.set()

    def end(self) -> None:
        """The response is over."""
        self.closed.set()
        self.deps.sweeper.remove(self)
        if self.sink is not None:
            self.sink.close()
        if self.sub is not None:
            self.deps.service.detach(self.sub)
