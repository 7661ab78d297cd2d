"""Publishing over a pub/sub WebSocket session (spec §6.4), for clients that publish
often or publish bytes.

``async with client.publisher(cbor=True) as pub: await pub.publish(topic, type, data)``.
Over ``hearthnet-bus.v2+cbor`` a ``bytes`` payload travels as a CBOR byte string, so
neither side spends base64 on it; over JSON it goes as base64url text with ``data_enc``.
Each publish resolves when the node's ``published.ok`` (sent after the commit) arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from hearthnet.errors import Unavailable, error_from_wire
from hearthnet.pubsub.payload import DATA_ENC, encode_bytes
from hearthnet.subscription import decode_frame, encode_frame, open_session

if TYPE_CHECKING:
    from hearthnet.client import Client

MAX_IN_FLIGHT = 256  # publishes awaiting their published.ok; more wait for a slot


class Publisher:
    """One WebSocket session that publishes; safe to share between tasks."""

    def __init__(
        self, client: Client, *, cbor: bool = True, max_in_flight: int = MAX_IN_FLIGHT
    ) -> None:
        self.client = client
        self.cbor = cbor
        self._slots = asyncio.Semaphore(max_in_flight)
        self._waiting: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._ws: ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._next_ref = 0
        self._closed_by: Unavailable | None = None

    async def __aenter__(self) -> Publisher:
        self._ws, _ = await open_session(self.client, 1, cbor=self.cbor)
        self._reader = asyncio.get_running_loop().create_task(self._read(self._ws))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the session; publishes still waiting fail with ``unavailable``."""
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
        self._fail_all(Unavailable("the publisher was closed"))

    async def publish(
        self,
        topic: str,
        msg_type: str,
        data: Any,
        *,
        ttl_s: int | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Publish; returns ``{"ref", "id", "seq", "origin_seq", "ts"}`` once durable.
        With ``idempotency_key`` the node publishes the key once within its window
        (docs/pubsub.md): a publish sent again with it, on this session or another, gets
        the first answer with ``"duplicate": true``.

        Raises:
            WireError: the node refused the publish (its error, e.g. ``forbidden``).
            Unavailable: the session is closed.
        """
        if self._ws is None:
            raise Unavailable("the publisher is not open (use async with)")
        async with self._slots:
            if self._closed_by is not None:
                raise Unavailable("the publish session ended") from self._closed_by
            self._next_ref += 1
            ref = str(self._next_ref)
            frame: dict[str, Any] = {"type": "publish", "topic": topic, "msg_type": msg_type}
            if type(data) is bytes and not self.cbor:
                frame["data"], frame["data_enc"] = encode_bytes(data), DATA_ENC
            else:
                frame["data"] = data
            if ttl_s is not None:
                frame["ttl_s"] = ttl_s
            if idempotency_key is not None:
                frame["idempotency_key"] = idempotency_key
            frame["ref"] = ref
            fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            self._waiting[ref] = fut
            try:
                await self._ws.send(encode_frame(frame, self.cbor))
                return await fut
            except ConnectionClosed as exc:
                raise Unavailable("the publish session ended") from exc
            finally:
                self._waiting.pop(ref, None)

    async def _read(self, ws: ClientConnection) -> None:
        try:
            async for raw in ws:
                frame = decode_frame(raw)
                data = frame.get("data") if isinstance(frame, dict) else None
                if not isinstance(data, dict):
                    continue
                fut = self._waiting.get(str(data.get("ref")))
                if fut is None or fut.done():
                    continue
                if frame.get("event") == "published.ok":
                    fut.set_result(data)
                elif frame.get("event") == "error":
                    fut.set_exception(error_from_wire(data))
        except ConnectionClosed:
            pass  # the node closed the session: the waiting publishes fail below
        self._closed_by = Unavailable("the publish session ended")
        self._fail_all(self._closed_by)

    def _fail_all(self, error: Unavailable) -> None:
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(error)
