"""Which web pages may use the node from a browser: the ``Origin`` check and CORS.

A browser names the page a request comes from in the ``Origin`` header (fetch, XHR,
EventSource in CORS mode, and every WebSocket upgrade). The node serves a request that
carries one only when the origin is the node's own (the host and port of the request's
``Host``, by either scheme) or is listed in ``[security] allowed_origins``; anything else is
refused with ``forbidden`` before a handler runs, and a refused WebSocket upgrade never
gets its ``101``.

``Host`` is the page's own claim, so it is believed only for names the node knows are its
own: an IP literal, ``localhost`` (and ``*.localhost``), the machine's host name (also as
``NAME.local``), the host of ``[mesh] advertise_url``, and ``[security] allowed_hosts``.
A page on a name an attacker rebinds to the node's address (DNS rebinding) sends that name
as ``Host`` and ``Origin`` alike, and is refused.

Requests without ``Origin`` (the Python client, the CLI, peer links, curl) are not
browsers' and are not affected: their credentials are the signature or the token, as
always.

Allowed cross-origin requests get ``Access-Control-Allow-Origin`` with that origin, and
preflights (``OPTIONS`` with ``Access-Control-Request-Method``) are answered here with the
methods and headers the API uses. Credentials in cookies are never used by the node, so
``Access-Control-Allow-Credentials`` is never sent.

:class:`OriginPolicy` is pure; :func:`cors_hooks` is the aiohttp glue.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from hearthnet.errors import ConfigError

ALLOW_METHODS = "GET, POST, OPTIONS"
# The headers a browser client sends (spec §2.2); Content-Type for JSON bodies, Accept for
# SSE calls, Last-Event-ID for a resumed EventSource, Authorization for a token sent as
# `Bearer hnt1:...`.
ALLOW_HEADERS = frozenset(
    {
        "accept",
        "content-type",
        "last-event-id",
        "x-hearthnet-capability",
        "x-hearthnet-capability-version",
        "x-hearthnet-request-id",
        "x-hearthnet-from",
        "x-hearthnet-token",
        "authorization",
        "x-hearthnet-community",
        "x-hearthnet-timestamp",
        "x-hearthnet-signature",
        "x-hearthnet-target",
        "x-hearthnet-deadline-ms",
    }
)
EXPOSE_HEADERS = "Retry-After"
PREFLIGHT_MAX_AGE_S = 600
ANY_ORIGIN = "*"


def normalise_origin(text: str) -> str:
    """``scheme://host[:port]`` in lower case, default ports dropped; ``null`` stays.

    Raises:
        ValueError: not an origin (a path, a query, no scheme or host).
    """
    text = text.strip()
    if text == "null":
        return text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{text!r} is not an origin like https://example.org:8443")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise ValueError(f"{text!r} is not an origin: scheme, host and port only")
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    default = 443 if parts.scheme == "https" else 80
    return f"{parts.scheme}://{host}" + (f":{port}" if port and port != default else "")


def normalise_host(text: str) -> str:
    """A host name as ``[security] allowed_hosts`` lists it: lower case, no trailing dot,
    no port.

    Raises:
        ValueError: empty, or with a scheme, path, port or characters no host name has.
    """
    host = text.strip().lower().rstrip(".")
    if not host or any(c in host for c in "/:@ ?#[]"):
        raise ValueError(f"{text!r} is not a host name like node.example.org")
    return host


def is_own_name(host: str, names: frozenset[str]) -> bool:
    """Whether ``host`` (no port, lower case) is one the node may believe a ``Host`` header
    about: an IP literal, ``localhost`` or ``*.localhost`` (browsers resolve these to
    loopback themselves), or one of ``names``."""
    host = host.rstrip(".")
    if host == "localhost" or host.endswith(".localhost") or host in names:
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def own_host_names(
    hostname: str, advertise_url: str, allowed_hosts: Iterable[str]
) -> frozenset[str]:
    """The names this node answers to: the machine's host name (and ``NAME.local``, as
    zeroconf publishes it), the host of its advertised URL, and the configured ones.

    Raises:
        ConfigError: an ``allowed_hosts`` entry that is not a host name.
    """
    names: set[str] = set()
    if hostname.strip():
        short = hostname.strip().lower().rstrip(".")
        names.update({short, f"{short.split('.', 1)[0]}.local"})
    advertised = urlsplit(advertise_url).hostname if advertise_url else None
    if advertised:
        names.add(advertised.lower())
    for entry in allowed_hosts:
        try:
            names.add(normalise_host(entry))
        except ValueError as exc:
            raise ConfigError(f"[security] allowed_hosts: {exc}") from None
    return frozenset(names)


@dataclass(frozen=True, slots=True)
class OriginPolicy:
    """The node's own origin, plus the configured ones (``*``: any origin). ``own_names``
    are the host names a ``Host`` header is believed for (besides IP literals and
    ``localhost``)."""

    allowed: frozenset[str] = frozenset()
    any_origin: bool = False
    own_names: frozenset[str] = frozenset()

    @classmethod
    def from_config(
        cls, origins: Iterable[str], own_names: frozenset[str] = frozenset()
    ) -> OriginPolicy:
        """Parse ``[security] allowed_origins``; ``own_names`` from :func:`own_host_names`.

        Raises:
            ConfigError: an entry that is not an origin.
        """
        allowed: set[str] = set()
        any_origin = False
        for entry in origins:
            if entry.strip() == ANY_ORIGIN:
                any_origin = True
                continue
            try:
                allowed.add(normalise_origin(entry))
            except ValueError as exc:
                raise ConfigError(f"[security] allowed_origins: {exc}") from None
        return cls(frozenset(allowed), any_origin, own_names)

    def allows(self, origin: str, *, host: str | None, scheme: str) -> bool:
        """Whether a request from page ``origin`` to this node (reached as ``host`` over
        ``scheme``) may be served."""
        if self.any_origin:
            return True
        try:
            normal = normalise_origin(origin)
        except ValueError:
            return False
        if normal in self.allowed:
            return True
        if host is None or normal == "null":
            return False
        try:
            own = normalise_origin(f"{scheme}://{host}")
        except ValueError:
            return False
        # Host is believed only for a name the node knows as its own (DNS rebinding sends
        # the attacker's name in both headers).
        if not is_own_name(urlsplit(own).hostname or "", self.own_names):
            return False
        # The scheme is not compared: the port serves TLS and plain HTTP alike, and behind a
        # TLS-terminating proxy that keeps Host the node sees http where the page has https.
        return normal.split("://", 1)[1] == own.split("://", 1)[1]

    def preflight_headers(self, origin: str, requested: str) -> dict[str, str]:
        """The answer to an allowed preflight: methods, and the requested headers that
        the API knows (others are left out, so the browser refuses to send them)."""
        wanted = [h.strip() for h in requested.split(",") if h.strip()]
        granted = [h for h in wanted if h.lower() in ALLOW_HEADERS]
        headers = {
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": ALLOW_METHODS,
            "Access-Control-Max-Age": str(PREFLIGHT_MAX_AGE_S),
            "Vary": "Origin",
        }
        if granted:
            headers["Access-Control-Allow-Headers"] = ", ".join(granted)
        return headers


def response_headers(origin: str) -> dict[str, str]:
    """What an allowed cross-origin response carries."""
    return {
        "Access-Control-Allow-Origin": origin,
        "Access-Control-Expose-Headers": EXPOSE_HEADERS,
        "Vary": "Origin",
    }


def origin_of(headers: Mapping[str, str]) -> str | None:
    """The ``Origin`` header (lower-case keys or a case-insensitive mapping)."""
    return headers.get("origin") or headers.get("Origin")
