"""Choosing the provider of a call (spec §2.3).

Every call goes through :class:`Router`, which picks a :class:`Provider`. The local
node is one provider; a remote node reached over a peer link (or through relays) is
another implementation of the same interface, so the bus and the transports never
know where a call runs.

Selection: a pinned target (``X-HearthNet-Target``) wins; otherwise local first while
its load for that capability is under 80 %, else the healthiest remote provider
(success rate and p50 latency over its last 100 calls, then load); a provider whose
success rate drops under 50 % is quarantined for 60 s.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Protocol

from hearthnet.bus.capability import CallContext, Capability, StreamingCapability, UnaryCapability
from hearthnet.bus.descriptor import CapabilityDescriptor
from hearthnet.bus.envelope import VerifiedCall
from hearthnet.bus.registry import CapabilityRegistry
from hearthnet.errors import BadRequest, CapacityExceeded, NotFound, Unavailable
from hearthnet.frames import Frame
from hearthnet.ids import is_node_id

LOCAL_LOAD_LIMIT = 0.8
HEALTH_WINDOW = 100
QUARANTINE_RATE = 0.5
QUARANTINE_S = 60.0


class Provider(Protocol):
    """Something that can run a call: this node, or a node across the mesh."""

    node_id: str
    is_local: bool

    def descriptor(self, name: str, version: str) -> CapabilityDescriptor | None:
        """The descriptor this provider would use for ``name@version``, or None."""

    def load(self, name: str, version: str) -> float:
        """Fraction (0..1+) of this provider's capacity for the capability in use."""

    def acquire(self, descriptor: CapabilityDescriptor) -> None:
        """Take a concurrency slot; raise :class:`CapacityExceeded` when full."""

    def release(self, descriptor: CapabilityDescriptor) -> None:
        """Give a slot back."""

    def run(
        self, call: VerifiedCall, ctx: CallContext, descriptor: CapabilityDescriptor
    ) -> AsyncIterator[Frame]:
        """Run the call. Unary capabilities yield one ``output`` frame; streams yield
        their frames. A terminal frame is optional (the bus adds ``done``)."""


class LocalProvider:
    """This node's own capabilities, with per-capability ``max_concurrent``."""

    is_local = True

    def __init__(self, node_id: str, registry: CapabilityRegistry) -> None:
        self.node_id = node_id
        self.registry = registry
        self.in_flight: dict[str, int] = {}

    def descriptor(self, name: str, version: str) -> CapabilityDescriptor | None:
        """The best local version for the request."""
        cap = self.registry.resolve(name, version)
        return cap.descriptor if cap is not None else None

    def load(self, name: str, version: str) -> float:
        """In-flight calls over ``max_concurrent``."""
        desc = self.descriptor(name, version)
        if desc is None:
            return 1.0
        return self.load_of(desc)

    def load_of(self, descriptor: CapabilityDescriptor) -> float:
        """:meth:`load` for a descriptor already resolved."""
        return self.in_flight.get(descriptor.key, 0) / descriptor.max_concurrent

    def acquire(self, descriptor: CapabilityDescriptor) -> None:
        """Take a slot for ``descriptor`` or refuse with ``capacity_exceeded``."""
        used = self.in_flight.get(descriptor.key, 0)
        if used >= descriptor.max_concurrent:
            raise CapacityExceeded(
                f"{descriptor.key} is at max_concurrent={descriptor.max_concurrent}",
                retry_after_ms=100,
            )
        self.in_flight[descriptor.key] = used + 1

    def release(self, descriptor: CapabilityDescriptor) -> None:
        """Give the slot back."""
        self.in_flight[descriptor.key] = max(0, self.in_flight.get(descriptor.key, 1) - 1)

    async def run(
        self, call: VerifiedCall, ctx: CallContext, descriptor: CapabilityDescriptor
    ) -> AsyncIterator[Frame]:
        """Invoke the handler."""
        if not descriptor.streaming:
            yield Frame("output", await self.call_unary(call, ctx, descriptor))
            return
        cap: Capability | None = self.registry.resolve(descriptor.name, descriptor.version)
        if cap is None:  # unregistered between routing and running
            raise NotFound(f"no provider for {call.capability}@{call.version}")
        # The registry checked at registration that the method matching `streaming` exists;
        # a runtime Protocol isinstance here cost 7 % of a unary call.
        stream: StreamingCapability = cap  # type: ignore[assignment]
        async for frame in stream.stream(ctx, call.envelope.input):
            yield frame

    async def call_unary(
        self, call: VerifiedCall, ctx: CallContext, descriptor: CapabilityDescriptor
    ) -> dict[str, Any]:
        """Invoke a unary handler and return its output object, without the frame stream
        :meth:`run` wraps it in (what a local HTTP call needs)."""
        cap: Capability | None = self.registry.resolve(descriptor.name, descriptor.version)
        if cap is None:  # unregistered between routing and running
            raise NotFound(f"no provider for {call.capability}@{call.version}")
        unary: UnaryCapability = cap  # type: ignore[assignment]
        output = await unary.call(ctx, call.envelope.input)
        if not isinstance(output, dict):
            raise TypeError(f"{descriptor.key} returned {type(output).__name__}, not an object")
        return output


class ProviderHealth:
    """Success rate and latency over a provider's last calls (spec §2.3). Pure. Both are
    read for every provider that could take a call, so they cost O(1) there: the
    successes are counted as outcomes come and go, and the median is kept until the
    next outcome."""

    def __init__(self) -> None:
        self.outcomes: deque[tuple[bool, float]] = deque(maxlen=HEALTH_WINDOW)
        self.quarantined_until = 0.0
        self._ok = 0  # successes among ``outcomes``
        self._p50: float | None = None  # the median of their latencies, until the next outcome

    def record(self, ok: bool, seconds: float, now: float) -> None:
        """Record one finished call; quarantine when the success rate falls under 50 %."""
        if len(self.outcomes) == self.outcomes.maxlen and self.outcomes[0][0]:
            self._ok -= 1  # the oldest outcome leaves the window
        self.outcomes.append((ok, seconds))
        self._ok += ok
        self._p50 = None
        if len(self.outcomes) >= 10 and self.success_rate < QUARANTINE_RATE:
            self.quarantined_until = now + QUARANTINE_S
            self.outcomes.clear()
            self._ok = 0

    @property
    def success_rate(self) -> float:
        """Share of recent calls that succeeded (1.0 with no history)."""
        if not self.outcomes:
            return 1.0
        return self._ok / len(self.outcomes)

    @property
    def p50_s(self) -> float:
        """Median latency of recent successful calls (0 with no history)."""
        if self._p50 is None:
            import statistics  # noqa: PLC0415 - only with remote providers (spec §11: idle RSS)

            times = [s for ok, s in self.outcomes if ok]
            self._p50 = statistics.median(times) if times else 0.0
        return self._p50

    def available(self, now: float) -> bool:
        """False while quarantined."""
        return now >= self.quarantined_until


class Router:
    """Picks a provider for each call; local first, then remote by health."""

    def __init__(self, local: LocalProvider) -> None:
        self.local = local
        self.remote: dict[str, Provider] = {}
        self.health: dict[str, ProviderHealth] = {}

    def add_remote(self, provider: Provider) -> None:
        """Make a remote provider (a peer node) eligible."""
        self.remote[provider.node_id] = provider
        self.health.setdefault(provider.node_id, ProviderHealth())

    def remove_remote(self, node_id: str) -> None:
        """Forget a remote provider (link down, node revoked)."""
        self.remote.pop(node_id, None)

    def record(self, provider: Provider, ok: bool, seconds: float, now: float) -> None:
        """Feed a call's outcome into the provider's health."""
        if not provider.is_local:
            self.health.setdefault(provider.node_id, ProviderHealth()).record(ok, seconds, now)

    def choose(
        self, name: str, version: str, target: str | None, now: float
    ) -> tuple[Provider, CapabilityDescriptor]:
        """The provider and descriptor for a call.

        Raises:
            NotFound: nobody offers ``name@version`` (or the target does not).
            Unavailable: the pinned target is not reachable.
        """
        if target is not None:
            if target == self.local.node_id:
                desc = self.local.descriptor(name, version)
                if desc is None:
                    raise NotFound(f"this node does not offer {name}@{version}")
                return self.local, desc
            provider = self.remote.get(target)
            if provider is None:
                raise Unavailable(f"no route to target {target}", retry_after_ms=1000)
            desc = provider.descriptor(name, version)
            if desc is None:
                raise NotFound(f"target does not offer {name}@{version}")
            return provider, desc
        local_desc = self.local.descriptor(name, version)
        if local_desc is not None and self.local.load_of(local_desc) < LOCAL_LOAD_LIMIT:
            return self.local, local_desc
        candidates: list[tuple[tuple[float, float, float], Provider, CapabilityDescriptor]] = []
        for node_id, provider in self.remote.items():
            health = self.health.get(node_id)
            if health is not None and not health.available(now):
                continue
            desc = provider.descriptor(name, version)
            if desc is None:
                continue
            rate = health.success_rate if health else 1.0
            p50 = health.p50_s if health else 0.0
            candidates.append(((-rate, p50, provider.load(name, version)), provider, desc))
        if candidates:
            candidates.sort(key=lambda c: c[0])
            return candidates[0][1], candidates[0][2]
        if local_desc is not None:
            return self.local, local_desc  # busy, but the only one: acquire() decides
        raise NotFound(f"no provider offers {name}@{version}")

    def offered(self) -> list[dict[str, Any]]:
        """Descriptors offered in the mesh, with provider and health (``/bus/v1/capabilities``)."""
        out = [
            {
                **d.to_json(),
                "provider": self.local.node_id,
                "local": True,
                "load": self.local.load(d.name, d.version),
            }
            for d in self.local.registry.descriptors()
        ]
        for node_id, provider in self.remote.items():
            health = self.health.get(node_id, ProviderHealth())
            for desc in getattr(provider, "descriptors", lambda: [])():
                out.append(
                    {
                        **desc.to_json(),
                        "provider": node_id,
                        "local": False,
                        "success_rate": health.success_rate,
                        "p50_ms": health.p50_s * 1000,
                    }
                )
        return out


def check_target(target: str | None) -> str | None:
    """Validate an ``X-HearthNet-Target`` value."""
    if target is not None and not is_node_id(target):
        raise BadRequest("X-HearthNet-Target must be a NodeID")
    return target
