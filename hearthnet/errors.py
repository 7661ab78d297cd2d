"""The one exception root of HearthNet, and the wire error codes of spec §2.4.

Tree::

    HearthNetError                      anything HearthNet raises on purpose
    ├── WireError                       has a wire code (spec §2.4) and an HTTP status
    │   ├── BadRequest                  bad_request        400
    │   │   ├── WrongFrameType          binary frame on a JSON subprotocol (or text on CBOR)
    │   │   └── NotCanonical            a value canonical JSON cannot represent exactly
    │   ├── SchemaMismatch              schema_mismatch    400
    │   ├── PayloadTooLarge             payload_too_large  413
    │   │   └── HeadersTooLarge         too many headers, or too many header bytes: 431
    │   ├── InvalidSignature            invalid_signature  401
    │   ├── Unauthorized                unauthorized       401
    │   ├── Revoked                     revoked            403
    │   ├── Forbidden                   forbidden          403
    │   ├── NotFound                    not_found          404
    │   ├── DeadlineExceeded            timeout            408
    │   ├── Expired                     expired            410
    │   ├── Replayed                    replayed           409
    │   ├── RateLimited                 rate_limited       429
    │   ├── CapacityExceeded            capacity_exceeded  429
    │   ├── UpgradeRequired             upgrade_required   426
    │   ├── InternalError               internal_error     500
    │   ├── Unavailable                 unavailable        503
    │   └── Cancelled                   cancelled          499
    ├── ConfigError                     our own configuration is wrong (local)
    ├── IdentityError                   key files missing, unreadable or too open (local)
    ├── StorageError                    the SQLite store failed (local)
    ├── NodeNotRunning                  a CLI command found no running node (local)
    └── UsageError                      a command line that cannot work as given (local)

A ``WireError`` raised while handling input from a client or peer means *the
remote side* sent something we refuse; it is answered with its code and
counted. A ``WireError`` raised by :mod:`hearthnet.client` means the node
answered with that code (``remote`` is then true). The other branches are
local: we, or the person running us, misused something.
"""

from __future__ import annotations

from typing import Any, ClassVar


class HearthNetError(Exception):
    """Root of every exception HearthNet raises on purpose."""


class WireError(HearthNetError):
    """An error with a wire code from spec §2.4.

    Attributes:
        code: the wire code clients switch on.
        http_status: the HTTP status that carries it.
        retry_after_ms: for ``rate_limited`` / ``unavailable``, when to retry.
        remote: true when this error was received from a node rather than raised here.
    """

    code: ClassVar[str] = "internal_error"
    http_status: ClassVar[int] = 500

    def __init__(
        self,
        message: str = "",
        *,
        retry_after_ms: int | None = None,
        remote: bool = False,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message or self.code)
        self.message = message or self.code
        self.retry_after_ms = retry_after_ms
        self.remote = remote
        self.extra = dict(extra or {})

    def to_wire(self) -> dict[str, Any]:
        """The JSON error body of spec §2.2: ``{"error", "message", "retry_after_ms"?}``."""
        body: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.retry_after_ms is not None:
            body["retry_after_ms"] = self.retry_after_ms
        body.update(self.extra)
        return body

    def to_frame_data(self) -> dict[str, Any]:
        """The data of an ``error`` stream frame: ``{"code", "message", ...}``."""
        data: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.retry_after_ms is not None:
            data["retry_after_ms"] = self.retry_after_ms
        data.update(self.extra)
        return data


class BadRequest(WireError):
    """Malformed JSON, header or frame."""

    code = "bad_request"
    http_status = 400


class WrongFrameType(BadRequest):
    """A binary WebSocket frame on a JSON subprotocol, or text on CBOR (close 1003)."""


class NotCanonical(BadRequest):
    """Well-formed input holding a value canonical JSON cannot represent exactly (spec §2.5):
    an integer beyond ±2^53, a number that would not round-trip, a CBOR tag, bytes, a
    non-string key, or nesting deeper than 64. The message it came in is refused; the
    connection that carried it can go on."""


class SchemaMismatch(WireError):
    """The body fails the capability's request schema."""

    code = "schema_mismatch"
    http_status = 400


class PayloadTooLarge(WireError):
    """A body, frame or payload is over its size limit."""

    code = "payload_too_large"
    http_status = 413


class HeadersTooLarge(PayloadTooLarge):
    """Too many request headers, or a header block over its size limit (spec §2.5)."""

    http_status = 431


class InvalidSignature(WireError):
    """A signature or token does not verify."""

    code = "invalid_signature"
    http_status = 401


class Unauthorized(WireError):
    """Not a member, level too low, or token scope insufficient."""

    code = "unauthorized"
    http_status = 401


class Revoked(WireError):
    """The identity or token was revoked."""

    code = "revoked"
    http_status = 403


# What the operator of a revoked node is told to do, in its log and by its commands.
REJOIN_ADVICE = (
    "to take part again, stop this node and join with a new key: hearthnet node start"
    " --data-dir NEW_DIR --join hn1:..., an invite a member prints with hearthnet"
    " community invite"
)


class Forbidden(WireError):
    """An access rule denies this topic or capability."""

    code = "forbidden"
    http_status = 403


class NotFound(WireError):
    """No such capability provider, topic history or resource."""

    code = "not_found"
    http_status = 404


class DeadlineExceeded(WireError):
    """The call's deadline passed (wire code ``timeout``)."""

    code = "timeout"
    http_status = 408


class Expired(WireError):
    """Timestamp outside the window, or token or invite expired."""

    code = "expired"
    http_status = 410


class Replayed(WireError):
    """The request id was already seen."""

    code = "replayed"
    http_status = 409


class RateLimited(WireError):
    """Over a rate budget; ``retry_after_ms`` says when to retry."""

    code = "rate_limited"
    http_status = 429


class CapacityExceeded(WireError):
    """Provider at ``max_concurrent``, or a connection limit reached."""

    code = "capacity_exceeded"
    http_status = 429


class UpgradeRequired(WireError):
    """WebSocket subprotocol not supported, or the capability does not stream."""

    code = "upgrade_required"
    http_status = 426


class InternalError(WireError):
    """A bug on the node; logged with the request id."""

    code = "internal_error"
    http_status = 500


class Unavailable(WireError):
    """Peer or relay unreachable, or the node is overloaded."""

    code = "unavailable"
    http_status = 503


class Cancelled(WireError):
    """The caller cancelled (only inside streams)."""

    code = "cancelled"
    http_status = 499


class ConfigError(HearthNetError):
    """The configuration file, environment or flags are invalid."""


class IdentityError(HearthNetError):
    """Key files are missing, malformed or readable by others."""


class StorageError(HearthNetError):
    """The embedded SQLite store failed."""


class NodeNotRunning(HearthNetError):
    """No running node was found (no ``run/node.json`` and no ``--url``)."""


class UsageError(HearthNetError):
    """A command line that cannot work as given (``hearthnet call`` of a streaming
    capability without ``--stream``); the CLI exits 2 and the message says what to type."""


WIRE_ERRORS: dict[str, type[WireError]] = {
    cls.code: cls
    for cls in (
        BadRequest,
        SchemaMismatch,
        PayloadTooLarge,
        InvalidSignature,
        Unauthorized,
        Revoked,
        Forbidden,
        NotFound,
        DeadlineExceeded,
        Expired,
        Replayed,
        RateLimited,
        CapacityExceeded,
        UpgradeRequired,
        InternalError,
        Unavailable,
        Cancelled,
    )
}


def error_from_wire(body: dict[str, Any], *, remote: bool = True) -> WireError:
    """Build the matching :class:`WireError` from an error body or error frame data.

    Accepts both ``{"error": code, ...}`` (HTTP body) and ``{"code": code, ...}``
    (stream frame). An unknown code becomes :class:`InternalError` that keeps
    the unknown code in its message, so a newer node never crashes an older client.
    """
    code = body.get("error", body.get("code"))
    message = str(body.get("message", ""))
    retry = body.get("retry_after_ms")
    retry_after_ms = retry if isinstance(retry, int) else None
    cls = WIRE_ERRORS.get(code) if isinstance(code, str) else None
    extra = {
        k: v for k, v in body.items() if k not in ("error", "code", "message", "retry_after_ms")
    }
    if cls is None:
        return InternalError(f"unknown error code {code!r}: {message}", remote=remote, extra=extra)
    return cls(message, retry_after_ms=retry_after_ms, remote=remote, extra=extra)
