"""The local capability registry: name -> offered versions (spec §2.1)."""

from __future__ import annotations

from hearthnet.bus.capability import Capability
from hearthnet.bus.descriptor import CapabilityDescriptor, parse_version, version_satisfies
from hearthnet.errors import ConfigError


class CapabilityRegistry:
    """Capabilities offered by this node. Registering one never touches the transport."""

    def __init__(self) -> None:
        self._by_name: dict[str, list[Capability]] = {}

    def register(self, capability: Capability) -> None:
        """Offer ``capability``.

        Raises:
            ConfigError: same name and version offered twice, or the object lacks the
                ``call``/``stream`` method its descriptor implies.
        """
        desc = capability.descriptor
        method = "stream" if desc.streaming else "call"
        if not callable(getattr(capability, method, None)):
            raise ConfigError(f"{desc.key} must define {method}() (stream_schema decides)")
        offered = self._by_name.setdefault(desc.name, [])
        if any(c.descriptor.version == desc.version for c in offered):
            raise ConfigError(f"{desc.key} is registered twice")
        offered.append(capability)
        offered.sort(key=lambda c: parse_version(c.descriptor.version), reverse=True)

    def resolve(self, name: str, version: str) -> Capability | None:
        """The best offered version for a request of ``name@version``: same major, the
        highest minor not lower than requested."""
        for cap in self._by_name.get(name, ()):
            if version_satisfies(cap.descriptor.version, version):
                return cap
        return None

    def descriptors(self) -> list[CapabilityDescriptor]:
        """Every offered descriptor, by name then version (newest first)."""
        return [c.descriptor for name in sorted(self._by_name) for c in self._by_name[name]]

    def __contains__(self, name: object) -> bool:
        """Whether any version of capability ``name`` is offered here."""
        return name in self._by_name

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_name.values())
