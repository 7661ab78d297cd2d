"""What a node announces on the LAN, and what it remembers of others (spec §7.1). Pure.

A node announces one DNS-SD service of type ``_hearthnet._tcp.local.`` named
``<name>-<short id>``, with the TXT keys ``v=1``, ``node=<NodeID>``,
``community=<CommunityID>``, ``port=<port>`` and ``tls=0|1``. This module turns an
:class:`Announcement` into those TXT bytes and back, refusing anything malformed with
:class:`~hearthnet.errors.BadRequest`, and keeps the :class:`PeerTable` of peers seen:
deduplicated by NodeID, bounded, ignoring our own node and other communities.

Nothing here opens a socket or imports ``zeroconf``; :mod:`hearthnet.mesh.discovery`
is the glue that feeds these functions from the network.

Nothing in a TXT record is signed: an announcement only says where to dial. Who a
peer really is gets proven by the signed manifest and the peer-link handshake
(spec §7.1, §7.2), never by discovery.
"""

from __future__ import annotations

import enum
import ipaddress
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hearthnet.errors import BadRequest, ConfigError
from hearthnet.ids import is_node_id, short_id

SERVICE_TYPE = "_hearthnet._tcp.local."
TXT_VERSION = "1"

# RFC 6763 §4.1.1: an instance name is one DNS label, at most 63 octets of UTF-8.
MAX_INSTANCE_BYTES = 63
_SHORT_ID_CHARS = 19  # "XXXX-XXXX-XXXX-XXXX" (spec §1.1)
# What is left for <name> in "<name>-<short id>".
MAX_NAME_BYTES = MAX_INSTANCE_BYTES - 1 - _SHORT_ID_CHARS
DEFAULT_NAME = "hearthnet"

# Our own TXT record is about 150 bytes. RFC 6763 §6.2 recommends keeping a TXT record
# under 200 bytes and says up to 400 "should" fit; we accept up to 1300 (one Ethernet
# mDNS packet, RFC 6762 §17) so a newer peer may add keys, and no more.
MAX_TXT_BYTES = 1300
MAX_TXT_KEYS = 32
# A home server has a few interfaces; a record listing more is not worth trusting.
MAX_ADDRESSES = 8
DEFAULT_MAX_PEERS = 256

_REQUIRED_KEYS = ("v", "node", "community", "port", "tls")


def sanitize_name(name: str) -> str:
    """A display name made safe for the ``<name>`` part of a DNS-SD instance name.

    Normalises to NFC, replaces control characters, dots and backslashes (which
    other mDNS stacks escape differently) with ``-``, strips surrounding blanks and
    cuts to :data:`MAX_NAME_BYTES` octets of UTF-8 without splitting a character.
    An empty result becomes :data:`DEFAULT_NAME`.
    """
    text = unicodedata.normalize("NFC", name)
    text = "".join("-" if _is_unsafe(ch) else ch for ch in text).strip()
    raw = text.encode("utf-8")
    if len(raw) > MAX_NAME_BYTES:
        text = raw[:MAX_NAME_BYTES].decode("utf-8", errors="ignore").rstrip()
    return text or DEFAULT_NAME


def _is_unsafe(ch: str) -> bool:
    return ch in ".\\" or unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")


def instance_name(name: str, node: str) -> str:
    """``<name>-<short id>`` (spec §7.1); ``name`` must already be sanitised."""
    return f"{name}-{short_id(node)}"


@dataclass(frozen=True, slots=True)
class Announcement:
    """One node's DNS-SD announcement: who it is and where to dial it.

    Attributes:
        node: the node's NodeID.
        community: the CommunityID it belongs to.
        name: display name, already sanitised (see :func:`sanitize_name`).
        port: the bus port (spec §3.1), 1..65535.
        tls: whether the port speaks TLS.
        addresses: the IPv4 addresses the service is reachable at (A records).

    Construction validates every field and raises :class:`BadRequest`; use
    :meth:`local` for our own announcement (it sanitises the name and raises
    :class:`ConfigError`) and :meth:`from_record` for what the network delivered.
    """

    node: str
    community: str
    name: str
    port: int
    tls: bool = False
    addresses: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not is_node_id(self.node):
            raise BadRequest("node is not a NodeID")
        if not is_node_id(self.community):
            raise BadRequest("community is not a CommunityID")
        if sanitize_name(self.name) != self.name:
            raise BadRequest("name is not a sanitised instance name")
        if isinstance(self.port, bool) or not isinstance(self.port, int):
            raise BadRequest("port is not an integer")
        if not 1 <= self.port <= 65535:
            raise BadRequest("port is outside 1..65535")
        if not isinstance(self.tls, bool):
            raise BadRequest("tls is not a boolean")
        if len(self.addresses) > MAX_ADDRESSES:
            raise BadRequest(f"more than {MAX_ADDRESSES} addresses")
        for address in self.addresses:
            _check_ipv4(address)

    @classmethod
    def local(
        cls,
        *,
        node: str,
        community: str,
        name: str,
        port: int,
        tls: bool = False,
        addresses: Iterable[str] = (),
    ) -> Announcement:
        """Our own announcement from configuration; :class:`ConfigError` when unusable.

        The name is sanitised and cut to fit; addresses are deduplicated in order.
        """
        try:
            return cls(
                node=node,
                community=community,
                name=sanitize_name(name),
                port=port,
                tls=tls,
                addresses=tuple(dict.fromkeys(addresses)),
            )
        except BadRequest as exc:
            raise ConfigError(f"cannot announce this node: {exc.message}") from exc

    @property
    def instance(self) -> str:
        """The DNS-SD instance name ``<name>-<short id>``."""
        return instance_name(self.name, self.node)

    @property
    def service_name(self) -> str:
        """The full service name, ``<instance>._hearthnet._tcp.local.``."""
        return f"{self.instance}.{SERVICE_TYPE}"

    @property
    def host_name(self) -> str:
        """The mDNS host name of the SRV record: one per node, so two nodes never clash."""
        return "hn-" + short_id(self.node).replace("-", "").lower() + ".local."

    @property
    def urls(self) -> tuple[str, ...]:
        """``http[s]://<address>:<port>`` for each address, in announcement order."""
        scheme = "https" if self.tls else "http"
        return tuple(f"{scheme}://{address}:{self.port}" for address in self.addresses)

    def to_txt(self) -> dict[bytes, bytes]:
        """The TXT key/value pairs of spec §7.1."""
        return {
            b"v": TXT_VERSION.encode(),
            b"node": self.node.encode(),
            b"community": self.community.encode(),
            b"port": str(self.port).encode(),
            b"tls": b"1" if self.tls else b"0",
        }

    @classmethod
    def from_record(
        cls,
        instance: str,
        txt: Mapping[bytes, bytes | None],
        addresses: Iterable[str],
        srv_port: int | None = None,
    ) -> Announcement:
        """Parse and validate a resolved service; :class:`BadRequest` if anything is off.

        Args:
            instance: the instance label (the service name without the service type).
            txt: the TXT key/value pairs as delivered (keys compared case-insensitively,
                RFC 6763 §6.4; unknown keys are ignored so newer peers can add some).
            addresses: the A-record addresses; non-IPv4 ones are refused. They are
                deduplicated and sorted, so a re-resolve in another order is no change.
            srv_port: the SRV record's port, which must equal the TXT ``port``.
        """
        if len(instance.encode("utf-8")) > MAX_INSTANCE_BYTES:
            raise BadRequest("instance name longer than 63 octets")
        values = _txt_values(txt)
        if values["v"] != TXT_VERSION:
            raise BadRequest(f"unsupported announcement version {values['v']!r}")
        node = values["node"]
        if not is_node_id(node):
            raise BadRequest("TXT node is not a NodeID")
        suffix = "-" + short_id(node)
        if not instance.endswith(suffix):
            raise BadRequest("instance name does not end with the node's short id")
        port = _parse_port(values["port"])
        if srv_port is not None and srv_port != port:
            raise BadRequest("TXT port and SRV port differ")
        if values["tls"] not in ("0", "1"):
            raise BadRequest("TXT tls is not 0 or 1")
        # Sorted: resolvers hand A records back in varying order, which is no change.
        found = tuple(sorted(set(addresses)))
        if not found:
            raise BadRequest("no address")
        return cls(
            node=node,
            community=values["community"],
            name=instance[: -len(suffix)],
            port=port,
            tls=values["tls"] == "1",
            addresses=found,
        )


def _txt_values(txt: Mapping[bytes, bytes | None]) -> dict[str, str]:
    if len(txt) > MAX_TXT_KEYS:
        raise BadRequest(f"more than {MAX_TXT_KEYS} TXT keys")
    size = sum(
        1 + len(key) + (0 if value is None else 1 + len(value)) for key, value in txt.items()
    )
    if size > MAX_TXT_BYTES:
        raise BadRequest(f"TXT record larger than {MAX_TXT_BYTES} bytes")
    values: dict[str, str] = {}
    for raw_key, raw_value in txt.items():
        try:
            key = raw_key.decode("ascii").lower()
        except UnicodeDecodeError as exc:
            raise BadRequest("TXT key is not ASCII") from exc
        if key not in _REQUIRED_KEYS:
            continue
        if key in values:
            raise BadRequest(f"TXT key {key!r} appears twice")
        if raw_value is None:
            raise BadRequest(f"TXT key {key!r} has no value")
        try:
            values[key] = raw_value.decode("ascii")
        except UnicodeDecodeError as exc:
            raise BadRequest(f"TXT value of {key!r} is not ASCII") from exc
    missing = [key for key in _REQUIRED_KEYS if key not in values]
    if missing:
        raise BadRequest(f"TXT keys missing: {', '.join(missing)}")
    return values


def _parse_port(text: str) -> int:
    # Decimal digits only: int() would also take "+80", " 80", "8_0" and "٨٠".
    if not (text.isascii() and text.isdigit()) or len(text) > 5 or text.startswith("0"):
        raise BadRequest("TXT port is not a decimal port number")
    port = int(text)
    if not 1 <= port <= 65535:
        raise BadRequest("TXT port is outside 1..65535")
    return port


def _check_ipv4(address: object) -> None:
    if not isinstance(address, str):
        raise BadRequest("an address is not a string")
    try:
        ipaddress.IPv4Address(address)
    except ValueError as exc:
        raise BadRequest(f"{address!r} is not an IPv4 address") from exc


# --- peers seen ---------------------------------------------------------------------


class Sighting(enum.Enum):
    """What :meth:`PeerTable.observe` made of one resolved announcement."""

    NEW = "new"  # a node we did not know: report it
    CHANGED = "changed"  # a known node with a new port, address, name or tls: report it
    SAME = "same"  # nothing new
    OWN = "own"  # our own announcement, echoed back
    OTHER_COMMUNITY = "other_community"  # spec §7.1: ignored
    FULL = "full"  # the table is at its bound; the node is not remembered


@dataclass(frozen=True, slots=True)
class PeerTableStats:
    """Counters of a :class:`PeerTable`, for ``Node.statistics()``."""

    peers: int
    new: int
    changed: int
    lost: int
    ignored_own: int
    ignored_other_community: int
    refused_full: int


class PeerTable:
    """The peers discovery found: one entry per NodeID, at most ``max_peers``.

    A node is keyed by NodeID; the instance name it was last seen under is kept so
    that a goodbye for an instance the node no longer uses does not lose the node.
    When the table is full, new nodes are refused (and counted) rather than
    evicting known ones, so a flood of announcements cannot push real peers out.
    """

    def __init__(self, own_node: str, community: str, max_peers: int = DEFAULT_MAX_PEERS) -> None:
        if max_peers < 1:
            raise ConfigError("max_peers must be at least 1")
        self.own_node = own_node
        self.community = community
        self.max_peers = max_peers
        self._by_node: dict[str, Announcement] = {}
        self._node_of_instance: dict[str, str] = {}
        self._counts = dict.fromkeys(
            ("new", "changed", "lost", "ignored_own", "ignored_other_community", "refused_full"),
            0,
        )

    def __len__(self) -> int:
        return len(self._by_node)

    def __contains__(self, node: object) -> bool:
        return node in self._by_node

    def get(self, node: str) -> Announcement | None:
        """The announcement remembered for ``node``, if any."""
        return self._by_node.get(node)

    def peers(self) -> tuple[Announcement, ...]:
        """Every remembered peer, oldest first."""
        return tuple(self._by_node.values())

    def observe(self, announcement: Announcement) -> Sighting:
        """Record a resolved announcement; NEW and CHANGED are the ones to report."""
        if announcement.node == self.own_node:
            self._counts["ignored_own"] += 1
            return Sighting.OWN
        if announcement.community != self.community:
            self._counts["ignored_other_community"] += 1
            return Sighting.OTHER_COMMUNITY
        # The same instance name now carrying another node: the old node left it.
        previous_node = self._node_of_instance.get(announcement.instance)
        if previous_node is not None and previous_node != announcement.node:
            self.forget(announcement.instance)
        known = self._by_node.get(announcement.node)
        if known is None and len(self._by_node) >= self.max_peers:
            self._counts["refused_full"] += 1
            return Sighting.FULL
        if known is not None and known.instance != announcement.instance:
            self._node_of_instance.pop(known.instance, None)
        self._by_node[announcement.node] = announcement
        self._node_of_instance[announcement.instance] = announcement.node
        if known is None:
            self._counts["new"] += 1
            return Sighting.NEW
        if known != announcement:
            self._counts["changed"] += 1
            return Sighting.CHANGED
        return Sighting.SAME

    def forget(self, instance: str) -> str | None:
        """An instance said goodbye or expired: the NodeID now lost, or None."""
        node = self._node_of_instance.pop(instance, None)
        if node is None:
            return None
        del self._by_node[node]
        self._counts["lost"] += 1
        return node

    def statistics(self) -> PeerTableStats:
        """A snapshot of the counters."""
        return PeerTableStats(peers=len(self._by_node), **self._counts)
