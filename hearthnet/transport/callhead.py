"""Which requests the lean call path serves (spec §3.3): the head of a plain signed
``POST /bus/v1/call``, read strictly. Pure: bytes in, a :class:`PlainCall` or None out.

The lean path (:mod:`hearthnet.transport.callpath`) answers only requests whose head is
exactly of one shape: the request line ``POST /bus/v1/call HTTP/1.1``, a ``Host``, one
``Content-Length`` of ASCII digits within the body limit, every header line a token, a
colon and a value without control characters, and none of the headers that change how
the body is framed or who may send it (``Transfer-Encoding``, ``Content-Encoding``,
``Expect``, ``Upgrade``, ``Origin``), no ``Accept: text/event-stream``, no more than the
header limits of spec §2.5, all of it ASCII, no header name twice. Anything else,
well-formed or not, is not
refused here: it is left to the node's full HTTP server (aiohttp behind the one middleware), which
answers it as it always has, so the lean path never has to say less than that server
would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

CALL_PATH = "/bus/v1/call"
REQUEST_LINE = b"POST /bus/v1/call HTTP/1.1"
# Bytes a header value may hold here: visible ASCII and blanks (RFC 9110 §5.5; obs-text,
# which servers decode differently, is left to the full server); bytes a header name may
# hold (a token, RFC 9110 §5.6.2).
_VALUE_BYTES = bytes([0x09, *range(0x20, 0x7F)])
_TOKEN_BYTES = b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
# Headers whose presence sends a request to the full server: body framing it handles
# (chunked, encodings, 100-continue), upgrades, browser origins (the CORS check).
_NOT_PLAIN = ("transfer-encoding", "content-encoding", "expect", "upgrade", "origin")


@dataclass(frozen=True, slots=True)
class CallHeadLimits:
    """The bounds a lean head is held to (spec §2.5: ``[transport] max_headers``,
    ``max_header_bytes``, ``max_body_bytes``)."""

    max_headers: int = 128
    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 1 << 20


class PlainCall(NamedTuple):
    """A head the lean path serves: its headers (by lower-case name, each name once),
    body length, and whether the client asked for the connection to close after the
    answer (a named tuple: built on every call, several times faster than a frozen
    dataclass)."""

    headers: dict[str, str]
    content_length: int
    close: bool


def plain_call(head: bytes, limits: CallHeadLimits) -> PlainCall | None:
    """Read a request head (up to, not including, the blank line); None when it is not a
    plain call, which the full HTTP server then answers."""
    line, _, fields = head.partition(b"\r\n")
    if line != REQUEST_LINE or not fields or len(fields) > limits.max_header_bytes:
        return None
    lines = fields.decode("latin-1").split("\r\n")
    # what is left without the value bytes: the line ends and nothing else (no control
    # character, no bare CR or LF, nothing outside ASCII)
    if len(lines) > limits.max_headers or (
        fields.translate(None, _VALUE_BYTES) != b"\r\n" * (len(lines) - 1)
    ):
        return None
    parts = [text.partition(":") for text in lines]
    # every line a name and a colon, every name a token (no blank before the colon, no
    # obs-fold)
    names = [name for name, colon, _ in parts if colon and name]
    if len(names) != len(parts) or "".join(names).encode("ascii").translate(None, _TOKEN_BYTES):
        return None
    # by lower-case name (the header lookups of hearthnet.transport.headers use those); a
    # name twice (in any case) is left to the full server, which reads the first
    headers = {name.lower(): value.strip(" \t") for name, _, value in parts}
    if len(headers) != len(parts) or "host" not in headers:
        return None
    for name in _NOT_PLAIN:
        if name in headers:
            return None
    size = headers.get("content-length")
    if size is None or not (size.isascii() and size.isdigit()):
        return None
    length = int(size) if len(size) < 19 else limits.max_body_bytes + 1
    if length > limits.max_body_bytes or "text/event-stream" in headers.get("accept", ""):
        return None
    close = False
    connection = headers.get("connection")
    if connection is not None:
        option = connection.lower()
        if option == "close":
            close = True
        elif option != "keep-alive":
            return None
    return PlainCall(headers, length, close)
