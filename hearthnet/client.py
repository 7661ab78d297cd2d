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

import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlencode

import aiohttp
import cbor2
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Subprotocol
from yarl import URL

from hearthnet.bus.envelope import request_envelope
from hearthnet.chat import ChatResult, ChatTool, ChatToolHandler, OnEvent, run_chat
from hearthnet.clock import now_ms
from hearthnet.errors import (
    BadRequest,
    Cancelled,
    HearthNetError,
    NodeNotRunning,
    Unavailable,
    WireError,
    error_from_wire,
)
from hearthnet.frames import Frame
from hearthnet.identity import KeyPair
from hearthnet.ids import new_ulid
from hearthnet.publisher import Publisher
from hearthnet.pubsub.envelope import Message
from hearthnet.pubsub.payload import DATA_ENC, encode_bytes
from hearthnet.subscription import Gap, Subscription
from hearthnet.transport import headers as h
from hearthnet.transport.codec import SUBPROTOCOL_CBOR, SUBPROTOCOL_JSON, SseParser

ACK_EVERY = 8


def split_capability(cap: str) -> tuple[str, str | None]:
    """``"llm.chat@2.0"`` -> ``("llm.chat", "2.0")``; ``"echo@1"`` -> ``("echo", "1.0")``."""
    name, _, version = cap.partition("@")
    if not version:
        return name, None
    if "." not in version:
        version += ".0"
    return name, version


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
            f"no running node found ({path}); start one with: hearthnet node start"
        ) from exc
    try:
        os.kill(int(info["pid"]), 0)
    except (ProcessLookupError, KeyError, ValueError) as exc:
        raise NodeNotRunning(f"the node in {path} is not running (stale run file)") from exc
    except PermissionError:
        pass  # running as another user: it exists
    return info


class Client:
    """An async client of one node, authenticated by a member key or a token."""

    def __init__(
        self,
        url: str,
        *,
        keys: KeyPair | None = None,
        token: str | None = None,
        community: str | None = None,
    ) -> None:
        if (keys is None) == (token is None):
            raise BadRequest("a Client needs exactly one of keys and token")
        self.url = url.rstrip("/")
        self.keys = keys
        self.token = token
        self.community = community
        self._session: aiohttp.ClientSession | None = None
        self._versions: dict[str, str] | None = None
        self._node_id: str | None = None

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close pooled connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The pooled HTTP session (keep-alive)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                json_serialize=lambda o: orjson.dumps(o).decode(),
            )
        return self._session

    # --- plumbing ---------------------------------------------------------------

    async def _community(self) -> str:
        if self.community is None:
            manifest = await self.get_json("/manifest")
            self.community = str(manifest["community"])
        return self.community

    async def _version(self, name: str, version: str | None) -> str:
        if version is not None:
            return version
        if self._versions is None:
            caps = await self.get_json("/bus/v1/capabilities")
            versions: dict[str, str] = {}
            for desc in caps["capabilities"]:
                current = versions.get(desc["name"])
                key = tuple(int(p) for p in desc["version"].split("."))
                if current is None or key > tuple(int(p) for p in current.split(".")):
                    versions[desc["name"]] = desc["version"]
            self._versions = versions
        return self._versions.get(name, "1.0")

    async def call_envelope(self, name: str, version: str, body: dict[str, Any]) -> dict[str, Any]:
        """The call envelope of spec §2.2 for this client."""
        envelope: dict[str, Any] = {
            "body": body,
            "capability": name,
            "version": version,
            "request_id": new_ulid(),
            "community": await self._community(),
            "ts": now_ms(),
        }
        if self.keys is not None:
            envelope["from"] = self.keys.node_id
        return envelope

    def _credential_headers(
        self, envelope: dict[str, Any], signature: str | None
    ) -> dict[str, str]:
        headers = {
            h.REQUEST_ID: envelope["request_id"],
            h.COMMUNITY: envelope["community"],
            h.TIMESTAMP: str(envelope["ts"]),
        }
        if self.keys is not None and signature is not None:
            headers[h.FROM] = self.keys.node_id
            headers[h.SIGNATURE] = signature
        elif self.token is not None:
            headers[h.TOKEN] = self.token
        return headers

    def _sign(self, obj: dict[str, Any]) -> str | None:
        return self.keys.sign_object(obj) if self.keys is not None else None

    async def signed_headers(self, method: str, path: str, body: Any) -> dict[str, str]:
        """Headers authenticating a non-call request (request envelope of spec §2.2)."""
        if self.keys is None:
            assert self.token is not None
            return {h.TOKEN: self.token}
        envelope = request_envelope(
            method=method,
            path=path,
            body=body,
            request_id=new_ulid(),
            sender=self.keys.node_id,
            community=await self._community(),
            ts=now_ms(),
        )
        return self._credential_headers(envelope, self.keys.sign_object(envelope))

    async def get_json(self, path: str) -> Any:
        """GET a JSON resource (unauthenticated)."""
        return await self._send("GET", self.url + path)

    async def _send(self, method: str, url: str | URL, **kwargs: Any) -> Any:
        """One HTTP exchange; transport failures become :class:`Unavailable`."""
        try:
            async with self.session.request(method, url, **kwargs) as resp:
                return await _json_or_raise(resp)
        except (aiohttp.ClientError, OSError) as exc:
            raise Unavailable(f"{method} {self.url}: {exc or type(exc).__name__}") from exc

    async def request_json(
        self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None
    ) -> Any:
        """An authenticated JSON request (publish, history, presence, ...).

        The signature covers the path with its query string exactly as sent.
        """
        clean = {k: v for k, v in (query or {}).items() if v is not None}
        path_qs = path + ("?" + urlencode(clean, safe="*,") if clean else "")
        headers = await self.signed_headers(method, path_qs, body)
        data = orjson.dumps(body) if body is not None else None
        if data is not None:
            headers["Content-Type"] = "application/json"
        return await self._send(
            method, URL(self.url + path_qs, encoded=True), data=data, headers=headers
        )

    async def node_id(self) -> str:
        """The node's NodeID (from its signed manifest)."""
        if self._node_id is None:
            manifest = await self.get_json("/manifest")
            self._node_id = str(manifest["node"])
            self.community = self.community or str(manifest["community"])
        return self._node_id

    async def session_auth(self) -> dict[str, Any]:
        """The fields of a WebSocket ``auth`` frame (spec §2.2): a token, or a proof of
        identity signed over ``{identity, ts, nonce, node}`` for this node."""
        if self.keys is None:
            return {"token": self.token}
        proof = {
            "identity": self.keys.node_id,
            "ts": now_ms(),
            "nonce": os.urandom(12).hex(),
            "node": await self.node_id(),
        }
        return {
            "identity": proof["identity"],
            "ts": proof["ts"],
            "nonce": proof["nonce"],
            "sig": self.keys.sign_object(proof),
        }

    # --- pub/sub ----------------------------------------------------------------------

    async def publish(
        self, topic: str, msg_type: str, data: Any, *, ttl_s: int | None = None
    ) -> dict[str, Any]:
        """Publish; returns ``{"id", "seq", "origin_seq", "ts"}`` once the node has it durably.

        ``data`` may be bytes: it goes as base64url text with ``data_enc`` (HTTP is JSON);
        :meth:`publisher` with ``cbor=True`` sends bytes as they are."""
        body: dict[str, Any] = {"type": msg_type, "data": data}
        if type(data) is bytes:
            body = {"type": msg_type, "data": encode_bytes(data), "data_enc": DATA_ENC}
        if ttl_s is not None:
            body["ttl_s"] = ttl_s
        result: dict[str, Any] = await self.request_json(
            "POST", f"/pubsub/v1/topics/{topic}/messages", body
        )
        return result

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
        """A page of history: ``{"messages": [frames], "has_more"}``, oldest first.

        With ``verify``, every message's origin signature (single or batch, spec §6.2) is
        checked first.

        Raises:
            InvalidSignature: with ``verify``, a message that does not verify.
        """
        result: dict[str, Any] = await self.request_json(
            "GET",
            f"/pubsub/v1/topics/{topic}/history",
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
        result = await self.request_json("GET", f"/pubsub/v1/topics/{topic}/presence")
        members: list[dict[str, Any]] = result["members"]
        return members

    async def topics(self, prefix: str = "", limit: int = 100) -> list[dict[str, Any]]:
        """Active topics (with messages in the node's log) that this client may read."""
        result = await self.request_json(
            "GET", "/pubsub/v1/topics", query={"prefix": prefix or None, "limit": limit}
        )
        topics: list[dict[str, Any]] = result["topics"]
        return topics

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
        first_backoff_s: float = 0.5,
        verify: bool = False,
        cbor: bool = False,
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
            first_backoff_s: the first reconnect delay (doubling to 30 s, spec §3.7).
            verify: check each message's origin signature, single or batch (spec §6.2),
                and skip (and count in ``rejected``) any that fails.
            cbor: use the ``hearthnet-bus.v2+cbor`` subprotocol: a bytes payload arrives
                as a byte string (``Delivery.data``), not as base64url text.
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
            first_backoff_s=first_backoff_s,
            verify=verify,
            cbor=cbor,
        )

    def _call_headers(
        self,
        envelope: dict[str, Any],
        signature: str | None,
        *,
        target: str | None,
        deadline_ms: int | None,
        accept: str,
    ) -> dict[str, str]:
        headers = self._credential_headers(envelope, signature)
        headers.update(
            {
                h.CAPABILITY: envelope["capability"],
                h.VERSION: envelope["version"],
                "Accept": accept,
                "Content-Type": "application/json",
            }
        )
        if target:
            headers[h.TARGET] = target
        if deadline_ms:
            headers[h.DEADLINE] = str(deadline_ms)
        return headers

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
        version = await self._version(name, version)
        body: dict[str, Any] = {"input": value}
        if params:
            body["params"] = params
        envelope = await self.call_envelope(name, version, body)
        headers = self._call_headers(
            envelope,
            self._sign(envelope),
            target=target,
            deadline_ms=deadline_ms,
            accept="application/json",
        )
        result: dict[str, Any] = await self._send(
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
            self,
            capability,
            value,
            params=params,
            prefer_ws=prefer_ws,
            cbor=cbor,
            target=target,
            deadline_ms=deadline_ms,
            auto_ack=auto_ack,
        )


async def get_public_json(url: str, path: str) -> Any:
    """GET an unauthenticated JSON resource of the node at ``url`` (``/status``,
    ``/manifest``): no keys or token needed, so it works on a machine with no identity.

    Raises:
        Unavailable: nothing answered at ``url``.
        WireError: the node answered with an error.
    """
    try:
        async with aiohttp.ClientSession() as session, session.get(url.rstrip("/") + path) as resp:
            return await _json_or_raise(resp)
    except (aiohttp.ClientError, OSError) as exc:
        raise Unavailable(f"GET {url}: {exc or type(exc).__name__}") from exc


async def _json_or_raise(resp: aiohttp.ClientResponse) -> Any:
    raw = await resp.read()
    try:
        body = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"node answered {resp.status} with non-JSON body") from exc
    if resp.status >= 400:
        if isinstance(body, dict) and ("error" in body):
            raise error_from_wire(body)
        raise error_from_wire({"error": "internal_error", "message": f"HTTP {resp.status}"})
    return body


class Stream:
    """One streaming call: an async iterator of :class:`Frame`, ending with ``done``/``error``."""

    def __init__(
        self,
        client: Client,
        capability: str,
        value: Any,
        *,
        params: dict[str, Any] | None,
        prefer_ws: bool,
        cbor: bool,
        target: str | None,
        deadline_ms: int | None,
        auto_ack: bool,
    ) -> None:
        self.client = client
        self.capability = capability
        self.value = value
        self.params = params
        self.prefer_ws = prefer_ws
        self.cbor = cbor
        self.target = target
        self.deadline_ms = deadline_ms
        self.auto_ack = auto_ack
        self.transport: str | None = None
        self.request_id: str | None = None
        self._ws: ClientConnection | None = None
        self._http: aiohttp.ClientResponse | None = None
        self._frames: AsyncIterator[Frame] | None = None
        self._cancelled = False
        self._last_seq = 0
        self._acked = 0

    async def __aenter__(self) -> Stream:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncIterator[Frame]:
        if self._frames is None:
            raise RuntimeError("open the stream first (async with client.stream(...))")
        return self._frames

    async def open(self) -> None:
        """Connect (WS, or SSE on 426/503 or when ``prefer_ws`` is false).

        Raises:
            WireError: the node refused the call before streaming.
        """
        name, version = split_capability(self.capability)
        version = await self.client._version(name, version)
        body: dict[str, Any] = {"input": self.value}
        if self.params:
            body["params"] = self.params
        envelope = await self.client.call_envelope(name, version, body)
        self.request_id = envelope["request_id"]
        if self.prefer_ws:
            try:
                await self._open_ws(envelope)
                return
            except _FallBack:
                # a fresh envelope: the first one may already be in the node's replay cache
                envelope = await self.client.call_envelope(name, version, body)
                self.request_id = envelope["request_id"]
        await self._open_sse(envelope, body)

    async def _open_ws(self, envelope: dict[str, Any]) -> None:
        client = self.client
        ws_url = "ws" + client.url[4:] + "/bus/v1/call"
        proto = SUBPROTOCOL_CBOR if self.cbor else SUBPROTOCOL_JSON
        headers = {h.CAPABILITY: envelope["capability"], h.VERSION: envelope["version"]}
        if self.target:
            # the node checks at the upgrade that the target offers a stream (spec §3.5)
            headers[h.TARGET] = self.target
        if self.deadline_ms:
            headers[h.DEADLINE] = str(self.deadline_ms)
        try:
            ws = await connect(
                ws_url,
                subprotocols=[Subprotocol(proto)],
                additional_headers=headers,
                compression=None,
                proxy=None,
                ping_interval=None,
                max_size=16 * 1024 * 1024,
                max_queue=64,
                open_timeout=10,
            )
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (426, 503):
                raise _FallBack from exc
            body = exc.response.body or b""
            try:
                raise error_from_wire(orjson.loads(body)) from exc
            except orjson.JSONDecodeError:
                raise Unavailable(f"WebSocket upgrade refused with {status}") from exc
        except OSError as exc:
            raise Unavailable(f"cannot connect to {client.url}: {exc}") from exc
        self._ws = ws
        self.transport = "ws"
        frame: dict[str, Any] = {"type": "call", "envelope": envelope}
        if self.target:
            frame["target"] = self.target
        if self.deadline_ms:
            frame["deadline_ms"] = self.deadline_ms
        if client.keys is not None:
            frame["signature"] = client.keys.sign_object(envelope)
        else:
            frame["token"] = client.token
        await self._ws_send(frame)
        self._frames = self._ws_frames()

    async def _ws_send(self, obj: dict[str, Any]) -> None:
        assert self._ws is not None
        if self.cbor:
            await self._ws.send(cbor2.dumps(obj))
        else:
            await self._ws.send(orjson.dumps(obj).decode())

    async def _ws_frames(self) -> AsyncIterator[Frame]:
        assert self._ws is not None
        ws = self._ws
        while True:
            try:
                raw = await ws.recv()
            except ConnectionClosed as exc:
                if self._cancelled:
                    yield Frame("error", Cancelled("cancelled").to_frame_data())
                    return
                code = exc.rcvd.code if exc.rcvd else 1006
                yield Frame(
                    "error",
                    {
                        "code": "unavailable",
                        "message": f"connection closed ({code}) before the end",
                    },
                )
                return
            obj = cbor2.loads(raw) if isinstance(raw, bytes) else orjson.loads(raw)
            frame = Frame.from_json(obj)
            if frame.seq is not None:
                self._last_seq = frame.seq
                if (
                    self.auto_ack
                    and self._last_seq - self._acked >= ACK_EVERY
                    and not frame.terminal
                ):
                    # The node may already have sent its final frame and closed;
                    # buffered frames are still read, a late ack is moot.
                    with contextlib.suppress(ConnectionClosed):
                        await self.ack(self._last_seq)
            yield frame
            if frame.terminal:
                return

    async def ack(self, upto: int) -> None:
        """Send ``ack{upto}`` (automatic unless ``auto_ack=False``)."""
        self._acked = max(self._acked, upto)
        await self._ws_send({"type": "ack", "upto": upto})

    async def send_tool_result(self, tool_call_id: str, body: Any) -> None:
        """Answer a ``tool_call`` inline (WebSocket only)."""
        if self._ws is None:
            raise BadRequest("tool results go inline only over WebSocket")
        await self._ws_send({"type": "tool_result", "tool_call_id": tool_call_id, "body": body})

    async def _open_sse(self, envelope: dict[str, Any], body: dict[str, Any]) -> None:
        client = self.client
        headers = client._call_headers(
            envelope,
            client._sign(envelope),
            target=self.target,
            deadline_ms=self.deadline_ms,
            accept="text/event-stream",
        )
        try:
            resp = await client.session.post(
                client.url + "/bus/v1/call", data=orjson.dumps(body), headers=headers
            )
        except aiohttp.ClientError as exc:
            raise Unavailable(f"cannot connect to {client.url}: {exc}") from exc
        if resp.status >= 400:
            try:
                await _json_or_raise(resp)
            finally:
                resp.release()
        self._http = resp
        self.transport = "sse"
        self._frames = self._sse_frames(resp)

    async def _sse_frames(self, resp: aiohttp.ClientResponse) -> AsyncIterator[Frame]:
        parser = SseParser()
        try:
            while True:
                try:
                    chunk = await resp.content.readany()
                except (aiohttp.ClientError, ConnectionError):
                    chunk = b""
                if not chunk:
                    code = "cancelled" if self._cancelled else "unavailable"
                    yield Frame("error", {"code": code, "message": "stream closed before the end"})
                    return
                for event, data, _ in parser.feed(chunk):
                    frame = Frame(event, orjson.loads(data))
                    yield frame
                    if frame.terminal:
                        return
        finally:
            resp.release()

    async def cancel(self) -> None:
        """Cancel the call: a ``cancel`` frame over WS (the node answers with
        ``error{cancelled}``), closing the connection over SSE."""
        self._cancelled = True
        if self._ws is not None:
            with contextlib.suppress(ConnectionClosed):
                await self._ws_send({"type": "cancel"})
        elif self._http is not None:
            self._http.close()

    async def aclose(self) -> None:
        """Close the connection."""
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            self._http.close()

    async def collect(self) -> list[Frame]:
        """Read the whole stream."""
        return [frame async for frame in self]


class _FallBack(HearthNetError):
    """WS upgrade refused with 426/503: use SSE."""


def raise_for_terminal(frame: Frame) -> None:
    """Raise the matching :class:`WireError` if ``frame`` is an ``error`` frame."""
    if frame.event == "error":
        error: WireError = error_from_wire(frame.data)
        raise error
