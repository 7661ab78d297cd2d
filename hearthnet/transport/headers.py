"""The X-HearthNet-* request headers (spec §2.2, §2.3), and a token in the usual HTTP
place, ``Authorization: Bearer hnt1:...``. Pure parsing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from hearthnet.errors import BadRequest

CAPABILITY = "X-HearthNet-Capability"
VERSION = "X-HearthNet-Capability-Version"
REQUEST_ID = "X-HearthNet-Request-Id"
FROM = "X-HearthNet-From"
TOKEN = "X-HearthNet-Token"  # noqa: S105 - a header name, not a secret
COMMUNITY = "X-HearthNet-Community"
TIMESTAMP = "X-HearthNet-Timestamp"
SIGNATURE = "X-HearthNet-Signature"
TARGET = "X-HearthNet-Target"
DEADLINE = "X-HearthNet-Deadline-Ms"
# The names as looked up: lower case, so that a plain dict keyed by lower-case names (the
# lean call path's) serves as well as a case-insensitive multidict (aiohttp's).
_CAPABILITY = CAPABILITY.lower()
_VERSION = VERSION.lower()
_REQUEST_ID = REQUEST_ID.lower()
_FROM = FROM.lower()
_TOKEN = TOKEN.lower()
_COMMUNITY = COMMUNITY.lower()
_TIMESTAMP = TIMESTAMP.lower()
_SIGNATURE = SIGNATURE.lower()
_TARGET = TARGET.lower()
_DEADLINE = DEADLINE.lower()
_AUTHORIZATION = "authorization"
# A token is "hnt1:" + base64url (hearthnet.tokens.TOKEN_PREFIX); only such a credential
# is taken from Authorization, so a proxy's own (Basic, or its Bearer JWT) is left alone.
_BEARER_TOKEN_PREFIX = "hnt1:"  # noqa: S105 - a format prefix, not a secret


class SignedHeaders(NamedTuple):
    """Credentials carried in headers: a signature over an envelope, or a token.

    (This and :class:`CallHeaders` are read on every call: a named tuple is built
    several times faster than a frozen dataclass.)"""

    request_id: str | None
    sender: str | None
    community: str | None
    ts: int | None
    signature: str | None
    token: str | None


class CallHeaders(NamedTuple):
    """Everything a ``POST /bus/v1/call`` says in its headers."""

    capability: str
    version: str
    signed: SignedHeaders
    target: str | None
    deadline_ms: int | None


def parse_int(raw: str, name: str, *, minimum: int) -> int:
    """An integer header or query value: ASCII digits with an optional minus sign, at most
    16 characters (``isdigit`` alone lets ``²`` and ``--5`` through to ``int()``).

    Raises:
        BadRequest: not such an integer, or below ``minimum``.
    """
    raw = raw.strip()
    digits = raw[1:] if raw.startswith("-") else raw
    if not (digits.isascii() and digits.isdigit()) or len(raw) > 16:
        raise BadRequest(f"{name} must be an integer")
    value = int(raw)
    if value < minimum:
        raise BadRequest(f"{name} must be at least {minimum}")
    return value


def _int_header(headers: Mapping[str, str], name: str, *, minimum: int) -> int | None:
    raw = headers.get(name.lower())
    return None if raw is None else parse_int(raw, name, minimum=minimum)


def read_deadline(headers: Mapping[str, str]) -> int | None:
    """``X-HearthNet-Deadline-Ms`` (milliseconds, at least 1), or None when absent.

    Raises:
        BadRequest: the header is not a positive integer.
    """
    return _int_header(headers, DEADLINE, minimum=1)


def read_signed_headers(
    headers: Mapping[str, str], *, query_token: str | None = None
) -> SignedHeaders:
    """Read the credential headers. The token is X-HearthNet-Token's, else that of an
    ``Authorization: Bearer hnt1:...`` (:func:`bearer_token`), else ``?token=`` (a
    browser EventSource cannot set headers).

    Raises:
        BadRequest: a timestamp that is not an integer.
    """
    get = headers.get
    ts = get(_TIMESTAMP)
    return SignedHeaders(
        get(_REQUEST_ID),
        get(_FROM),
        get(_COMMUNITY),
        None if ts is None else parse_int(ts, TIMESTAMP, minimum=0),
        get(_SIGNATURE),
        get(_TOKEN) or bearer_token(get(_AUTHORIZATION)) or query_token,
    )


def bearer_token(authorization: str | None) -> str | None:
    """The HearthNet token an ``Authorization`` header carries as ``Bearer hnt1:...`` (the
    scheme in any case), or None: no header, another scheme, or a credential that is not
    a HearthNet token (a proxy in front of the node may use the header for itself)."""
    if not authorization:
        return None
    scheme, _, credential = authorization.strip().partition(" ")
    credential = credential.strip()
    if scheme.lower() != "bearer" or not credential.startswith(_BEARER_TOKEN_PREFIX):
        return None
    return credential


def read_call_headers(headers: Mapping[str, str]) -> CallHeaders:
    """Read the headers of a capability call. Token calls need only the token; the
    node fills in request id, community and time.

    Raises:
        BadRequest: a required header is missing or malformed.
    """
    get = headers.get
    capability = get(_CAPABILITY)
    version = get(_VERSION)
    if not capability or not version:
        raise BadRequest(f"{CAPABILITY} and {VERSION} are required")
    signed = read_signed_headers(headers)
    if signed.token is None and None in signed:
        missing = [
            n
            for n, v in (
                (REQUEST_ID, signed.request_id),
                (FROM, signed.sender),
                (COMMUNITY, signed.community),
                (TIMESTAMP, signed.ts),
                (SIGNATURE, signed.signature),
            )
            if v is None
        ]
        if missing:
            raise BadRequest(
                f"missing headers: {', '.join(missing)}"
                f" (or a token: {TOKEN}, or Authorization: Bearer hnt1:...)"
            )
    deadline = get(_DEADLINE)
    return CallHeaders(
        capability.strip(),
        version.strip(),
        signed,
        get(_TARGET),
        None if deadline is None else parse_int(deadline, DEADLINE, minimum=1),
    )
