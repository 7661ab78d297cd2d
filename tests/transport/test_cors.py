"""The Origin check (hearthnet.transport.cors): pure decisions, no sockets."""

from __future__ import annotations

import pytest

from hearthnet.errors import ConfigError
from hearthnet.transport.cors import OriginPolicy, normalise_origin, own_host_names


def test_same_origin_allowed_without_configuration() -> None:
    """With no allowed_origins only the node's own host and port may (by either scheme:
    one port serves both, and a TLS proxy that keeps Host makes https pages of http)."""
    policy = OriginPolicy.from_config(())
    host = "127.0.0.1:7080"
    assert [True, False, True, False, True, False] == [
        policy.allows("http://127.0.0.1:7080", host=host, scheme="http"),
        policy.allows("http://127.0.0.1:7081", host=host, scheme="http"),
        policy.allows("https://127.0.0.1:7080", host=host, scheme="http"),
        policy.allows("null", host=host, scheme="http"),
        policy.allows("http://localhost:7080", host="localhost:7080", scheme="http"),
        policy.allows("https://node.example.evil", host="node.example", scheme="http"),
    ]


def test_own_origin_believed_only_for_the_nodes_own_names() -> None:
    """Host is believed for IP literals, localhost, the host name (and NAME.local), the
    advertised URL's host and allowed_hosts; a DNS-rebound name is refused."""
    names = own_host_names("Hearth-1", "https://hearth.example.org:7443", ["Proxy.Example."])
    policy = OriginPolicy.from_config((), names)
    cases = [
        ("http://[::1]:7080", "[::1]:7080"),
        ("http://app.localhost:7080", "app.localhost:7080"),
        ("http://hearth-1:7080", "hearth-1:7080"),
        ("http://hearth-1.local:7080", "hearth-1.local:7080"),
        ("https://hearth.example.org:7443", "hearth.example.org:7443"),
        ("https://proxy.example", "proxy.example"),
        ("http://rebound.example:7080", "rebound.example:7080"),
        ("http://hearth-1.evil:7080", "hearth-1.evil:7080"),
    ]
    assert [True] * 6 + [False, False] == [
        policy.allows(origin, host=host, scheme="http") for origin, host in cases
    ]


def test_bad_allowed_host_refused() -> None:
    """An allowed_hosts entry with a scheme or port is a configuration error."""
    with pytest.raises(ConfigError):
        own_host_names("h", "", ["https://proxy.example"])
    with pytest.raises(ConfigError):
        own_host_names("h", "", ["proxy.example:443"])


def test_listed_origins_normalised() -> None:
    """Listed origins match regardless of case and default ports; '*' allows any."""
    policy = OriginPolicy.from_config(["HTTPS://App.Example:443", "http://10.0.0.5:8000"])
    anyone = OriginPolicy.from_config(["*"])
    assert [True, True, False, True] == [
        policy.allows("https://app.example", host="node:7080", scheme="http"),
        policy.allows("http://10.0.0.5:8000", host="node:7080", scheme="http"),
        policy.allows("http://10.0.0.5:8001", host="node:7080", scheme="http"),
        anyone.allows("http://evil.example", host="node:7080", scheme="http"),
    ]


def test_bad_origin_in_config_refused() -> None:
    """An entry with a path is a configuration error, not a silent mismatch."""
    with pytest.raises(ConfigError):
        OriginPolicy.from_config(["https://app.example/path"])


def test_preflight_grants_only_known_headers() -> None:
    """The preflight answer lists the requested headers the API uses, nothing else."""
    headers = OriginPolicy().preflight_headers("http://a:1", "X-HearthNet-Token, X-Other")
    assert ("X-HearthNet-Token", "http://a:1") == (
        headers["Access-Control-Allow-Headers"],
        headers["Access-Control-Allow-Origin"],
    )


def test_normalise_ipv6() -> None:
    """IPv6 hosts keep their brackets."""
    assert "http://[::1]:8080" == normalise_origin("http://[::1]:8080")
