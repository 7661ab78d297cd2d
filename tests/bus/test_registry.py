"""Descriptors, version matching, the registry and provider choice (spec §2.1, §2.3)."""

from __future__ import annotations

import pytest

from capabilities.echo import Echo, EchoStream
from capabilities.mesh_info import MeshPeers, MeshTopics
from capabilities.pubsub_publish import PubSubPublish
from hearthnet.bus.capability import CallContext
from hearthnet.bus.descriptor import CapabilityDescriptor, version_satisfies
from hearthnet.bus.registry import CapabilityRegistry
from hearthnet.bus.routing import HEALTH_WINDOW, LocalProvider, ProviderHealth, Router
from hearthnet.errors import (
    BadRequest,
    CapacityExceeded,
    ConfigError,
    NotFound,
    SchemaMismatch,
    Unavailable,
)


class Versioned:
    """A unary capability at a given version."""

    def __init__(self, version: str, max_concurrent: int = 4) -> None:
        self.descriptor = CapabilityDescriptor(
            name="thing", version=version, max_concurrent=max_concurrent
        )

    async def call(self, ctx: CallContext, value: object) -> dict[str, object]:
        """Say which version answered."""
        return {"version": self.descriptor.version}


@pytest.mark.parametrize(
    ("offered", "requested", "ok"),
    [
        ("2.0", "2.0", True),
        ("2.3", "2.1", True),
        ("2.0", "2.1", False),
        ("3.0", "2.0", False),
        ("1.9", "2.0", False),
    ],
)
def test_version_matching(offered: str, requested: str, ok: bool) -> None:
    """X.Y satisfies A.B iff X == A and Y >= B."""
    assert ok == version_satisfies(offered, requested)


def test_registry_resolves_highest_compatible_minor() -> None:
    """With 2.0, 2.4 and 3.1 offered, a request for 2.1 gets 2.4; 2.5 gets nothing."""
    reg = CapabilityRegistry()
    for v in ("2.0", "2.4", "3.1"):
        reg.register(Versioned(v))
    found = reg.resolve("thing", "2.1")
    assert ("2.4", None) == (
        found.descriptor.version if found else None,
        reg.resolve("thing", "2.5"),
    )


def test_registering_twice_or_without_handler_is_a_config_error() -> None:
    """The same name@version twice, or a streaming descriptor with no stream(), is refused."""
    reg = CapabilityRegistry()
    reg.register(Versioned("1.0"))
    with pytest.raises(ConfigError):
        reg.register(Versioned("1.0"))

    class NoStream:
        descriptor = CapabilityDescriptor(name="s", version="1.0", stream_schema={})

    with pytest.raises(ConfigError):
        reg.register(NoStream())


def test_descriptor_validates_names_and_schema() -> None:
    """Bad names, versions or schemas are refused when the descriptor is made."""
    for kwargs in (
        {"name": "Bad Name", "version": "1.0"},
        {"name": "x", "version": "1"},
        {"name": "x", "version": "1.0", "request_schema": {"type": "nope"}},
    ):
        with pytest.raises(BadRequest):
            CapabilityDescriptor(**kwargs)


def test_descriptors_with_the_same_schema_share_one_checked_validator() -> None:
    """Peers announce the same descriptors every few seconds: the schema is checked and
    compiled once (keys in any order), and a bad schema is refused every time."""
    schema_a = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    schema_b = {"required": ["q"], "properties": {"q": {"type": "string"}}, "type": "object"}
    one = CapabilityDescriptor("search", "1.0", request_schema=schema_a)
    two = CapabilityDescriptor("search", "1.0", request_schema=schema_b)
    assert one._validator is two._validator
    for _ in range(2):
        with pytest.raises(BadRequest):
            CapabilityDescriptor("x", "1.0", request_schema={"type": 5})
    with pytest.raises(BadRequest, match="not JSON"):
        CapabilityDescriptor("x", "1.0", request_schema={"type": {1, 2}})


def test_the_node_s_own_schemas_are_valid_and_checked_on_first_call() -> None:
    """The built-in capabilities' schemas, which a node no longer checks when it starts,
    pass the meta-schema check; a schema checked on first call is refused then."""
    own = [c.descriptor for c in (Echo, EchoStream, MeshPeers, MeshTopics, PubSubPublish)]
    assert [True] * len(own) == [d.check_on_first_call for d in own]
    checked = [d.check_schema() for d in own]  # BadRequest if one is invalid
    assert len(own) == sum(v is not None for v in checked)
    bad = CapabilityDescriptor("x", "1.0", request_schema={"type": 5}, check_on_first_call=True)
    with pytest.raises(BadRequest, match="invalid request_schema"):
        bad.validate_input({})
    open_schema = CapabilityDescriptor("y", "1.0", check_on_first_call=True)
    open_schema.validate_input({"any": ["thing"]})
    assert None is open_schema._validator


def test_schema_mismatch_names_the_path() -> None:
    """echo.stream's schema refuses a negative count and says where."""
    with pytest.raises(SchemaMismatch, match="count"):
        EchoStream.descriptor.validate_input({"count": -1})
    with pytest.raises(SchemaMismatch):
        EchoStream.descriptor.validate_input({"count": 1, "extra": True})
    EchoStream.descriptor.validate_input({"count": 3, "size": 2})


def test_router_local_first_and_target_pinning() -> None:
    """Local providers win; pinning an unknown node is unavailable; unknown caps are not_found."""
    reg = CapabilityRegistry()
    reg.register(Echo())
    router = Router(LocalProvider("ed25519:self", reg))
    provider, desc = router.choose("echo", "1.0", None, 0.0)
    assert (True, "echo@1.0") == (provider.is_local, desc.key)
    assert router.local is router.choose("echo", "1.0", "ed25519:self", 0.0)[0]
    with pytest.raises(Unavailable):
        router.choose("echo", "1.0", "ed25519:" + "A" * 43, 0.0)
    with pytest.raises(NotFound):
        router.choose("nothing", "1.0", None, 0.0)


def test_local_provider_enforces_max_concurrent() -> None:
    """The (max_concurrent+1)-th concurrent call is capacity_exceeded; a release frees a slot."""
    reg = CapabilityRegistry()
    cap = Versioned("1.0", max_concurrent=2)
    reg.register(cap)
    local = LocalProvider("ed25519:self", reg)
    local.acquire(cap.descriptor)
    local.acquire(cap.descriptor)
    with pytest.raises(CapacityExceeded):
        local.acquire(cap.descriptor)
    local.release(cap.descriptor)
    local.acquire(cap.descriptor)
    assert 1.0 == local.load("thing", "1.0")


def test_provider_quarantined_under_half_success() -> None:
    """A provider failing most recent calls is quarantined for 60 s."""
    health = ProviderHealth()
    for i in range(10):
        health.record(i < 4, 0.01, now=100.0)
    assert (False, True) == (health.available(120.0), health.available(160.0))


def test_provider_health_counts_only_the_last_hundred_calls() -> None:
    """100 successes (1..100 ms) then 30 failures: 70 % over the window, median of 31..100 ms."""
    health = ProviderHealth()
    for i in range(HEALTH_WINDOW):
        health.record(True, (i + 1) / 1000, now=0.0)
    full = (health.success_rate, health.p50_s)
    for _ in range(30):
        health.record(False, 5.0, now=0.0)
    assert ((1.0, 0.0505), (0.7, 0.0655), True) == (
        full,
        (health.success_rate, round(health.p50_s, 6)),
        health.available(0.0),
    )
