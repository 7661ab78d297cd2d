"""Encoding frames for the wire: JSON text, CBOR binary (spec §3.8) and SSE (spec §3.3).

Pure. The same frame object becomes identical shapes on every transport.
"""

from __future__ import annotations

import contextlib
import io
import threading
from typing import Any

import orjson

from hearthnet import cbor
from hearthnet.canonical import check_representable, parse_json
from hearthnet.errors import BadRequest, NotCanonical, PayloadTooLarge, WrongFrameType
from hearthnet.frames import Frame

SUBPROTOCOL_JSON = "hearthnet-bus.v2"
SUBPROTOCOL_CBOR = "hearthnet-bus.v2+cbor"
SUBPROTOCOLS = (SUBPROTOCOL_JSON, SUBPROTOCOL_CBOR)
SUBPROTOCOL_HEADER = ", ".join(SUBPROTOCOLS)


def choose_subprotocol(header: str | None) -> str | None:
    """The first subprotocol in a ``Sec-WebSocket-Protocol`` header that we speak."""
    offered = [p.strip() for p in (header or "").split(",") if p.strip()]
    return next((p for p in offered if p in SUBPROTOCOLS), None)


class _CborWriter(threading.local):
    """One reusable CBOR encoder per thread: ``cbor2.dumps`` builds an encoder and a
    buffer for every call, a quarter of what a small frame costs to encode."""

    def __init__(self) -> None:
        self.buf = io.BytesIO()
        self.encoder = cbor.CBOREncoder(self.buf)


# made by the first CBOR frame, not at import: cbor2 is loaded only when used (spec §11)
_CBOR: _CborWriter | None = None


def cbor_dumps(obj: Any) -> bytes:
    """``cbor2.dumps(obj)``, with this thread's encoder (same bytes)."""
    global _CBOR  # noqa: PLW0603 - made once, by the first CBOR frame
    writer = _CBOR
    if writer is None:
        writer = _CBOR = _CborWriter()
    buf = writer.buf
    buf.seek(0)
    buf.truncate()  # also after an encode that failed half-way
    writer.encoder.encode(obj)
    out = buf.getvalue()
    if len(out) > _CBOR_KEEP_BYTES:
        buf.seek(0)
        buf.truncate()  # a large frame's buffer is not kept for the next small one
    return out


_CBOR_KEEP_BYTES = 64 * 1024


def loads(data: bytes | bytearray | str) -> Any:
    """Parse JSON from a client or peer (spec §2.5): :class:`BadRequest` on malformed
    input, :class:`~hearthnet.errors.NotCanonical` on a value canonical JSON cannot
    represent exactly (see :func:`hearthnet.canonical.parse_json`)."""
    return parse_json(data)


class FrameCodec:
    """Encodes server frames and decodes client frames for one subprotocol."""

    def __init__(self, subprotocol: str) -> None:
        if subprotocol not in SUBPROTOCOLS:
            raise ValueError(f"unknown subprotocol {subprotocol}")
        self.subprotocol = subprotocol
        self.binary = subprotocol == SUBPROTOCOL_CBOR

    def encode(self, obj: dict[str, Any]) -> bytes:
        """Encode one object: UTF-8 JSON bytes (sent as a text frame) or CBOR."""
        return cbor_dumps(obj) if self.binary else orjson.dumps(obj)

    def encode_frame(self, frame: Frame) -> bytes:
        """Encode a server frame."""
        return self.encode(frame.to_json())

    def decode(
        self, data: bytes | bytearray | str, *, binary: bool, max_bytes: int
    ) -> dict[str, Any]:
        """Decode one client message into an object.

        Raises:
            BadRequest: wrong frame type for the subprotocol (a binary frame on the JSON
                subprotocol or text on CBOR), malformed encoding, not an object, or
                (:class:`~hearthnet.errors.NotCanonical`) a value canonical JSON cannot
                represent exactly: a CBOR tag, bytes (but for a ``publish`` frame's whole
                ``data``), a non-string key, an integer beyond ±2^53, NaN, nesting deeper
                than 64 (spec §2.5).
            PayloadTooLarge: over ``max_bytes``.
        """
        if len(data) > max_bytes:
            raise PayloadTooLarge(f"message over {max_bytes} bytes")
        if binary != self.binary:
            kind = "binary" if binary else "text"
            raise WrongFrameType(f"{kind} frame on subprotocol {self.subprotocol}")
        if self.binary:
            try:
                obj = cbor.loads(data.encode() if isinstance(data, str) else data)
            except (cbor.CBORDecodeError, ValueError, TypeError) as exc:
                raise BadRequest(f"malformed CBOR: {exc}") from exc
            try:
                check_representable(_without_bytes_data(obj))
            except NotCanonical as exc:
                raise _with_ref(exc, obj) from None
        else:
            try:
                obj = loads(data)
            except NotCanonical as exc:
                with contextlib.suppress(orjson.JSONDecodeError):
                    _with_ref(exc, orjson.loads(data))  # well-formed: only values were refused
                raise
        if not isinstance(obj, dict):
            raise BadRequest("a client frame is an object")
        return obj


def _without_bytes_data(obj: object) -> object:
    """A CBOR ``publish`` frame whose ``data`` is a byte string, minus that field: a binary
    payload is carried as bytes (its signed form is base64url text, see
    :mod:`hearthnet.pubsub.payload`); bytes anywhere else are still refused."""
    if type(obj) is dict and type(obj.get("data")) is bytes and obj.get("type") == "publish":
        return {k: v for k, v in obj.items() if k != "data"}
    return obj


def _with_ref(exc: NotCanonical, frame: object) -> NotCanonical:
    """The refused frame's ``ref`` goes back with the error, so a client knows which of
    its publishes failed (spec §6.4)."""
    ref = frame.get("ref") if isinstance(frame, dict) else None
    if isinstance(ref, str) and len(ref) <= 128:
        exc.extra["ref"] = ref
    return exc


def sse_event(frame: Frame, *, with_id: bool = False) -> bytes:
    """One SSE event (spec §3.3): ``event:``, one-line ``data:``, optional ``id:``."""
    parts = [b"event: ", frame.event.encode(), b"\ndata: ", orjson.dumps(frame.data), b"\n"]
    if with_id and frame.seq is not None:
        parts += [b"id: ", str(frame.seq).encode(), b"\n"]
    parts.append(b"\n")
    return b"".join(parts)


SSE_KEEPALIVE = b": keepalive\n\n"


class SseParser:
    """Incremental SSE parser for the client: feed bytes, get complete events.

    Returns ``(event, data_text, id)`` tuples; comment lines are skipped.
    """

    def __init__(self, max_event_bytes: int = 2 * 1024 * 1024) -> None:
        self._buffer = b""
        self._event = "message"
        self._data: list[bytes] = []
        self._data_bytes = 0
        self._id: str | None = None
        self.max_event_bytes = max_event_bytes

    def feed(self, chunk: bytes) -> list[tuple[str, str, str | None]]:
        """Consume ``chunk``; return the events it completed.

        Raises:
            PayloadTooLarge: a line, or the data of one event, exceeds ``max_event_bytes``.
        """
        buffer = self._buffer + chunk if self._buffer else chunk
        out: list[tuple[str, str, str | None]] = []
        start = 0
        while (nl := buffer.find(b"\n", start)) >= 0:
            line = buffer[start:nl].rstrip(b"\r")
            start = nl + 1
            if not line:
                if self._data:
                    out.append((self._event, b"\n".join(self._data).decode("utf-8"), self._id))
                self._event, self._data, self._data_bytes = "message", [], 0
                continue
            if line.startswith(b":"):
                continue
            field, _, value = line.partition(b":")
            value = value[1:] if value.startswith(b" ") else value
            if field == b"event":
                self._event = value.decode("utf-8")
            elif field == b"data":
                self._data_bytes += len(value) + 1
                if self._data_bytes > self.max_event_bytes:
                    raise PayloadTooLarge("SSE event too large")
                self._data.append(value)
            elif field == b"id":
                self._id = value.decode("utf-8")
        self._buffer = buffer[start:]  # one copy per feed, not one per line
        if len(self._buffer) > self.max_event_bytes:
            raise PayloadTooLarge("SSE line too long")
        return out
