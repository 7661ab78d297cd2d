"""The Origin check (hearthnet.transport.cors): pure decisions, no sockets."""

from __future__ import annotations

import pytest

from hearthnet.errors import ConfigError
from hearthnet.transport.cors import OriginPolicy, normalise_origin


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
        policy.allows("https://node.example", host="node.example", scheme="http"),
        policy.allows("https://node.example.evil", host="node.example", scheme="http"),
    ]


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
