"""Field checks shared by the relay and path frames (spec §8). Pure.

Each check takes the decoded CBOR map, the frame's name and the field's name, and raises
:class:`~hearthnet.errors.BadRequest` naming both (``route.ttl_hops must be ...``).
"""

from __future__ import annotations

import ipaddress
from typing import Any, ClassVar

from hearthnet import cbor
from hearthnet.canonical import MAX_SAFE_INTEGER
from hearthnet.errors import BadRequest
from hearthnet.ids import is_node_id
from hearthnet.shapes import Shape

MAX_FRAME_BYTES = 2 * 1024 * 1024  # the peer-link limit (spec §7.2)
MAX_INNER_BYTES = MAX_FRAME_BYTES - 1024  # room for the route header around it
MAX_ADDRS = 8
MAX_ADDR_CHARS = 262  # "[" + 253-character host + "]:" + port
# Every integer on a peer link stays within ±2^53: canonical JSON (spec §1.3, §2.5) holds
# no larger one, and the link refuses frames with values it cannot represent.
MAX_ID = MAX_SAFE_INTEGER
MAX_NONCE_CHARS = 64


def int_field(obj: dict[str, Any], what: str, name: str, lo: int = 0, hi: int = MAX_ID) -> int:
    """``obj[name]``, an integer in ``lo..hi`` (not a bool)."""
    value = obj.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise BadRequest(f"{what}.{name} must be an integer in {lo}..{hi}")
    return value


def opt_int_field(obj: dict[str, Any], what: str, name: str, hi: int = MAX_ID) -> int | None:
    """``obj[name]`` when present: an integer in ``0..hi``."""
    return None if obj.get(name) is None else int_field(obj, what, name, 0, hi)


_KNOWN_NODES: set[str] = set()  # NodeIDs already checked: a relay sees the same few again
_KNOWN_NODES_MAX = 4096


def node_field(obj: dict[str, Any], what: str, name: str) -> str:
    """``obj[name]``, a NodeID."""
    value = obj.get(name)
    if type(value) is str and value in _KNOWN_NODES:
        return value
    if not is_node_id(value):
        raise BadRequest(f"{what}.{name} must be a NodeID")
    assert isinstance(value, str)
    if len(_KNOWN_NODES) >= _KNOWN_NODES_MAX:
        _KNOWN_NODES.clear()
    _KNOWN_NODES.add(value)
    return value


def str_field(
    obj: dict[str, Any], what: str, name: str, max_chars: int, *, empty: bool = False
) -> str:
    """``obj[name]``, a string of at most ``max_chars`` (non-empty unless ``empty``)."""
    value = obj.get(name)
    if not isinstance(value, str) or len(value) > max_chars or (not value and not empty):
        raise BadRequest(f"{what}.{name} must be a string of at most {max_chars} characters")
    return value


def bytes_field(obj: dict[str, Any], what: str, name: str, max_len: int, exact: int = -1) -> bytes:
    """``obj[name]``, a byte string of at most ``max_len`` (exactly ``exact`` if set)."""
    value = obj.get(name)
    if not isinstance(value, bytes) or len(value) > max_len or exact not in (-1, len(value)):
        size = f"{exact}" if exact >= 0 else f"at most {max_len}"
        raise BadRequest(f"{what}.{name} must be a byte string of {size} bytes")
    return value


def check_addr(value: object, what: str) -> str:
    """A transport address ``host:port`` (IPv6 in brackets); returns it.

    Raises:
        BadRequest: naming ``what``.
    """
    if isinstance(value, str) and len(value) <= MAX_ADDR_CHARS and value.isascii():
        host, sep, port = value.rpartition(":")
        if host.startswith("["):
            ok_host = host.endswith("]") and len(host) > 2
        else:
            ok_host = bool(host) and ":" not in host
        if sep and ok_host and port.isdigit() and 1 <= int(port) <= 65535:
            return value
    raise BadRequest(f"{what} must be an address host:port")


def punchable_addr(addr: str) -> bool:
    """Whether an address :func:`check_addr` passed may be punched to (spec §8): an IP
    literal (a punch does no DNS lookup) that is not loopback, multicast, unspecified,
    link-local or reserved, with a port. Whoever names the candidates (a peer, or a relay
    lying about an observed address) must not aim a punch at this host's own services,
    at the local network's multicast, or at a name."""
    host, _, port = addr.rpartition(":")
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    refused = ip.is_loopback or ip.is_multicast or ip.is_unspecified or ip.is_link_local
    return not (refused or ip.is_reserved) and port.isdigit() and int(port) > 0


class Frame:
    """What every relay and path frame has: its kind, field table, and CBOR encoding."""

    __slots__ = ()
    KIND: ClassVar[str]
    SHAPE: ClassVar[Shape]

    def serialize(self) -> dict[str, Any]:
        """The wire map, ``t`` included."""
        raise NotImplementedError

    def encode(self) -> bytes:
        """The frame's CBOR bytes, as written on a peer link."""
        return bytes(cbor.dumps(self.serialize()))
