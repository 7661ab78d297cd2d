"""The Python client (spec §3.7): what the CLI, the tests and the benchmarks use.

Usage::

    async with Client(url, keys=KeyPair...) as c:          # or token="hnt1:..."
        out = await c.call("echo@1.0", {"hello": 1})
        async with c.stream("echo.stream@1.0", {"count": 5}) as s:
            async for frame in s:
                print(frame.event, frame.data)

``stream(prefer_ws=True)`` opens a WebSocket (acks every 8 frames for you) and falls
back to SSE when the node answers the upgrade with 426 or 503. Every stream yields
its frames, the last being exactly one ``done`` or ``error``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson

from hearthnet.call_stream import ACK_EVERY, Stream, raise_for_terminal
from hearthnet.chat import (
    MAX_RESULT_BYTES,
    ChatResult,
    ChatTool,
    ChatToolHandler,
    OnEvent,
    run_chat,
)
from hearthnet.datadir import start_command
from hearthnet.errors import NodeNotRunning, Unavailable
from hearthnet.identity import KeyPair
from hearthnet.ids import new_ulid
from hearthnet.node_http import NodeHttp, get_public_json, split_capability
from hearthnet.publisher import Publisher
from hearthnet.pubsub.envelope import Message
from hearthnet.pubsub.payload import DATA_ENC, encode_bytes
from hearthnet.pubsub.topics import validate_topic
from hearthnet.subscription import Gap, Reset, Subscription

RETRY_MS = 250  # a publish's retry after `unavailable` without retry_after_ms, times the attempt
MAX_RETRY_MS = 5_000

__all__ = [
    "ACK_EVERY",
    "Client",
    "Stream",
    "find_running_node",
    "get_public_json",
    "raise_for_terminal",
    "split_capability",
]


def find_running_node(data_dir: Path) -> dict[str, Any]:
    """Read ``<data_dir>/run/node.json`` of a running node.

    Raises:
        NodeNotRunning: no run file, or its process is gone.
    """
    path = data_dir / "run" / "node.json"
    try:
        info: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError) as exc:
        raise NodeNotRunning(
            f"no running node found ({path}); start one with: {start_command(data_dir)}"
        ) from exc
    try:
        os.kill(int(info["pid"]), 0)
    except (ProcessLookupError, KeyError, ValueError) as exc:
        raise NodeNotRunning(
            f"the node in {path} is not running (stale run file: it stopped without"
            f" removing it); start it again with: {start_command(data_dir)}"
        ) from exc
    except PermissionError:
        pass  # running as another user: it exists
    return info


class Client:
    """An async client of one node, authenticated by a member key or a token.

    The node's HTTP API with this client's credentials is :attr:`http`
    (:class:`~hearthnet.node_http.NodeHttp`); its ``get_json``, ``request_json``,
    ``signed_headers``, ``session_auth``, ``call_envelope`` and ``node_id`` are this
    client's too. Pub/sub and calls are the methods below; a stream is a
    :class:`~hearthnet.call_stream.Stream`.

    Raises:
        BadRequest: not exactly one of ``keys`` and ``token``.
    """

    def __init__(
        self,
        url: str,
        *,
        keys: KeyPair | None = None,
        token: str | None = None,
        community: str | None = None,
        http: NodeHttp | None = None,
        locate: Callable[[], str] | None = None,
    ) -> None:
        # ``http``: another transport of the same API (through a relay, in a namespace)
        self.http = http or NodeHttp(url, keys=keys, token=token, community=community)
        self.url, self.keys, self.token = self.http.url, keys, token
        # where the node is now (its data dir's run file): see relocate
        self._locate = locate
        http = self.http
        self.get_json = http.get_json
        self.request_json = http.request_json
        self.signed_headers = http.signed_headers
        self.session_auth = http.session_auth
        self.call_envelope = http.call_envelope
        self.node_id = http.node_id

    async def __aenter__(self) -> Client:
        return self

    def relocate(self) -> bool:
        """Look the node's address up again with ``locate`` (a node found by its data
        dir's run file may have restarted on another port) and use it from now on; True
        when it moved. Without ``locate``, or while no node runs there, nothing changes.
        A subscription calls this before each reconnect."""
        if self._locate is None:
            return False
        try:
            url = self._locate().rstrip("/")
        except NodeNotRunning:
            return False
        if url == self.url:
            return False
        self.url = self.http.url = url
        return True

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close pooled connections."""
        await self.http.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        """The pooled HTTP session (keep-alive)."""
        return self.http.session

    @property
    def community(self) -> str | None:
        """The node's community, once known."""
        return self.http.community

    # --- pub/sub ----------------------------------------------------------------------

    async def publish(
        self,
        topic: str,
        msg_type: str,
        data: Any,
        *,
        ttl_s: int | None = None,
        idempotency_key: str | None = None,
        retries: int = 0,
    ) -> dict[str, Any]:
        """Publish; returns ``{"id", "seq", "origin_seq", "ts"}`` once the node has it durably.

        ``data`` may be bytes: it goes as base64url text with ``data_enc`` (HTTP is JSON);
        :meth:`publisher` with ``cbor=True`` sends bytes as they are.

        ``idempotency_key`` (1..64 printable ASCII characters): the node publishes a key
        once within its window (docs/pubsub.md); sending it again gets the first answer
        with ``"duplicate": true``. With ``retries`` the publish is sent again, up to that
        many times, when it fails ``unavailable`` (no answer, a dropped connection, a full
        node: after its ``retry_after_ms``), under the caller's key or, when none was
        given, a fresh one for this publish, so a retry never publishes twice.

        Raises:
            WireError: the node refused it (the last refusal, after ``retries``)."""
        body: dict[str, Any] = {"type": msg_type, "data": data}
        if type(data) is bytes:
            body = {"type": msg_type, "data": encode_bytes(data), "data_enc": DATA_ENC}
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        if idempotency_key is None and retries > 0:
            idempotency_key = new_ulid()
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        path = f"/pubsub/v1/topics/{validate_topic(topic)}/messages"
        attempt = 0
        while True:
            try:
                result: dict[str, Any] = await self.request_json("POST", path, body)
                return result
            except Unavailable as exc:
                attempt += 1
                if attempt > retries:
                    raise
                wait_ms = exc.retry_after_ms or RETRY_MS * attempt
                await asyncio.sleep(min(wait_ms, MAX_RETRY_MS) / 1000)

    def publisher(self, *, cbor: bool = True) -> Publisher:
        """A WebSocket publish session (use ``async with``): ``await pub.publish(...)``.
        With ``cbor`` (the default) a bytes payload is sent as a CBOR byte string."""
        return Publisher(self, cbor=cbor)

    async def history(
        self,
        topic: str,
        *,
        since_seq: int | None = None,
        since_ts: int | None = None,
        before_seq: int | None = None,
        limit: int | None = None,
        verify: bool = False,
    ) -> dict[str, Any]:
        """A page of history: ``{"messages": [frames], "has_more", "epoch"}``, oldest first.

        With ``verify``, every message's origin signature (single or batch, spec §6.2) is
        checked first.

        Raises:
            InvalidSignature: with ``verify``, a message that does not verify.
        """
        result: dict[str, Any] = await self.request_json(
            "GET",
            f"/pubsub/v1/topics/{validate_topic(topic)}/history",
            query={
                "since_seq": since_seq,
                "since_ts": since_ts,
                "before_seq": before_seq,
                "limit": limit,
            },
        )
        if verify:
            for frame in result["messages"]:
                Message.parse(frame["data"])
        return result

    async def presence(self, topic: str) -> list[dict[str, Any]]:
        """Who is on a topic now."""
        result = await self.request_json(
            "GET", f"/pubsub/v1/topics/{validate_topic(topic)}/presence"
        )
        members: list[dict[str, Any]] = result["members"]
        return members

    async def topics(self, prefix: str = "", limit: int = 100) -> list[dict[str, Any]]:
        """Active topics (with messages in the node's log) that this client may read."""
        result = await self.request_json(
            "GET", "/pubsub/v1/topics", query={"prefix": prefix or None, "limit": limit}
        )
        topics: list[dict[str, Any]] = result["topics"]
        return topics

    async def consumers(self, owner: str | None = None) -> list[dict[str, Any]]:
        """This client's durable consumers (spec §6.8): ``owner``, ``name``, ``topics``,
        ``cursor``, ``pending`` (counted up to 1,000), ``held`` (a session holds
        it now), ``lost``. The node's own key sees every identity's, or ``owner``'s."""
        result = await self.request_json("GET", "/pubsub/v1/consumers", query={"owner": owner})
        consumers: list[dict[str, Any]] = result["consumers"]
        return consumers

    async def delete_consumer(self, name: str, owner: str | None = None) -> dict[str, Any]:
        """Forget durable consumer ``name`` (its cursor and the messages kept for it); a
        session holding it is closed (4409). ``owner``: another identity's (the node's
        own key only).

        Raises:
            NotFound: no such consumer.
        """
        result: dict[str, Any] = await self.request_json(
            "DELETE",
            "/pubsub/v1/consumers/" + quote(name, safe=""),
            query={"owner": owner},
        )
        return result

    def subscribe(
        self,
        patterns: str | list[str],
        *,
        since: dict[str, Any] | None = None,
        consumer: str | None = None,
        presence: dict[str, Any] | None = None,
        window: int = 1024,
        on_presence: Callable[[dict[str, Any]], None] | None = None,
        on_gap: Callable[[Gap], None] | None = None,
        on_reset: Callable[[Reset], None] | None = None,
        first_backoff_s: float = 0.5,
        verify: bool = False,
        cbor: bool = False,
        fields: list[str] | None = None,
    ) -> Subscription:
        """A subscription that resumes by itself after any disconnect (use ``async with``).

        Args:
            since: ``{"epoch","seq"}``, ``{"ts"}`` or ``{"last": N}`` for the first connect.
            consumer: a durable consumer name (at-least-once; acks move its cursor).
            presence: ``{"name","status","meta"}`` to appear in the topics' presence.
            on_presence: called with each ``presence`` event's data.
            on_gap: called with each :class:`Gap` (messages the node dropped for this slow
                subscriber; fetch them from history if needed); without it, gaps are
                yielded by the iterator between the deliveries.
            on_reset: called with each :class:`Reset` (the node could not use the start
                asked for, and the subscription resumed where it could, spec §6.5).
            first_backoff_s: the first reconnect delay (doubling to 30 s, spec §3.7).
            verify: check each message's origin signature, single or batch (spec §6.2),
                and skip (and count in ``rejected``) any that fails.
            cbor: use the ``hearthnet-bus.v2+cbor`` subprotocol: a bytes payload arrives
                as a byte string (``Delivery.data``), not as base64url text.
            fields: lean message frames carrying only these envelope fields (say
                ``["topic", "type", "data"]``; not with ``verify``): fewer bytes per
                message. Deliveries without ``id`` are not deduplicated by id.
        """
        return Subscription(
            self,
            [patterns] if isinstance(patterns, str) else list(patterns),
            since=since,
            consumer=consumer,
            presence=presence,
            window=window,
            on_presence=on_presence,
            on_gap=on_gap,
            on_reset=on_reset,
            first_backoff_s=first_backoff_s,
            verify=verify,
            cbor=cbor,
            fields=fields,
        )

    # --- calls --------------------------------------------------------------------

    async def call(
        self,
        capability: str,
        value: Any = None,
        *,
        params: dict[str, Any] | None = None,
        target: str | None = None,
        deadline_ms: int | None = None,
    ) -> dict[str, Any]:
        """Call a non-streaming capability and return its output object.

        Raises:
            WireError: the node's error (``remote`` is true), e.g. NotFound, SchemaMismatch.
        """
        result = await self.call_with_meta(
            capability, value, params=params, target=target, deadline_ms=deadline_ms
        )
        output: dict[str, Any] = result["output"]
        return output

    async def call_with_meta(
        self,
        capability: str,
        value: Any = None,
        *,
        params: dict[str, Any] | None = None,
        target: str | None = None,
        deadline_ms: int | None = None,
    ) -> dict[str, Any]:
        """Like :meth:`call` but returns ``{"output", "meta"}``."""
        name, version = split_capability(capability)
        version = await self.http.capability_version(name, version)
        body: dict[str, Any] = {"input": value}
        if params:
            body["params"] = params
        envelope = await self.call_envelope(name, version, body)
        headers = self.http.call_headers(
            envelope,
            self.http.sign(envelope),
            target=target,
            deadline_ms=deadline_ms,
            accept="application/json",
        )
        result: dict[str, Any] = await self.http.send(
            "POST", self.url + "/bus/v1/call", data=orjson.dumps(body), headers=headers
        )
        return result

    async def chat(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        tools: Sequence[ChatTool | dict[str, Any]] = (),
        tool_handler: ChatToolHandler | None = None,
        tool_choice: str | dict[str, Any] = "auto",
        max_tokens: int | None = None,
        model: str | None = None,
        backend: str | None = None,
        params: dict[str, Any] | None = None,
        prefer_ws: bool = True,
        on_event: OnEvent | None = None,
        deadline_ms: int | None = None,
        target: str | None = None,
        max_result_bytes: int = MAX_RESULT_BYTES,
        publish_to: str | None = None,
    ) -> ChatResult:
        """Chat with ``llm.chat@2.0`` and run its tool calls until it answers (spec §5).

        Works the same over WebSocket (tool results inline) and SSE (re-calls with the
        results appended); see :mod:`hearthnet.chat`.

        Args:
            tools: ``{"name", "description", "parameters", "capability"?}``; a tool with
                a ``capability`` is run with :meth:`call` under this client's identity.
            tool_handler: ``tool_handler(name, arguments)`` (sync or async) runs the others.
            on_event: called with each :class:`~hearthnet.bus.transcript.ChatEvent` as it
                happens (tokens, tool calls, tool results).
            target: run ``llm.chat`` on this node (a NodeID), through the mesh.
            deadline_ms: the whole chat's deadline, tool runs included (then
                ``DeadlineExceeded``).
            max_result_bytes: a tool result whose JSON is longer goes to the model as
                ``{"error": "payload_too_large"}`` instead (256 KiB).
            publish_to: also stream the answer to this pub/sub topic, as this client
                (docs/llm.md "Answers on a topic").
        """
        return await run_chat(
            self,
            messages,
            tools=tools,
            tool_handler=tool_handler,
            tool_choice=tool_choice,
            max_tokens=max_tokens,
            model=model,
            backend=backend,
            params=params,
            prefer_ws=prefer_ws,
            on_event=on_event,
            deadline_ms=deadline_ms,
            target=target,
            max_result_bytes=max_result_bytes,
            publish_to=publish_to,
        )

    def stream(
        self,
        capability: str,
        value: Any = None,
        *,
        params: dict[str, Any] | None = None,
        prefer_ws: bool = True,
        cbor: bool = False,
        target: str | None = None,
        deadline_ms: int | None = None,
        auto_ack: bool = True,
    ) -> Stream:
        """Open a stream of frames from a streaming capability (use ``async with``).

        Args:
            prefer_ws: try WebSocket first; fall back to SSE on 426/503.
            cbor: use the ``hearthnet-bus.v2+cbor`` subprotocol.
            auto_ack: ack every 8 frames (turn off only to test flow control).
        """
        return Stream(
            self.http,
            capability,
            value,
            params=params,
            prefer_ws=prefer_ws,
            cbor=cbor,
            target=target,
            deadline_ms=deadline_ms,
            auto_ack=auto_ack,
        )
