"""[mesh] (spec §7, §8): peers, links, gossip, heartbeats, relays and federation peers."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

from hearthnet.config.schema import _doc
from hearthnet.ids import is_node_id

# keys whose values are addresses of nodes: checked when the configuration is loaded, so
# that a typo is said at start instead of being dialled, or dropped, in silence
URL_KEYS = ("peers", "relay_urls", "relay_peers", "advertise_url", "federation_peers")
NODE_URL_FORM = "http://host:port or https://host:port, e.g. http://192.168.1.10:7080"


def node_url_problem(value: str, *, mesh_ok: bool = False) -> str | None:
    """Why ``value`` is not the address of a node (``http(s)://host:port``), or None.

    ``mesh_ok``: ``mesh:<NodeID>`` is one too (a federation peer reached through relays).
    """
    if mesh_ok and value.startswith("mesh:"):
        if is_node_id(value[len("mesh:") :]):
            return None
        return f"{value!r} is not mesh:<NodeID> (mesh:ed25519:..., the node's hearthnet keys show)"
    try:
        parts = urlsplit(value.strip())
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port is not None
    except ValueError:  # a port that is not a number, or out of range
        ok = False
    return None if ok else f"{value!r} is not a node URL: write {NODE_URL_FORM}"


@dataclass(frozen=True, slots=True)
class MeshSection:
    """[mesh]: peers, links, gossip and heartbeats (spec §7)."""

    peers: tuple[str, ...] = field(
        default=(),
        metadata=_doc("Bootstrap peer URLs (http://host:port), also --peer (repeatable)."),
    )
    max_links: int = field(
        default=8,
        metadata=_doc(
            "D: peer links this node keeps open (more are accepted, up to twice as many)."
        ),
    )
    zeroconf: bool = field(
        default=True, metadata=_doc("Announce and browse _hearthnet._tcp.local. on the LAN.")
    )
    advertise_url: str = field(
        default="",
        metadata=_doc(
            "URL peers should dial to reach this node; empty: derived from the listen address."
        ),
    )
    heartbeat_s: float = field(
        default=5.0,
        metadata=_doc(
            "Ping interval per link; three missed pongs mark the link down (also --heartbeat-s).",
            positive=True,
        ),
    )
    anti_entropy_s: float = field(
        default=5.0,
        metadata=_doc(
            "How often each link exchanges per-origin heads to repair lost messages.", positive=True
        ),
    )
    repair_per_round: int = field(
        default=500,
        metadata=_doc(
            "Most messages sent to one peer per anti-entropy answer (rate limit of repair)."
        ),
    )
    caps_s: float = field(
        default=10.0, metadata=_doc("How often capability routes are re-announced.", positive=True)
    )
    presence_refresh_s: float = field(
        default=15.0,
        metadata=_doc(
            "How often local presence is re-announced to peers (they expire it after 45 s).",
            positive=True,
        ),
    )
    beacon_s: float = field(
        default=30.0,
        metadata=_doc("How often a beacon is published on mesh.beacon.", positive=True),
    )
    dial_interval_s: float = field(
        default=0.5,
        metadata=_doc("How often the link manager looks for peers to dial.", positive=True),
    )
    membership_per_request: int = field(
        default=1000,
        metadata=_doc(
            "Most membership records taken from one request or gossip frame (spec §1.5)."
        ),
    )
    membership_per_signer: int = field(
        default=10_000,
        metadata=_doc("Most membership records stored per signing key (spec §1.5)."),
    )
    relay: bool = field(
        default=False,
        metadata=_doc(
            "Serve as a relay for members that cannot be dialled (spec §8; also --relay)."
        ),
    )
    relay_urls: tuple[str, ...] = field(
        default=(),
        metadata=_doc(
            "Relays to attach to when peers cannot be dialled (spec §8; also --relay-url)."
        ),
    )
    relay_peers: tuple[str, ...] = field(
        default=(),
        metadata=_doc(
            "On a relay: other relays to federate with, exchanging route tables so members"
            " attached to either reach each other (spec §8; also --relay-peer). Both relays"
            " must name each other."
        ),
    )
    relay_member_bytes_per_s: int = field(
        default=256 * 1024,
        metadata=_doc("Relay budget: relayed bytes per second per member (spec §8)."),
    )
    relay_member_streams: int = field(
        default=64,
        metadata=_doc("Relay budget: destinations a member may send to at once (spec §8)."),
    )
    relay_capacity_bytes_per_s: int = field(
        default=8 * 1024 * 1024,
        metadata=_doc("Relay capacity shared fairly among the members sending (spec §8)."),
    )
    relay_member_control_bytes_per_s: int = field(
        default=16 * 1024,
        metadata=_doc(
            "Relay: per member, bytes per second of route frames marked control (heartbeats,"
            " acks, session hellos), apart from the data budget, so a busy member stays"
            " linked (spec §8)."
        ),
    )
    relay_pace_queue_bytes: int = field(
        default=1024 * 1024,
        metadata=_doc(
            "Member: bytes a relayed peer's frames may wait for the relay's budget before"
            " gossip to it is shed (anti-entropy repairs it later); other frames still"
            " wait (spec §8)."
        ),
    )
    relay_keepalive_s: float = field(
        default=1.0,
        metadata=_doc(
            "Member: how often each attached relay is pinged (spec §8 failover).", positive=True
        ),
    )
    relay_silence_s: float = field(
        default=3.0,
        metadata=_doc(
            "Member: a relay silent this long (of the member's own running time) is lost and"
            " its peers move to another relay (a relay that died without closing its"
            " connections; spec §8). Why 3 s: see 'Relay keepalive and silence' below.",
            positive=True,
        ),
    )
    direct_upgrade: bool = field(
        default=True,
        metadata=_doc(
            "Try to turn relayed links into direct ones by hole punching (spec §8); "
            "off: relayed peers stay relayed."
        ),
    )
    federation_peers: tuple[str, ...] = field(
        default=(),
        metadata=_doc(
            "Nodes of federated communities this node bridges to: it syncs agreements with"
            " them and pulls the topics they grant (spec §8; docs/federation.md; also"
            " --federation-peer). A URL, or mesh:<NodeID> for a node reached through a"
            " relay of its community (listed in mesh.relay_urls)."
        ),
    )
