"""The DNS-SD announcement of spec §7.1 and the table of peers seen: pure, no sockets."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hearthnet.errors import BadRequest, ConfigError
from hearthnet.identity import KeyPair
from hearthnet.ids import short_id
from hearthnet.mesh.announce import (
    DEFAULT_NAME,
    MAX_ADDRESSES,
    MAX_INSTANCE_BYTES,
    MAX_NAME_BYTES,
    Announcement,
    PeerTable,
    Sighting,
    sanitize_name,
)

NODE = KeyPair.from_seed(bytes([1]) * 32).node_id
OTHER = KeyPair.from_seed(bytes([2]) * 32).node_id
THIRD = KeyPair.from_seed(bytes([3]) * 32).node_id
COMMUNITY = KeyPair.from_seed(bytes([9]) * 32).node_id
FOREIGN = KeyPair.from_seed(bytes([8]) * 32).node_id


def announcement(node: str = NODE, **changes: object) -> Announcement:
    """A valid announcement with some fields changed."""
    fields: dict[str, object] = {
        "node": node,
        "community": COMMUNITY,
        "name": "kitchen",
        "port": 7080,
        "tls": False,
        "addresses": ("10.0.0.5",),
    }
    fields.update(changes)
    return Announcement(**fields)  # type: ignore[arg-type]


def good_txt() -> dict[bytes, bytes | None]:
    """The TXT record of :func:`announcement`."""
    return dict(announcement().to_txt())


def parse(txt: dict[bytes, bytes | None], instance: str | None = None) -> Announcement:
    """Parse ``txt`` under the instance name of :func:`announcement`."""
    name = announcement().instance if instance is None else instance
    return Announcement.from_record(name, txt, ["10.0.0.5"], 7080)


def test_txt_keys_are_the_spec_keys() -> None:
    """to_txt gives exactly v, node, community, port and tls of spec §7.1."""
    expected = {
        b"v": b"1",
        b"node": NODE.encode(),
        b"community": COMMUNITY.encode(),
        b"port": b"7080",
        b"tls": b"0",
    }
    assert expected == announcement().to_txt()


def test_instance_is_name_dash_short_id() -> None:
    """The instance name is <name>-<short id> and the service name adds the type."""
    ann = announcement()
    expected = (f"kitchen-{short_id(NODE)}", f"kitchen-{short_id(NODE)}._hearthnet._tcp.local.")
    assert expected == (ann.instance, ann.service_name)


def test_round_trip() -> None:
    """An announcement parsed from its own TXT record and instance name is equal to it."""
    ann = announcement(tls=True, addresses=("10.0.0.5", "192.168.1.20"))
    parsed = Announcement.from_record(ann.instance, dict(ann.to_txt()), ann.addresses, ann.port)
    assert ann == parsed


@given(
    name=st.text(max_size=120),
    port=st.integers(1, 65535),
    tls=st.booleans(),
    addresses=st.lists(st.ip_addresses(v=4).map(str), min_size=1, max_size=MAX_ADDRESSES),
)
def test_round_trip_any_name_port_and_addresses(
    name: str, port: int, tls: bool, addresses: list[str]
) -> None:
    """Any local name, port, tls flag and address list survives TXT encoding and parsing."""
    ann = Announcement.local(
        node=NODE, community=COMMUNITY, name=name, port=port, tls=tls, addresses=addresses
    )
    parsed = Announcement.from_record(ann.instance, dict(ann.to_txt()), addresses, port)
    assert (ann.node, ann.name, ann.port, ann.tls, tuple(sorted(set(addresses)))) == (
        parsed.node,
        parsed.name,
        parsed.port,
        parsed.tls,
        parsed.addresses,
    )


@given(st.text(max_size=200))
def test_sanitised_names_fit_one_label(name: str) -> None:
    """A sanitised name plus the short id never exceeds 63 octets and has no dot."""
    instance = f"{sanitize_name(name)}-{short_id(NODE)}"
    assert (True, False) == (len(instance.encode()) <= MAX_INSTANCE_BYTES, "." in instance)


def test_long_name_is_cut_on_a_character_boundary() -> None:
    """A long multi-byte name is cut to 43 octets without splitting a character."""
    name = sanitize_name("ü" * 40)  # 80 octets of UTF-8
    assert ("ü" * (MAX_NAME_BYTES // 2), MAX_INSTANCE_BYTES - 1) == (
        name,
        len(f"{name}-{short_id(NODE)}".encode()),
    )


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("living room", "living room"),
        ("a.b\\c", "a-b-c"),
        ("tab\there", "tab-here"),
        ("  ", DEFAULT_NAME),
        ("", DEFAULT_NAME),
        ("Cafe\u0301", "Café"),
    ],
)
def test_sanitize_name(raw: str, expected: str) -> None:
    """Dots, backslashes and control characters become '-', blanks a default, NFC applies."""
    assert expected == sanitize_name(raw)


def test_keys_compare_case_insensitively() -> None:
    """TXT keys in upper case are accepted (RFC 6763 §6.4)."""
    txt = {key.upper(): value for key, value in good_txt().items()}
    assert announcement() == parse(txt)


def test_unknown_keys_are_ignored() -> None:
    """A newer peer may add TXT keys; they are ignored."""
    assert announcement() == parse({**good_txt(), b"relay": b"1", b"flag": None})


def _without(key: bytes) -> dict[bytes, bytes | None]:
    txt = good_txt()
    del txt[key]
    return txt


MALFORMED_TXT: dict[str, dict[bytes, bytes | None]] = {
    "no v": _without(b"v"),
    "no node": _without(b"node"),
    "no community": _without(b"community"),
    "no port": _without(b"port"),
    "no tls": _without(b"tls"),
    "v=2": {**good_txt(), b"v": b"2"},
    "v without value": {**good_txt(), b"v": None},
    "node not a NodeID": {**good_txt(), b"node": b"ed25519:short"},
    "node of another scheme": {**good_txt(), b"node": b"rsa:" + b"A" * 43},
    "community not a NodeID": {**good_txt(), b"community": b"kitchen"},
    "port 0": {**good_txt(), b"port": b"0"},
    "port 65536": {**good_txt(), b"port": b"65536"},
    "port negative": {**good_txt(), b"port": b"-1"},
    "port with plus": {**good_txt(), b"port": b"+7080"},
    "port with blank": {**good_txt(), b"port": b" 7080"},
    "port leading zero": {**good_txt(), b"port": b"07080"},
    "port not a number": {**good_txt(), b"port": b"http"},
    "port too long": {**good_txt(), b"port": b"000007080"},
    "tls=yes": {**good_txt(), b"tls": b"yes"},
    "tls=true": {**good_txt(), b"tls": b"true"},
    "key twice in two cases": {**good_txt(), b"PORT": b"7080"},
    "non-ASCII key": {**good_txt(), "pört".encode(): b"1"},
    "non-ASCII value": {**good_txt(), b"tls": "ı".encode()},
    "too many keys": {**good_txt(), **{f"k{i}".encode(): b"x" for i in range(40)}},
    "too large": {**good_txt(), b"pad": b"x" * 1300},
}


@pytest.mark.parametrize("txt", MALFORMED_TXT.values(), ids=MALFORMED_TXT.keys())
def test_malformed_txt_is_refused(txt: dict[bytes, bytes | None]) -> None:
    """Every malformed TXT variant raises BadRequest."""
    with pytest.raises(BadRequest):
        parse(txt)


@pytest.mark.parametrize(
    "instance",
    [
        "kitchen-AAAA-BBBB-CCCC-DDDD",  # another node's short id
        "kitchen",  # no short id at all
        "x" * 50 + "-" + short_id(NODE),  # 70 octets: over one DNS label
        "a.b-" + short_id(NODE),  # a dot is never in a name we announce
    ],
)
def test_instance_name_must_fit_the_node(instance: str) -> None:
    """An instance name that is not a valid <name>-<short id> of the TXT node is refused."""
    with pytest.raises(BadRequest):
        parse(good_txt(), instance)


def test_srv_port_must_match_txt_port() -> None:
    """A SRV record on another port than the TXT port is refused."""
    with pytest.raises(BadRequest):
        Announcement.from_record(announcement().instance, good_txt(), ["10.0.0.5"], 7081)


@pytest.mark.parametrize("addresses", [[], ["fe80::1"], ["10.0.0.300"], ["host.local"]])
def test_addresses_must_be_ipv4(addresses: list[str]) -> None:
    """A record without addresses, or with a non-IPv4 one, is refused."""
    with pytest.raises(BadRequest):
        Announcement.from_record(announcement().instance, good_txt(), addresses, 7080)


def test_too_many_addresses_refused() -> None:
    """More than MAX_ADDRESSES addresses is refused."""
    addresses = [f"10.0.0.{i}" for i in range(1, MAX_ADDRESSES + 2)]
    with pytest.raises(BadRequest):
        Announcement.from_record(announcement().instance, good_txt(), addresses, 7080)


def test_local_announcement_with_bad_port_is_a_config_error() -> None:
    """Our own announcement with port 0 is a configuration error, not a wire error."""
    with pytest.raises(ConfigError):
        Announcement.local(node=NODE, community=COMMUNITY, name="x", port=0)


def test_urls_follow_tls_and_addresses() -> None:
    """urls lists one http(s) URL per address."""
    ann = announcement(tls=True, addresses=("10.0.0.5", "10.0.1.5"))
    assert ("https://10.0.0.5:7080", "https://10.0.1.5:7080") == ann.urls


# --- PeerTable ---------------------------------------------------------------------


def test_new_then_same_then_changed() -> None:
    """A peer is NEW once, SAME when repeated, CHANGED when its port moves."""
    table = PeerTable(NODE, COMMUNITY)
    peer = announcement(OTHER)
    sightings = [
        table.observe(peer),
        table.observe(peer),
        table.observe(dataclasses.replace(peer, port=7081)),
    ]
    assert ([Sighting.NEW, Sighting.SAME, Sighting.CHANGED], 7081) == (
        sightings,
        table.peers()[0].port,
    )


def test_own_node_and_other_community_are_ignored() -> None:
    """Our own echo and a node of another community are not remembered (spec §7.1)."""
    table = PeerTable(NODE, COMMUNITY)
    sightings = [
        table.observe(announcement(NODE)),
        table.observe(announcement(OTHER, community=FOREIGN)),
    ]
    stats = table.statistics()
    assert ([Sighting.OWN, Sighting.OTHER_COMMUNITY], 0, 1, 1) == (
        sightings,
        len(table),
        stats.ignored_own,
        stats.ignored_other_community,
    )


def test_full_table_refuses_new_nodes_and_keeps_known_ones() -> None:
    """At max_peers a new node is refused; a known node still updates."""
    table = PeerTable(NODE, COMMUNITY, max_peers=1)
    first = table.observe(announcement(OTHER))
    refused = table.observe(announcement(THIRD))
    updated = table.observe(announcement(OTHER, port=9000))
    assert (Sighting.NEW, Sighting.FULL, Sighting.CHANGED, [OTHER], 1) == (
        first,
        refused,
        updated,
        [p.node for p in table.peers()],
        table.statistics().refused_full,
    )


def test_forget_returns_the_lost_node_once() -> None:
    """A goodbye for a known instance loses the node once; an unknown instance loses nothing."""
    table = PeerTable(NODE, COMMUNITY)
    peer = announcement(OTHER)
    table.observe(peer)
    assert (OTHER, None, None, 0) == (
        table.forget(peer.instance),
        table.forget(peer.instance),
        table.forget("nobody-AAAA-BBBB-CCCC-DDDD"),
        len(table),
    )


def test_renamed_node_is_one_peer_and_old_goodbye_does_not_lose_it() -> None:
    """A node seen under a new name replaces its old entry; the old name's goodbye is ignored."""
    table = PeerTable(NODE, COMMUNITY)
    old = announcement(OTHER, name="old")
    new = announcement(OTHER, name="new")
    sightings = [table.observe(old), table.observe(new)]
    lost_by_old_name = table.forget(old.instance)
    assert ([Sighting.NEW, Sighting.CHANGED], None, ["new"]) == (
        sightings,
        lost_by_old_name,
        [p.name for p in table.peers()],
    )


def test_max_peers_must_be_positive() -> None:
    """A table that can hold nobody is a configuration error."""
    with pytest.raises(ConfigError):
        PeerTable(NODE, COMMUNITY, max_peers=0)
