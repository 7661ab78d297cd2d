"""WebSocket frames split out of a byte stream, many per read (RFC 6455 §5). Pure.

A peer link's reader hands :class:`FrameSplitter` whatever one socket read returned; it
answers with every message completed by those bytes, in order, and keeps the rest for the
next read. A binary message comes out as its payload (``bytes``), nothing else: the relay
forwards frames by the thousand, and an object per frame is what spec §11's budget of
5 µs per forwarded frame cannot pay for. Text, ping, pong and close come out as
:class:`Control`, a protocol error as :class:`Failure` (last; the splitter reads nothing
after it).

The checks are aiohttp's ``WebSocketReader``'s, in its order and with its close codes
(``tests/mesh/test_wsframes.py`` feeds both the same streams): reserved bits (no
extension is negotiated on peer links), unknown opcodes, fragmented or long control
frames, continuation without a start, a new message inside a fragmented one, close codes
and UTF-8, and the size limit (a data message of ``max_size`` bytes or more is refused as
soon as its header says so, before its payload is buffered). Masked frames are unmasked;
unmasked ones are taken as they are, as aiohttp does.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from hearthnet.transport.websocket import (
    OP_BINARY,
    OP_CLOSE,
    OP_CONTINUATION,
    OP_PING,
    OP_PONG,
    OP_TEXT,
)

_OPCODES = frozenset((OP_CONTINUATION, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG))
_DATA = frozenset((OP_CONTINUATION, OP_TEXT, OP_BINARY))

# RFC 6455 §7.4.1 close codes (those aiohttp's ``WSCloseCode`` names, which it accepts
# below 3000); 3000 and above are for applications and always accepted
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_INVALID_TEXT = 1007
CLOSE_MESSAGE_TOO_BIG = 1009
ALLOWED_CLOSE_CODES = frozenset(
    (1000, 1001, 1002, 1003, 1006, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 1015)
)
MAX_CONTROL_PAYLOAD = 125
_MAX_LENGTH = (1 << 63) - 1  # the largest length a reader holds (aiohttp: sys.maxsize)

_LEN16 = struct.Struct("!H").unpack_from
_LEN64 = struct.Struct("!Q").unpack_from
_CLOSE_CODE = struct.Struct("!H").unpack_from

# unmask(key, payload): XOR ``payload`` in place with the 4-byte ``key`` repeated
Unmask = Callable[[bytes, bytearray], None]


def unmask_pure(key: bytes, payload: bytearray) -> None:
    """RFC 6455 §5.3 unmasking in plain Python (the glue passes a compiled one)."""
    n = len(payload)
    if n:
        keys = int.from_bytes((key * ((n >> 2) + 1))[:n], "little")
        payload[:] = (int.from_bytes(payload, "little") ^ keys).to_bytes(n, "little")


@dataclass(frozen=True, slots=True)
class Control:
    """A message that is not binary: ``opcode`` is :data:`OP_TEXT` (``data`` the UTF-8
    bytes, checked), :data:`OP_PING`, :data:`OP_PONG` or :data:`OP_CLOSE` (``code`` 0 and
    ``reason`` empty when the close frame carried none)."""

    opcode: int
    data: bytes
    code: int = 0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Failure:
    """The stream broke the protocol: close the connection with ``code``."""

    code: int
    reason: str


Event = bytes | Control | Failure


class FrameSplitter:
    """Splits a WebSocket byte stream into messages; fed any chunking of the stream, it
    returns the same messages.

    Bounds: a partial frame is held until complete (at most ``max_size`` bytes of data
    plus a control frame's 125), a fragmented message likewise; ``max_size`` 0 means no
    limit, as in aiohttp.
    """

    __slots__ = (
        "_chunks",
        "_failed",
        "_frag_opcode",
        "_held",
        "_max_size",
        "_need",
        "_partial",
        "_unmask",
        "mixed",
    )

    def __init__(self, max_size: int, unmask: Unmask = unmask_pure) -> None:
        self._max_size = max_size
        self._unmask = unmask
        self._chunks: list[bytes] = []  # bytes of an incomplete frame, joined once whole
        self._held = 0  # their total
        self._need = 0  # bytes the incomplete frame needs in all (0: its header is short)
        self._partial = bytearray()  # the fragments of a message so far
        self._frag_opcode = -1  # the first fragment's opcode, -1 outside a message
        self._failed = False
        # the last feed returned something besides binary payloads (callers that only
        # forward bytes check this once instead of each event's type)
        self.mixed = False

    @property
    def failed(self) -> bool:
        """A :class:`Failure` was returned; the splitter takes no more bytes."""
        return self._failed

    def feed(self, data: bytes) -> list[Event]:
        """The messages ``data`` completes, in stream order."""
        self.mixed = False
        if self._failed or not data:
            return []
        if self._chunks:
            if self._need and self._held + len(data) < self._need:
                self._chunks.append(data)  # still short: no join, no parse (linear in size)
                self._held += len(data)
                return []
            self._chunks.append(data)
            data = b"".join(self._chunks)
            self._chunks.clear()
        out: list[Event] = []
        end = self._split(data, out)
        if end < len(data) and not self._failed:
            rest = data[end:]
            self._chunks.append(rest)
            self._held = len(rest)
        return out

    def _split(self, buf: bytes, out: list[Event]) -> int:
        """Append the messages of ``buf`` to ``out``; the offset of the first byte of the
        first incomplete frame."""
        size = len(buf)
        pos = 0
        view = memoryview(buf)  # a masked payload is copied once, from here, to unmask it
        max_size = self._max_size
        unmask = self._unmask
        append = out.append
        self._need = 0
        while size - pos >= 2:
            first = buf[pos]
            length = buf[pos + 1]
            masked = length & 0x80
            length &= 0x7F
            # FIN, binary, not inside a fragmented message: the usual frame, no more checks
            usual = first == 0x82 and self._frag_opcode < 0
            opcode = OP_BINARY if usual else first & 0x0F
            if not usual:
                if first & 0x70 or opcode not in _OPCODES:
                    return self._fail(out, first, opcode)
                if opcode > 0x7 and (not first & 0x80 or length > MAX_CONTROL_PAYLOAD):
                    return self._fail(out, first, opcode)
            if length < 126:
                head = pos + 2
            elif length == 126:
                if size - pos < 4:
                    break
                length = _LEN16(buf, pos + 2)[0]
                head = pos + 4
            else:
                if size - pos < 10:
                    break
                length = _LEN64(buf, pos + 2)[0]
                head = pos + 10
                if length > _MAX_LENGTH:
                    return self._too_big(out, length)
            if max_size and length >= max_size - len(self._partial) and opcode in _DATA:
                return self._too_big(out, length)
            start = head + 4 if masked else head
            stop = start + length
            if stop > size:
                self._need = stop - pos
                break
            if masked:
                body = bytearray(view[start:stop])
                unmask(buf[head:start], body)
                payload = bytes(body)
            else:
                payload = buf[start:stop]
            pos = stop
            if usual:
                append(payload)
            elif not self._message(first, opcode, payload, out):
                return pos
        return pos

    def _message(self, first: int, opcode: int, payload: bytes, out: list[Event]) -> bool:
        """One frame other than a whole binary message; False once failed."""
        self.mixed = True
        if opcode == OP_CLOSE:
            out.append(self._close(payload) if payload else Control(OP_CLOSE, b""))
            if isinstance(out[-1], Failure):
                self._failed = True
                return False
            return True
        if opcode in (OP_PING, OP_PONG):
            out.append(Control(opcode, payload))
            return True
        if opcode == OP_CONTINUATION and self._frag_opcode < 0:
            return self._protocol_error(out, "continuation frame for a message not started")
        if not first & 0x80:  # a fragment, more to come
            if opcode != OP_CONTINUATION:
                if self._frag_opcode >= 0:
                    return self._protocol_error(out, "a new message inside a fragmented one")
                self._frag_opcode = opcode
            self._partial += payload
            return True
        if opcode == OP_CONTINUATION:
            opcode, self._frag_opcode = self._frag_opcode, -1
        elif self._partial:
            return self._protocol_error(out, "a new message inside a fragmented one")
        if self._partial:
            payload = bytes(self._partial + payload)
            self._partial.clear()
        if opcode == OP_BINARY:
            out.append(payload)
            return True
        try:
            payload.decode("utf-8")
        except UnicodeDecodeError:
            out.append(Failure(CLOSE_INVALID_TEXT, "invalid UTF-8 text message"))
            self._failed = True
            return False
        out.append(Control(OP_TEXT, payload))
        return True

    @staticmethod
    def _close(payload: bytes) -> Control | Failure:
        if len(payload) < 2:
            return Failure(CLOSE_PROTOCOL_ERROR, "a close frame of one byte")
        code = _CLOSE_CODE(payload)[0]
        if code < 3000 and code not in ALLOWED_CLOSE_CODES:
            return Failure(CLOSE_PROTOCOL_ERROR, f"invalid close code {code}")
        try:
            reason = payload[2:].decode("utf-8")
        except UnicodeDecodeError:
            return Failure(CLOSE_INVALID_TEXT, "invalid UTF-8 in a close reason")
        return Control(OP_CLOSE, payload, code, reason)

    def _fail(self, out: list[Event], first: int, opcode: int) -> int:
        if first & 0x70:
            reason = "a frame with reserved bits set"
        elif opcode not in _OPCODES:
            reason = f"unexpected opcode {opcode}"
        elif not first & 0x80:
            reason = "a fragmented control frame"
        else:
            reason = f"a control frame over {MAX_CONTROL_PAYLOAD} bytes"
        self._protocol_error(out, reason)
        return 0

    def _too_big(self, out: list[Event], length: int) -> int:
        total = length + len(self._partial)
        out.append(Failure(CLOSE_MESSAGE_TOO_BIG, f"message of {total} bytes over the limit"))
        self.mixed = True
        self._failed = True
        return 0

    def _protocol_error(self, out: list[Event], reason: str) -> bool:
        out.append(Failure(CLOSE_PROTOCOL_ERROR, reason))
        self.mixed = True
        self._failed = True
        return False
