"""One streaming capability call from a client (spec §3.3-§3.6): a WebSocket (acks
every 8 frames for you) that falls back to SSE when the node answers the upgrade with 426
or 503. Opened by :meth:`hearthnet.client.Client.stream`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import aiohttp
import cbor2
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Subprotocol

from hearthnet.errors import (
    BadRequest,
    Cancelled,
    HearthNetError,
    Unavailable,
    WireError,
    error_from_wire,
)
from hearthnet.frames import Frame
from hearthnet.node_http import NodeHttp, json_or_raise, split_capability
from hearthnet.transport import headers as h
from hearthnet.transport.codec import SUBPROTOCOL_CBOR, SUBPROTOCOL_JSON, SseParser

ACK_EVERY = 8


class Stream:
    """One streaming call: an async iterator of :class:`Frame`, ending with ``done``/``error``."""

    def __init__(
        self,
        node: NodeHttp,
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
        self.node = node
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
        version = await self.node.capability_version(name, version)
        body: dict[str, Any] = {"input": self.value}
        if self.params:
            body["params"] = self.params
        envelope = await self.node.call_envelope(name, version, body)
        self.request_id = envelope["request_id"]
        if self.prefer_ws:
            try:
                await self._open_ws(envelope)
                return
            except _FallBack:
                # a fresh envelope: the first one may already be in the node's replay cache
                envelope = await self.node.call_envelope(name, version, body)
                self.request_id = envelope["request_id"]
        await self._open_sse(envelope, body)

    async def _open_ws(self, envelope: dict[str, Any]) -> None:
        client = self.node
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
        client = self.node
        headers = client.call_headers(
            envelope,
            client.sign(envelope),
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
                await json_or_raise(resp)
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
