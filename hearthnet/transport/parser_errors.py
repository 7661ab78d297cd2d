"""aiohttp's connection handler, with what its HTTP parser refuses answered in JSON
(spec §2.4) instead of aiohttp's plain text.

aiohttp answers a request its parser refuses (a bad method, header name or folded line,
a negative Content-Length, a bad chunk size, control characters in a header value, a
line over its limit, a Content-Encoding it cannot decode) with a plain-text 400 before
any middleware runs. The front door reads the first head of a connection itself, but a
later request on a kept-alive connection, and what lies past a head, reach only aiohttp.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import ContentEncodingError, HttpProcessingError, LineTooLong
from aiohttp.web_protocol import RequestHandler

from hearthnet.errors import BadRequest, HeadersTooLarge, InternalError, WireError
from hearthnet.metrics import Counter

log = logging.getLogger("hearthnet.transport")

_MESSAGE_CHARS = 200  # of the parser's own words, which quote the offending bytes


def parser_error(status: int, exc: BaseException | None) -> WireError:
    """The spec §2.4 error for what aiohttp's parser raised (``status`` as aiohttp set it;
    500 when a handler raised past every middleware)."""
    if isinstance(exc, LineTooLong):
        return HeadersTooLarge("a request line or header line is over the limit")
    if isinstance(exc, ContentEncodingError):
        return BadRequest("unsupported Content-Encoding")
    if isinstance(exc, HttpProcessingError) or status < 500:
        words = exc.message if isinstance(exc, HttpProcessingError) else ""
        first = str(words).strip().split("\n", 1)[0].rstrip(":")[:_MESSAGE_CHARS]
        return BadRequest(f"malformed request: {first}" if first else "malformed request")
    return InternalError("the request could not be handled")


class JsonErrorsHandler(RequestHandler):
    """One connection's aiohttp handler whose error answers are spec §2.2 JSON bodies;
    each parser refusal is counted like the front door's (``requests_refused``)."""

    __slots__ = ("_requests_refused",)

    def __init__(
        self,
        manager: web.Server,
        *,
        loop: asyncio.AbstractEventLoop,
        requests_refused: Counter,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, loop=loop, **kwargs)
        self._requests_refused = requests_refused

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """The JSON answer to a refused request; the connection closes after it."""
        if request.writer.output_size > 0:  # as aiohttp: nothing more can be said
            raise ConnectionError("a response was already under way")
        error = parser_error(status, exc)
        if isinstance(error, InternalError):
            self.log_exception("error handling a request from %s", request.remote, exc_info=exc)
        else:
            # a peer's malformed input: counted, not worth a traceback at error level
            log.debug("refused a request from %s: %s", request.remote, exc)
        self._requests_refused.inc(error.code, "http")
        response = web.Response(
            status=error.http_status,
            body=orjson.dumps(error.to_wire()),
            content_type="application/json",
        )
        response.force_close()
        return response
