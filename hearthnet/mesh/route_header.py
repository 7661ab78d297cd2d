"""The binary ``route`` frame (spec §8 as built; peer links of ``hearthnet-peer.v2``). Pure.

A relay reads a fixed header, charges the member's budget, lowers ``ttl_hops`` and writes
the received bytes on: it never decodes the end-to-end frame behind the header (spec §11:
≤ 5 µs per forwarded frame). Layout, all integers big-endian::

    offset  size  field
    0       1     0x48 ("H"): a binary peer-link frame (a CBOR map starts with 0xa0..0xbf)
    1       1     layout version: 1
    2       1     kind: 1 = route
    3       1     flags: bit 0 ``control``; the other bits are 0
    4       1     ttl_hops: 0..16
    5       8     id: 0..2^53-1, chosen by the sender
    13      32    to: the ed25519 public key the NodeID names
    45      32    from: likewise
    77      4     length of inner; the frame is exactly 81 + length bytes
    81      ...   inner: the bytes of one end-to-end frame (``e2e_hello`` or ``sealed``)

What binds the header to the frame: ``inner`` is sealed under keys only ``from`` and
``to`` hold (:mod:`hearthnet.mesh.relay_e2e`: derived from both NodeIDs, one key per
direction), and the receiver opens it with the session it holds with ``from``, only when
``to`` is itself. A relay that changes ``from`` or ``to`` makes the frame open under the
wrong keys or at the wrong node: refused and counted (``invalid_signature``). ``id``
feeds only the relays' seen-cache (replays are refused end to end by the sealed frame's
sequence number), ``control`` only the budget of the relay the member sent it to, and
``ttl_hops`` is the relays' own to lower.

The same frame as a CBOR map (:class:`~hearthnet.mesh.relay_frames.Route`) is what
``hearthnet-peer.v1`` peers send and are sent (:func:`v1_bytes`); both forms are accepted
on either version.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from hearthnet.errors import BadRequest, PayloadTooLarge
from hearthnet.ids import node_id_from_public_key, public_key_from_node_id
from hearthnet.mesh.frame_fields import MAX_FRAME_BYTES, MAX_ID, MAX_INNER_BYTES
from hearthnet.mesh.relay_frames import MAX_TTL_HOPS, Route

TAG = 0x48  # the first byte of every binary peer-link frame
LAYOUT = 1
KIND_ROUTE = 1
FLAG_CONTROL = 0x01
TAG_BYTE = bytes((TAG,))
PREFIX = bytes((TAG, LAYOUT, KIND_ROUTE))
TTL_AT = 4
TO_AT = 13
FROM_AT = 45
HEADER = struct.Struct(">3sBBQ32s32sI")  # the layout above; mesh/route_batch.py reads it too
HEADER_BYTES = HEADER.size  # 81
_ONE_BYTE = [bytes((i,)) for i in range(256)]

NODE_IDS: dict[bytes, str] = {}  # public key -> NodeID: a relay sees the same few again
NODE_IDS_MAX = 4096


class RouteHeader(NamedTuple):
    """The header of a route frame: what a relay reads (``size``: bytes of ``inner``).

    A named tuple rather than a frozen dataclass: it is built for every frame a relay
    forwards, and a tuple costs a fraction of a frozen dataclass's ``__init__``.
    """

    to: str
    from_: str
    ttl_hops: int
    id: int
    control: bool
    size: int


def is_binary(data: bytes) -> bool:
    """Whether ``data`` (one peer-link message) is a binary frame, not a CBOR map."""
    return data[:1] == TAG_BYTE


def node_of(key: bytes) -> str:
    """The NodeID of ed25519 public key ``key`` (cached: a relay sees the same few)."""
    node = NODE_IDS.get(key)
    if node is None:
        if len(NODE_IDS) >= NODE_IDS_MAX:
            NODE_IDS.clear()
        node = NODE_IDS[key] = node_id_from_public_key(key)
    return node


def read_header(data: bytes) -> RouteHeader:
    """The header of binary route frame ``data``, checked against its length.

    Raises:
        PayloadTooLarge: over the peer-link frame limit.
        BadRequest: not a binary route frame of layout 1, or a field out of range
            (naming it).
    """
    if len(data) < HEADER_BYTES:
        raise BadRequest(f"a binary route frame has at least {HEADER_BYTES} bytes")
    prefix, flags, ttl, id_, to, from_, size = HEADER.unpack_from(data)
    if prefix != PREFIX:
        raise BadRequest("not a binary route frame of layout 1")
    if flags & ~FLAG_CONTROL:
        raise BadRequest("route.flags has unknown bits set")
    if ttl > MAX_TTL_HOPS:
        raise BadRequest(f"route.ttl_hops must be an integer in 0..{MAX_TTL_HOPS}")
    if id_ > MAX_ID:
        raise BadRequest(f"route.id must be an integer in 0..{MAX_ID}")
    if size != len(data) - HEADER_BYTES:
        if len(data) > MAX_FRAME_BYTES:
            raise PayloadTooLarge(f"route frame over {MAX_FRAME_BYTES} bytes")
        raise BadRequest("route.length does not match the frame")
    if size > MAX_INNER_BYTES:
        raise BadRequest(f"route.inner must be a byte string of at most {MAX_INNER_BYTES} bytes")
    nodes = NODE_IDS
    return RouteHeader(
        nodes.get(to) or node_of(to),
        nodes.get(from_) or node_of(from_),
        ttl,
        id_,
        flags == FLAG_CONTROL,
        size,
    )


def parse_route(data: bytes) -> Route:
    """The whole route frame (``inner`` included) from its binary form.

    Raises:
        BadRequest / PayloadTooLarge: see :func:`read_header`.
    """
    head = read_header(data)
    return Route(head.to, head.from_, head.ttl_hops, head.id, data[HEADER_BYTES:], head.control)


def header_of(route: Route) -> RouteHeader:
    """The header of a route frame parsed from either form."""
    return RouteHeader(
        route.to, route.from_, route.ttl_hops, route.id, route.control, len(route.inner)
    )


def encode_route(route: Route) -> bytes:
    """``route`` in the binary form (what a ``hearthnet-peer.v2`` link carries).

    Raises:
        ValueError: a field out of range (a bug in the caller: parsed frames never are).
    """
    if not 0 <= route.ttl_hops <= MAX_TTL_HOPS or not 0 <= route.id <= MAX_ID:
        raise ValueError("route.ttl_hops or route.id out of range")
    if len(route.inner) > MAX_INNER_BYTES:
        raise ValueError("route.inner over the limit")
    head = HEADER.pack(
        PREFIX,
        FLAG_CONTROL if route.control else 0,
        route.ttl_hops,
        route.id,
        public_key_from_node_id(route.to),
        public_key_from_node_id(route.from_),
        len(route.inner),
    )
    return head + route.inner


def passed_on(data: bytes, head: RouteHeader) -> bytes:
    """The bytes a relay writes on for binary route frame ``data`` (whose header is
    ``head``): the same with ``ttl_hops`` one less. ``head.ttl_hops`` is at least 1 (the
    relay core answers ``ttl`` for 0)."""
    return b"".join((data[:TTL_AT], _ONE_BYTE[head.ttl_hops - 1], data[TTL_AT + 1 :]))


def v1_bytes(route: Route) -> bytes:
    """``route`` as a ``hearthnet-peer.v1`` peer takes it: the CBOR map, without
    ``control`` (peers from before that field refuse it; a v1 relay then charges the
    frame to the data budget)."""
    if route.control:
        route = Route(route.to, route.from_, route.ttl_hops, route.id, route.inner)
    return route.encode()
