"""Peer links (spec §7.2): frames, the signed hello handshake and link states. Pure.

One WebSocket per pair of nodes at ``/mesh/v1/peer``, subprotocol ``hearthnet-peer.v5``
(or v4, v3, v2, v1 with an older peer), each message one CBOR map ``{"t": kind, ...}``. The
handshake is three hellos::

    dialer   -> hello {node, community, ts, nonce=a, ...}                       (H1)
    acceptor -> hello {node, community, ts, nonce=b, their_nonce=a, ...}        (H2)
    dialer   -> hello {node, community, ts, nonce=a, their_nonce=b, ...}        (H3)

Each hello is signed by its sender over the JCS form without ``sig``. Each side checks the
other's signature, membership, clock window and that its own nonce came back, so a
recorded hello cannot open a link. Frames other than hello (or the other side's refusing
``bye``) before the handshake ends are a protocol violation.

A side that refuses the other says why in a ``bye {code, reason}`` before it closes; the
refused side raises that error (:func:`refusal_from_bye`), so a dialer knows it was revoked,
not a member, or dialling itself.

Link states (a :class:`PeerLink` exists once the handshake is done)::

    HANDSHAKING -> UP -> CLOSING -> DOWN
         \\----------\\--------------> DOWN
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hearthnet import cbor
from hearthnet.canonical import check_representable
from hearthnet.errors import (
    BadRequest,
    Expired,
    Forbidden,
    InvalidSignature,
    PayloadTooLarge,
    Revoked,
    Unauthorized,
    WireError,
    error_from_wire,
)
from hearthnet.identity import KeyPair, verify_object
from hearthnet.ids import is_node_id
from hearthnet.membership import Membership
from hearthnet.mesh.relay_frames import RELAY_FRAME_KINDS
from hearthnet.shapes import Shape

ANOTHER_COMMUNITY = "the peer belongs to another community"  # a hello refused for it

# spec §7.2, §8: v2 carries route frames in the binary form (mesh/route_header.py); v1
# peers get them as CBOR maps, and no hello field or frame field newer than v1 (a v1 peer
# may refuse it). v3 adds whole-batch gossip (``batch`` frames, mesh/batches.py) and
# messages with ``data_enc`` (binary payloads: a node built before them refuses such an
# envelope; mesh/older_links.py). v4 adds route batches (many route frames in one message,
# mesh/route_batch.py). v5 adds the hello's ``features``: what the sender's build does that
# an older one does not, beyond what the link carries (unknown ones ignored, so a later
# behaviour needs no new subprotocol). A dialer offers all, newest first; the acceptor
# takes the first it speaks, so the link's version is known before the hellos.

SUBPROTOCOL_V5 = "hearthnet-peer.v5"
SUBPROTOCOL_V4 = "hearthnet-peer.v4"
SUBPROTOCOL_V3 = "hearthnet-peer.v3"
SUBPROTOCOL_V2 = "hearthnet-peer.v2"
SUBPROTOCOL_V1 = "hearthnet-peer.v1"
SUBPROTOCOL = SUBPROTOCOL_V5  # the newest
SUBPROTOCOLS = (SUBPROTOCOL_V5, SUBPROTOCOL_V4, SUBPROTOCOL_V3, SUBPROTOCOL_V2, SUBPROTOCOL_V1)
LINK_VERSIONS = {
    SUBPROTOCOL_V5: 5,
    SUBPROTOCOL_V4: 4,
    SUBPROTOCOL_V3: 3,
    SUBPROTOCOL_V2: 2,
    SUBPROTOCOL_V1: 1,
}
LINK_VERSION = 5  # the newest version spoken
# The features a v5 hello lists (``features``); a peer's unknown ones are ignored.
# ``call_resend``: the node drops a call opening it took already, by (peer, call id), so a
# caller may send it again after a path change (spec §8; mesh/call_hold.py). An older node
# answers such an opening with ``capacity_exceeded`` (or as a replay).
FEATURE_CALL_RESEND = "call_resend"
FEATURES = (FEATURE_CALL_RESEND,)
# A relayed path (spec §8) has no subprotocol of its own: the far end is not known, and it
# gets what it got before v3 (messages with data_enc, no batch frames).
NO_SUBPROTOCOL = 0


def link_subprotocol(link: int) -> str | None:
    """The subprotocol of peer-link version ``link`` (None for a relayed path)."""
    return next((p for p, v in LINK_VERSIONS.items() if v == link), None)


def link_version(subprotocol: str | None) -> int:
    """The peer-link version a negotiated WebSocket subprotocol stands for (1 when none)."""
    return LINK_VERSIONS.get(subprotocol or "", 1)


MAX_FRAME_BYTES = 2 * 1024 * 1024
CLOCK_WINDOW_MS = 60_000

FRAME_KINDS = frozenset(
    {
        "hello",
        "msg",
        "batch",
        "ihave",
        "iwant",
        "presence",
        "call",
        "frame",
        "tool_result",
        "cancel",
        "ack",
        "route",
        "membership",
        "ping",
        "pong",
        "bye",
        "caps",
        "peers",
    }
)
# requests between bridges of federated communities (spec §8): their classes are in
# federation/carrier.py, and only links with such nodes carry them (relay_federated.py)
CARRIED_FRAME_KINDS = frozenset({"fed_req", "fed_res"})
FRAME_KINDS |= CARRIED_FRAME_KINDS
# Relay frames (spec §8), defined in relay_frames.py: attach, route, sealed, pframe, ...
FRAME_KINDS |= RELAY_FRAME_KINDS


# The fields a hello may carry (the other kinds' shapes are in mesh/frames.py); a field
# not listed is refused with bad_request before the signature is checked.
HELLO_SHAPE = Shape.of(
    "hello frame",
    (
        *("t", "node", "community", "ts", "nonce", "their_nonce"),
        *("name", "version", "url", "full", "relay", "sig"),
    ),
)
# spec §8: on v4 the hello also lists the relays the sender is reachable through (the
# manifest's ``relays``); a v1-v3 peer refuses that field, so those links never carry it.
HELLO_SHAPE_V4 = Shape.of("hello frame", (*HELLO_SHAPE.fields, "relays"))
# v5 also lists the sender's ``features`` (FEATURES); a v1-v4 peer refuses that field
HELLO_SHAPE_V5 = Shape.of("hello frame", (*HELLO_SHAPE_V4.fields, "features"))
MAX_HELLO_RELAYS = 8  # relay URLs a hello lists (as many as an invite brings)
MAX_HELLO_URL_CHARS = 512  # the longest relay URL (or own url) a hello is taken with
MAX_HELLO_FEATURES = 32  # features a hello lists
MAX_FEATURE_CHARS = 64  # the longest feature name


def hello_relays(hello: dict[str, Any], link: int) -> tuple[str, ...]:
    """The relays a peer's hello lists (spec §8), checked for the link's version.

    Raises:
        BadRequest: an unknown field for ``link``, or ``relays`` not a list of at most
            :data:`MAX_HELLO_RELAYS` strings of at most :data:`MAX_HELLO_URL_CHARS` chars.
    """
    shape = HELLO_SHAPE_V5 if link >= 5 else HELLO_SHAPE_V4 if link >= 4 else HELLO_SHAPE
    shape.check(hello)
    return tuple(_hello_strings(hello, "relays", MAX_HELLO_RELAYS, MAX_HELLO_URL_CHARS, "URLs"))


def _hello_strings(
    hello: dict[str, Any], field: str, most: int, chars: int, what: str
) -> list[str]:
    """A hello's ``field``: a list of at most ``most`` strings of 1 to ``chars`` characters
    (none when absent).

    Raises:
        BadRequest: anything else.
    """
    items = hello.get(field, [])
    if (
        not isinstance(items, list)
        or len(items) > most
        or not all(isinstance(i, str) and 0 < len(i) <= chars for i in items)
    ):
        raise BadRequest(
            f"hello {field} is a list of at most {most} {what} of at most {chars} characters"
        )
    return items


def hello_features(hello: dict[str, Any]) -> frozenset[str]:
    """The features of ours a peer's (shape-checked) hello lists: the ones we do not know
    are ignored (a later build's).

    Raises:
        BadRequest: ``features`` not a list of at most :data:`MAX_HELLO_FEATURES` strings
            of 1 to :data:`MAX_FEATURE_CHARS` characters.
    """
    features = _hello_strings(hello, "features", MAX_HELLO_FEATURES, MAX_FEATURE_CHARS, "names")
    return frozenset(features) & frozenset(FEATURES)


class LinkState(enum.Enum):
    """Where a peer link is in its life."""

    HANDSHAKING = "handshaking"
    UP = "up"
    CLOSING = "closing"
    DOWN = "down"


TRANSITIONS: dict[LinkState, frozenset[LinkState]] = {
    LinkState.HANDSHAKING: frozenset({LinkState.UP, LinkState.CLOSING, LinkState.DOWN}),
    LinkState.UP: frozenset({LinkState.CLOSING, LinkState.DOWN}),
    LinkState.CLOSING: frozenset({LinkState.DOWN}),
    LinkState.DOWN: frozenset(),
}


class LinkToSelf(BadRequest):
    """The hello came from this node's own key: the address dialled is our own."""


def bye_for(error: WireError) -> bytes:
    """The ``bye`` that tells the peer why it was refused (``self_link`` marks a node that
    dialled itself, so it can forget that address)."""
    fields: dict[str, Any] = {"code": error.code, "reason": error.message[:200]}
    if isinstance(error, LinkToSelf):
        fields["self_link"] = True
    return encode_frame("bye", **fields)


def refusal_from_bye(frame: dict[str, Any]) -> WireError:
    """The typed error a peer's ``bye`` stands for (``remote`` is true)."""
    reason = str(frame.get("reason", ""))[:200]
    if frame.get("self_link") is True:
        return LinkToSelf(reason, remote=True)
    code = frame.get("code")
    return error_from_wire({"code": code if isinstance(code, str) else None, "message": reason})


def encode_frame(kind: str, **fields: Any) -> bytes:
    """One link frame as CBOR."""
    return cbor.dumps({"t": kind, **fields})


def decode_frame(data: bytes) -> dict[str, Any]:
    """Parse one link frame.

    Raises:
        PayloadTooLarge: over the frame limit.
        BadRequest: not CBOR, not a map, or an unknown kind.
        NotCanonical: a value canonical JSON cannot represent (spec §2.5; byte strings
            are the carrier of signed JSON here and pass).
    """
    if len(data) > MAX_FRAME_BYTES:
        raise PayloadTooLarge(f"link frame over {MAX_FRAME_BYTES} bytes")
    try:
        obj = cbor.loads(data)
    except (cbor.CBORDecodeError, ValueError, TypeError, OverflowError) as exc:
        raise BadRequest(f"malformed link frame: {exc}") from exc
    if not isinstance(obj, dict) or obj.get("t") not in FRAME_KINDS:
        raise BadRequest("a link frame is a map with a known kind t")
    check_representable(obj, carrier_bytes=True)
    return obj


@dataclass(frozen=True, slots=True)
class PeerInfo:
    """Who is at the other end of an established link."""

    node: str
    name: str
    url: str | None
    version: str
    full: bool = False  # the peer has all the links it takes: it sends addresses, then bye
    relay: bool = False  # the peer serves as a relay (spec §8; federation needs it)
    link: int = NO_SUBPROTOCOL  # the peer-link version (1 to 4) the link speaks
    # the peer's community when it is a federated one (spec §8), None for our own: such a
    # link serves relaying and the bridge's requests only (mesh/relay_federated.py)
    community: str | None = None
    relays: tuple[str, ...] = ()  # the relay URLs its hello lists (v4, spec §8)
    features: frozenset[str] = frozenset()  # those of ours its hello lists (v5)

    @property
    def takes_call_resends(self) -> bool:
        """Whether the peer drops a call opening sent again after a path change (its v5
        hello lists ``call_resend``; spec §8, mesh/call_hold.py): an older one answers
        it with ``capacity_exceeded``, so it is not sent one again."""
        return FEATURE_CALL_RESEND in self.features

    @property
    def takes_batches(self) -> bool:
        """Whether the peer is sent whole batches as ``batch`` frames (v3, spec §6.2)."""
        return self.link >= 3

    @property
    def takes_route_batches(self) -> bool:
        """Whether the peer is sent route batches, many route frames in one message (v4,
        spec §11; mesh/route_batch.py)."""
        return self.link >= 4

    @property
    def takes_binary(self) -> bool:
        """Whether the peer is sent messages with ``data_enc`` (v3; a relayed path too,
        as before v3: its far end's version is not known)."""
        return self.link >= 3 or self.link == NO_SUBPROTOCOL


@dataclass
class Handshake:
    """One side of the hello exchange (pure; the caller passes time and frames)."""

    keys: KeyPair
    membership: Membership
    outbound: bool
    now_ms: int
    name: str = ""
    url: str | None = None
    version: str = ""
    expect: str | None = None  # the NodeID we meant to reach, when we know it
    full: bool = False  # we accept no more links: the peer gets addresses, then bye "full"
    relay: bool = False  # we serve as a relay (spec §8): relays federate only with relays
    link: int = LINK_VERSION  # the peer-link version the WebSocket negotiated
    # spec §8: (node, community) -> whether node is a current member of that federated
    # community under an agreement in force; such a node is taken when one end relays
    federated: Callable[[str, str], bool] | None = None
    # spec §8: the relay URLs we are reachable through, listed in our hello on v4 links
    relays: tuple[str, ...] = ()
    # what our build does (FEATURES, from the dialer), listed in our hello on v5 links
    features: tuple[str, ...] = ()
    # spec §8: (node, community) -> whether an agreement in force names node among that
    # community's bridges: the only ones our relay takes (counts the others it refuses)
    bridge: Callable[[str, str], bool] | None = None
    nonce: str = field(default_factory=lambda: os.urandom(16).hex())
    their_nonce: str | None = None
    peer: PeerInfo | None = None
    done: bool = False

    def _hello(self, now_ms: int) -> bytes:
        body: dict[str, Any] = {
            "node": self.keys.node_id,
            "community": self.membership.community_id,
            "ts": now_ms,
            "nonce": self.nonce,
            "name": self.name,
            "version": self.version,
        }
        if self.url:
            body["url"] = self.url
        if self.full:
            body["full"] = True
        if self.relay:  # absent otherwise: a plain node's hello reads as before
            body["relay"] = True
        if self.relays and self.link >= 4:  # older peers refuse the field
            body["relays"] = list(self.relays[:MAX_HELLO_RELAYS])
        if self.features and self.link >= 5:  # older peers refuse the field
            body["features"] = list(self.features[:MAX_HELLO_FEATURES])
        if self.their_nonce is not None:
            body["their_nonce"] = self.their_nonce
        body["sig"] = self.keys.sign_object(body)
        return encode_frame("hello", **body)

    def start(self) -> bytes:
        """The dialer's first hello (H1)."""
        if not self.outbound:
            raise RuntimeError("only the dialer starts the handshake")
        return self._hello(self.now_ms)

    def receive(self, frame: dict[str, Any], now_ms: int) -> bytes | None:
        """Take the peer's hello; return our next hello, or None. ``done`` is set when the
        link may go up.

        Raises:
            BadRequest: not a hello, or malformed.
            LinkToSelf: the hello is our own.
            InvalidSignature / Unauthorized / Revoked / Expired: the peer is refused.
            Forbidden: a federated community's node that no agreement names a bridge.
            WireError: with ``remote`` true, the peer refused us with a ``bye`` (its code).
        """
        if frame.get("t") == "bye":
            raise refusal_from_bye(frame)
        if frame.get("t") != "hello":
            raise BadRequest("the handshake is hello frames only")
        hello = {k: v for k, v in frame.items() if k != "t"}
        relays = hello_relays(hello, self.link)
        features = hello_features(hello)
        node, community, ts = hello.get("node"), hello.get("community"), hello.get("ts")
        if (
            not is_node_id(node)
            or not isinstance(ts, int)
            or not isinstance(hello.get("nonce"), str)
        ):
            raise BadRequest("hello needs node, community, ts and nonce")
        assert isinstance(node, str)
        if node == self.keys.node_id:
            raise LinkToSelf("a link to ourselves")
        if self.expect is not None and node != self.expect:
            raise Unauthorized(f"expected {self.expect}, reached {node}")
        if community != self.membership.community_id:
            if not self._federated_peer(node, community, hello.get("relay") is True):
                raise Unauthorized(ANOTHER_COMMUNITY)

        elif self.membership.is_revoked(node):
            raise Revoked("the peer is revoked")
        elif self.membership.level_of(node) is None:
            raise Unauthorized("the peer is not a member of this community")
        if abs(now_ms - ts) > CLOCK_WINDOW_MS:
            raise Expired("hello timestamp outside the clock window")
        verify_object(node, hello, hello.get("sig"), "sig")
        if community != self.membership.community_id and not self._named_bridge(node, community):
            raise Forbidden(
                f"{node} is not named among the bridges of {community} in a federation"
                " agreement in force with this community"
            )
        echoed = hello.get("their_nonce")
        if self.outbound:
            if echoed != self.nonce:
                raise InvalidSignature("the peer did not echo our nonce")
            self.their_nonce = str(hello["nonce"])
            self._accept(hello, relays, features)
            return self._hello(now_ms)  # H3
        if self.their_nonce is None:
            if echoed is not None:
                raise BadRequest("the first hello carries no their_nonce")
            self.their_nonce = str(hello["nonce"])
            return self._hello(now_ms)  # H2
        if echoed != self.nonce or hello["nonce"] != self.their_nonce:
            raise InvalidSignature("the peer did not echo our nonce")
        self._accept(hello, relays, features)
        return None

    def _federated_peer(self, node: str, community: object, peer_relays: bool) -> bool:
        """spec §8: a node of another community is taken only when it attaches to us, a
        relay (it dialled us), or we attach to it, a relay (we dialled it and its hello
        says it relays), and it is a current member of a community we hold an agreement
        in force with."""
        relayed_by = peer_relays if self.outbound else self.relay
        return (
            isinstance(community, str)
            and relayed_by
            and self.federated is not None
            and self.federated(node, community)
        )

    def _named_bridge(self, node: str, community: object) -> bool:
        """spec §8: our relay takes only the bridges an agreement names (checked once
        the hello verified, so only a real refusal is counted); a relay of theirs that
        we dialled need not be one."""
        if self.outbound:
            return True
        return (
            isinstance(community, str) and self.bridge is not None and self.bridge(node, community)
        )

    def _accept(
        self, hello: dict[str, Any], relays: tuple[str, ...], features: frozenset[str]
    ) -> None:
        url = hello.get("url")
        community = hello.get("community")
        self.peer = PeerInfo(
            str(hello["node"]),
            str(hello.get("name", ""))[:128],
            url if isinstance(url, str) and len(url) < 512 else None,
            str(hello.get("version", ""))[:32],
            hello.get("full") is True,
            hello.get("relay") is True,
            self.link,
            community if community != self.membership.community_id else None,
            relays,
            features,
        )
        self.done = True


def winning_direction(local: str, remote: str) -> bool:
    """Simultaneous dials (spec §7.2): the link dialed by the lower NodeID survives.
    True when *our outbound* link to ``remote`` is the one to keep."""
    return local < remote
