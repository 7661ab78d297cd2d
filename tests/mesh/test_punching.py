"""The direct upgrade's pure parts (spec §8): the candidate a member offers, addresses,
and how ``hearthnet peers`` names a relayed link being punched."""

from __future__ import annotations

import pytest

from hearthnet.mesh.frame_fields import punchable_addr
from hearthnet.mesh.links import LinkErrors, PeerLink
from hearthnet.mesh.path_frames import Candidates
from hearthnet.mesh.protocol import PeerInfo
from hearthnet.mesh.punching import candidate, reusable_socket, split_addr
from hearthnet.mesh.relayed_link import RelayedLink, path_fields, record_path
from hearthnet.metrics import MetricsRegistry


def relayed_link() -> RelayedLink:
    """A relayed link to ``ed25519:peer`` via ``ed25519:relay`` that sends nowhere."""

    def down(link: PeerLink, reason: str) -> None:
        """Nothing to clean up."""

    return RelayedLink(
        PeerInfo("ed25519:peer", "peer", None, ""),
        "ed25519:relay",
        outbound=True,
        transmit=lambda peer, data: True,
        on_frame=lambda link, frame: None,
        on_down=down,
        errors=LinkErrors.register(MetricsRegistry()),
    )


def test_the_candidate_is_the_observed_ip_with_the_listening_port() -> None:
    """The NAT keeps our listening port for the punch, so that is the port offered."""
    assert "203.0.113.100:7080" == candidate("203.0.113.100:41234", 7080)


def test_an_ipv6_candidate_keeps_its_brackets() -> None:
    """An IPv6 observed address gives a bracketed candidate."""
    assert "[2001:db8::1]:7080" == candidate("[2001:db8::1]:50000", 7080)


@pytest.mark.parametrize(
    ("observed", "port"),
    [
        *((None, 7080), ("203.0.113.100:1", 0), ("0.0.0.0:1", 7080), ("no-port", 7080)),
        *(("x:1", 7080), ("127.0.0.1:1", 7080), ("169.254.1.1:1", 7080), ("[::1]:1", 7080)),
    ],
)
def test_no_candidate_without_a_usable_address(observed: str | None, port: int) -> None:
    """No observed address, no listening port, or one a punch may not go to: no upgrade."""
    assert None is candidate(observed, port)


def test_a_peers_candidates_keep_only_addresses_a_punch_may_go_to() -> None:
    """Loopback, multicast, unspecified, link-local, reserved and names are dropped."""
    offered = [
        *("127.0.0.1:80", "224.0.0.251:5353", "0.0.0.0:80", "169.254.9.9:80"),
        *("[::1]:80", "[fe80::1]:80", "240.0.0.1:80", "[::ffff:127.0.0.1]:80"),
    ]
    kept = Candidates.parse({"t": "candidates", "nonce": "n", "addrs": ["relay.example:80"]})
    mixed = Candidates.parse(
        {"t": "candidates", "nonce": "n", "addrs": ["203.0.113.7:4000", *offered[:7]]}
    )
    assert ((), ("203.0.113.7:4000",), [False] * 8) == (
        kept.addrs,
        mixed.addrs,
        [punchable_addr(a) for a in offered],
    )


def test_split_addr_reads_v4_and_v6() -> None:
    """``ip:port`` and ``[v6]:port`` split into host and port."""
    assert [("203.0.113.1", 80), ("2001:db8::1", 443)] == [
        split_addr("203.0.113.1:80"),
        split_addr("[2001:db8::1]:443"),
    ]


def test_a_relayed_link_being_punched_shows_as_upgrading() -> None:
    """``hearthnet peers`` says upgrading during the attempt; heartbeats still say relay."""
    link = relayed_link()
    before = path_fields(link)
    link.upgrading = True
    assert (
        {"path": "relayed", "via": "ed25519:relay"},
        {"path": "upgrading", "via": "ed25519:relay"},
        {"path": "relay", "via": "ed25519:relay"},
    ) == (before, path_fields(link), record_path(link))


def test_a_punch_socket_binds_beside_a_listener_on_the_same_port() -> None:
    """With SO_REUSEPORT on both, the punch socket takes the port the node listens on."""
    listener = reusable_socket("127.0.0.1", 0)
    listener.listen(1)
    port = listener.getsockname()[1]
    try:
        punch = reusable_socket("127.0.0.1", port)
        bound = punch.getsockname()[1]
        punch.close()
    finally:
        listener.close()
    assert port == bound
