"""Server side of RFC 6455 without a framework: the opening handshake and a frame reader.
Pure: bytes in, events out.

Pub/sub subscribers are many and mostly idle, so their sockets are served by a small
protocol object (see :mod:`hearthnet.pubsub.wsupgrade`) instead of a request handler, a response
object and a task each. This module is what that object needs to speak WebSocket:

- :func:`parse_head` reads an HTTP/1.1 request head; :func:`upgrade_response` checks it is
  a WebSocket opening handshake (§4.2.1) and builds the ``101`` answer;
- :class:`FrameReader` turns client bytes into :class:`Message`, :class:`Ping`,
  :class:`Pong` and :class:`CloseReceived`: it unmasks, joins fragments, enforces the
  message size limit *before* buffering a frame, and raises :class:`WsProtocolError`
  with the close code for anything a client must not send.

Server frames are built by :func:`ws_frame` and :func:`close_frame` (unmasked, final);
:func:`frame_head` is the one header builder, also for the masked frames a peer link's
client side writes (:mod:`hearthnet.mesh.wsbatch`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from hearthnet.errors import HearthNetError
from hearthnet.transport.keepalive import CLOSE_TOO_BIG

OP_CONTINUATION = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA

CLOSE_PROTOCOL_ERROR = 1002
CLOSE_NO_STATUS = 1005
CLOSE_INVALID_DATA = 1007

MAX_HEAD_BYTES = 16 * 1024
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_DATA_OPS = frozenset({OP_CONTINUATION, OP_TEXT, OP_BINARY})
_CONTROL_OPS = frozenset({OP_CLOSE, OP_PING, OP_PONG})
_MESSAGE_OPS = frozenset({OP_TEXT, OP_BINARY})  # the first frame of a message


class WsProtocolError(HearthNetError):
    """The client broke RFC 6455 (or our size limit); close with ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(slots=True, frozen=True)
class RequestHead:
    """An HTTP/1.1 request line and headers (names lower-cased, repeats joined by ``,``)."""

    method: str
    path: str
    query: str
    headers: dict[str, str]


_LEN1 = struct.Struct("!BB").pack
_LEN2 = struct.Struct("!BBH").pack
_LEN3 = struct.Struct("!BBQ").pack
_FIN = 0x80
_MASKED = 0x80


def frame_head(length: int, opcode: int, masked: bool = False) -> bytes:
    """The RFC 6455 §5.2 header of one final, unfragmented frame of ``length`` bytes (no
    RSV bits: no extension in use); ``masked`` sets the mask bit, the caller appends
    the key."""
    first = _FIN | opcode
    mask_bit = _MASKED if masked else 0
    if length < 126:
        return _LEN1(first, length | mask_bit)
    if length < 65536:
        return _LEN2(first, 126 | mask_bit, length)
    return _LEN3(first, 127 | mask_bit, length)


def ws_frame(payload: bytes | bytearray, opcode: int) -> bytes:
    """A final, unmasked server WebSocket frame (RFC 6455 §5.2)."""
    return frame_head(len(payload), opcode) + payload


def close_frame(code: int, reason: str = "") -> bytes:
    """A server close frame (the reason cut to fit a control frame)."""
    return ws_frame(struct.pack("!H", code) + reason.encode()[:120], OP_CLOSE)


def parse_head(head: bytes) -> RequestHead | None:
    """Parse a request head (up to, not including, the blank line); None if malformed."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        return None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or parts[2] != "HTTP/1.1":
        return None
    method, target, _ = parts
    path, _, query = target.partition("?")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            return None
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return RequestHead(method, path, query, headers)


def _tokens(value: str) -> set[str]:
    return {t.strip().lower() for t in value.split(",") if t.strip()}


def accept_key(key: str) -> str:
    """``Sec-WebSocket-Accept`` for a client's ``Sec-WebSocket-Key`` (RFC 6455 §4.2.2)."""
    digest = hashlib.sha1(key.encode("latin-1") + _GUID, usedforsecurity=False).digest()
    return base64.b64encode(digest).decode()


def upgrade_response(head: RequestHead, subprotocol: str | None) -> bytes | None:
    """The ``101 Switching Protocols`` answer to a valid opening handshake, or None when
    ``head`` is not one (then the request goes to the ordinary HTTP server, which answers
    it or refuses it with a proper error)."""
    h = head.headers
    if head.method != "GET" or "websocket" not in _tokens(h.get("upgrade", "")):
        return None
    if "upgrade" not in _tokens(h.get("connection", "")) or h.get("sec-websocket-version") != "13":
        return None
    key = h.get("sec-websocket-key", "")
    try:
        if len(base64.b64decode(key, validate=True)) != 16:
            return None
    except (binascii.Error, ValueError):
        return None
    lines = [
        b"HTTP/1.1 101 Switching Protocols",
        b"Upgrade: websocket",
        b"Connection: Upgrade",
        b"Sec-WebSocket-Accept: " + accept_key(key).encode(),
    ]
    if subprotocol is not None:
        lines.append(b"Sec-WebSocket-Protocol: " + subprotocol.encode())
    return b"\r\n".join(lines) + b"\r\n\r\n"


class Message(NamedTuple):
    """A complete data message (fragments joined). Immutable like the other events, but a
    named tuple: one is made per client frame (every publish and ack), and a frozen
    dataclass costs ~1 µs more to build."""

    payload: bytes | bytearray
    binary: bool


@dataclass(slots=True, frozen=True)
class Ping:
    """A ping; answer with a pong carrying ``payload``."""

    payload: bytes | bytearray


@dataclass(slots=True, frozen=True)
class Pong:
    """A pong."""

    payload: bytes | bytearray


@dataclass(slots=True, frozen=True)
class CloseReceived:
    """The client's close frame (``code`` 1005 when it gave none)."""

    code: int
    reason: str


Event = Message | Ping | Pong | CloseReceived


def unmask(payload: bytes, mask: bytes) -> bytes:
    """XOR ``payload`` with the 4-byte ``mask`` repeated (done as one big-integer XOR)."""
    n = len(payload)
    if not n:
        return b""
    key = (mask * ((n >> 2) + 1))[:n]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


# (payload, 4-byte mask) -> the payload unmasked; a compiled one returns the bytearray it
# unmasked in place (one copy of the frame's bytes, not two)
Unmask = Callable[[bytes, bytes], bytes | bytearray]


def _close_event(payload: bytes | bytearray) -> CloseReceived:
    if not payload:
        return CloseReceived(CLOSE_NO_STATUS, "")
    if len(payload) == 1:
        raise WsProtocolError(CLOSE_PROTOCOL_ERROR, "close payload of one byte")
    (code,) = struct.unpack("!H", payload[:2])
    if code < 1000 or code in (1004, 1005, 1006, 1015) or 1015 < code < 3000 or code > 4999:
        raise WsProtocolError(CLOSE_PROTOCOL_ERROR, f"invalid close code {code}")
    try:
        reason = payload[2:].decode()
    except UnicodeDecodeError as exc:
        raise WsProtocolError(CLOSE_INVALID_DATA, "close reason is not UTF-8") from exc
    return CloseReceived(code, reason)


class FrameReader:
    """Client frames to events. Holds at most one frame's bytes plus one message's parts,
    both bounded by ``max_message`` (an idle reader holds nothing)."""

    __slots__ = ("_buf", "_parts", "_parts_binary", "_parts_len", "_unmask", "max_message")

    def __init__(self, max_message: int, unmask: Unmask = unmask) -> None:
        self.max_message = max_message
        self._unmask = unmask  # the glue passes a compiled one (this module stays pure)
        self._buf = b""
        self._parts: list[bytes | bytearray] | None = None
        self._parts_binary = False
        self._parts_len = 0

    def feed(self, data: bytes) -> list[Event]:
        """Events completed by ``data``, in order.

        Raises:
            WsProtocolError: unmasked or reserved-bit frames, bad opcodes, bad fragments,
                oversized control frames (1002), a message over ``max_message`` (1009), a
                bad close payload (1002/1007), a text message that is not UTF-8 (1007).
        """
        buf = self._buf + data if self._buf else data
        events: list[Event] = []
        pos, end = 0, len(buf)
        while end - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            opcode = b0 & 0x0F
            if b0 & 0x70:
                raise WsProtocolError(CLOSE_PROTOCOL_ERROR, "reserved bits set")
            if not b1 & 0x80:
                raise WsProtocolError(CLOSE_PROTOCOL_ERROR, "client frames must be masked")
            length = b1 & 0x7F
            head = 2
            if length == 126:
                if end - pos < 4:
                    break
                (length,) = struct.unpack_from("!H", buf, pos + 2)
                head = 4
            elif length == 127:
                if end - pos < 10:
                    break
                (length,) = struct.unpack_from("!Q", buf, pos + 2)
                head = 10
            start = pos + head + 4
            if (
                b0 & 0x80
                and opcode in _MESSAGE_OPS
                and self._parts is None
                and length <= self.max_message
            ):
                # The usual frame, a whole data message: what _check and _frame do for it.
                if end - start < length:
                    break
                payload = self._unmask(buf[start : start + length], buf[pos + head : start])
                pos = start + length
                events.append(_message(payload, opcode == OP_BINARY))
                continue
            fin = bool(b0 & 0x80)
            self._check(opcode, fin, length)
            if end - start < length:
                break
            payload = self._unmask(buf[start : start + length], buf[pos + head : start])
            pos = start + length
            event = self._frame(opcode, fin, payload)
            if event is not None:
                events.append(event)
        self._buf = buf[pos:] if pos < end else b""
        return events

    def _check(self, opcode: int, fin: bool, length: int) -> None:
        """Refuse a frame from its header alone, before its payload is buffered."""
        if opcode in _CONTROL_OPS:
            if not fin or length > 125:
                raise WsProtocolError(CLOSE_PROTOCOL_ERROR, "fragmented or long control frame")
            return
        if opcode not in _DATA_OPS:
            raise WsProtocolError(CLOSE_PROTOCOL_ERROR, f"unknown opcode {opcode}")
        if opcode == OP_CONTINUATION and self._parts is None:
            raise WsProtocolError(CLOSE_PROTOCOL_ERROR, "continuation without a first frame")
        if opcode != OP_CONTINUATION and self._parts is not None:
            raise WsProtocolError(CLOSE_PROTOCOL_ERROR, "new message inside a fragmented one")
        if self._parts_len + length > self.max_message:
            raise WsProtocolError(CLOSE_TOO_BIG, f"message over {self.max_message} bytes")

    def _frame(self, opcode: int, fin: bool, payload: bytes | bytearray) -> Event | None:
        if opcode == OP_PING:
            return Ping(payload)
        if opcode == OP_PONG:
            return Pong(payload)
        if opcode == OP_CLOSE:
            return _close_event(payload)
        if opcode != OP_CONTINUATION:
            if fin:
                return _message(payload, opcode == OP_BINARY)
            self._parts, self._parts_binary = [payload], opcode == OP_BINARY
            self._parts_len = len(payload)
            return None
        assert self._parts is not None
        self._parts.append(payload)
        self._parts_len += len(payload)
        if not fin:
            return None
        message = _message(b"".join(self._parts), self._parts_binary)
        self._parts, self._parts_len = None, 0
        return message


def _message(payload: bytes | bytearray, binary: bool) -> Message:
    """A complete data message; a text message must be UTF-8 (RFC 6455 §8.1), checked on
    the whole message since a character may span fragments."""
    if not binary and not payload.isascii():
        try:
            payload.decode()
        except UnicodeDecodeError as exc:
            raise WsProtocolError(CLOSE_INVALID_DATA, "text message is not UTF-8") from exc
    return _new_message(Message, (payload, binary))


_new_message = tuple.__new__  # Message's fields in order, without its Python __new__
