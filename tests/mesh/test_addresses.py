"""The peer book: normalised URLs, bounded, backoff, persisted (spec §7.1, §9)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearthnet.errors import BadRequest
from hearthnet.identity import KeyPair
from hearthnet.mesh.addresses import MAX_ADDRESSES, PeerBook, normalize_url

PEER = KeyPair.from_seed(b"\x71" * 32).node_id


@pytest.mark.parametrize(
    ("url", "normal"),
    [
        ("http://127.0.0.1:7080/", "http://127.0.0.1:7080"),
        ("https://Node.local:443", "https://node.local:443"),
        ("http://[::1]:7080", "http://[::1]:7080"),
    ],
)
def test_urls_normalised(url: str, normal: str) -> None:
    """Scheme, host and port only."""
    assert normal == normalize_url(url)


@pytest.mark.parametrize(
    "url", ["ftp://x:1", "http://x", "nonsense", 5, "http://x:port", "http://x:99999"]
)
def test_bad_urls(url: object) -> None:
    """Anything but http(s)://host:port is refused (a port that is no number, or out of
    range, too: once a ValueError out of peer exchange)."""
    with pytest.raises(BadRequest):
        normalize_url(url)


def test_backoff_doubles_to_30s_and_success_resets() -> None:
    """Failures push the next try out (0.5 s doubling, capped); success clears it."""
    book = PeerBook()
    book.add("http://127.0.0.1:1")
    delays = []
    for _ in range(10):
        book.failed("http://127.0.0.1:1", 0.0)
        delays.append(book.addresses["http://127.0.0.1:1"].next_try)
    book.succeeded("http://127.0.0.1:1", PEER, 5)
    assert (True, True, 0.0) == (
        0.4 <= delays[0] <= 0.6,
        24 <= delays[-1] <= 36,
        book.addresses["http://127.0.0.1:1"].next_try,
    )


def test_own_urls_refused_and_book_bounded() -> None:
    """We never dial ourselves; the book never grows past its bound."""
    book = PeerBook(own_urls=("http://127.0.0.1:9",))
    assert None is book.add("http://127.0.0.1:9")
    for port in range(MAX_ADDRESSES + 50):
        book.add(f"http://127.0.0.1:{port + 10}")
    assert MAX_ADDRESSES == len(book.addresses)


def test_saved_and_loaded(tmp_path: Path) -> None:
    """Addresses survive a restart."""
    book = PeerBook(tmp_path / "peers.json")
    book.add("http://10.0.0.2:7080", node=PEER)
    book.succeeded("http://10.0.0.2:7080", PEER, 42)
    book.save()
    again = PeerBook(tmp_path / "peers.json")
    again.load()
    assert [{"url": "http://10.0.0.2:7080", "node": PEER}] == again.urls_for_exchange()


def test_known_peers_lists_a_node_once_whatever_its_addresses() -> None:
    """A stopped peer known at http:// and https:// (there without its node id) is one row,
    its working address first; addresses of a linked peer are left out."""
    other = KeyPair.from_seed(b"\x72" * 32).node_id
    book = PeerBook()
    book.add("http://10.0.0.5:7080", node=PEER, source="zeroconf")
    book.add("https://10.0.0.5:7080", source="exchange")  # node not known at this address
    book.failed("http://10.0.0.5:7080", 0.0)
    book.addresses["https://10.0.0.5:7080"].last_ok_ms = 1_000
    book.add("http://10.0.0.6:7080", node=other)
    book.add("http://10.0.0.7:7080")
    rows = book.known_peers(linked={other})
    assert [
        {
            "node": PEER,
            "linked": False,
            "url": "https://10.0.0.5:7080",
            "urls": ["http://10.0.0.5:7080", "https://10.0.0.5:7080"],
            "source": "exchange",
            "failures": 0,
            "last_ok_ms": 1_000,
        },
        {
            "node": None,
            "linked": False,
            "url": "http://10.0.0.7:7080",
            "urls": ["http://10.0.0.7:7080"],
            "source": "bootstrap",
            "failures": 0,
            "last_ok_ms": None,
        },
    ] == sorted(rows, key=lambda r: r["url"], reverse=True)


def test_known_peers_leaves_out_an_address_a_linked_peer_claims() -> None:
    """A LAN address learnt by peer exchange with no node (its node sits behind NAT, so
    our dial of it never got through) is the linked peer's whose hello gives it: not a
    row of its own; an address nobody claims still is."""
    book = PeerBook()
    book.add("http://192.168.2.10:7080", source="exchange")
    book.failed("http://192.168.2.10:7080", 0.0)
    book.add("http://192.168.3.10:7080", source="exchange")
    rows = book.known_peers(linked={PEER}, claimed={"http://192.168.2.10:7080/": PEER})
    assert ["http://192.168.3.10:7080"] == [r["url"] for r in rows]
    assert 2 == len(book.known_peers(linked={PEER}))


MALLORY = KeyPair.from_seed(b"\x73" * 32).node_id


def test_a_claim_never_overwrites_what_our_own_dial_found() -> None:
    """An inbound hello's url or an exchanged entry naming another node leaves a verified
    address as our dial found it, expected on the next dial and shared as it is."""
    book = PeerBook()
    book.add("http://10.0.0.2:7080")
    book.succeeded("http://10.0.0.2:7080", PEER, 42)
    book.add("http://10.0.0.2:7080", node=MALLORY, source="inbound")
    book.learn_exchanged([{"url": "http://10.0.0.2:7080", "node": MALLORY}], "me")
    entry = book.addresses["http://10.0.0.2:7080"]
    assert (PEER, PEER, [{"url": "http://10.0.0.2:7080", "node": PEER}]) == (
        entry.node,
        entry.expect,
        book.urls_for_exchange(),
    )


def test_a_claim_is_dialled_expecting_nobody_and_not_shared() -> None:
    """A claimed address is due even while its claimant is linked, is dialled expecting
    no node, and is not shared until our own dial records who answers there."""
    book = PeerBook()
    book.add("http://10.0.0.2:7080", node=MALLORY, source="inbound")
    book.learn_exchanged([{"url": "http://10.0.0.3:7080", "node": MALLORY}], "me")
    before = (
        sorted(a.url for a in book.due(0.0, {MALLORY})),
        book.addresses["http://10.0.0.2:7080"].expect,
        book.urls_for_exchange(),
    )
    book.succeeded("http://10.0.0.2:7080", PEER, 42)
    after = ([a.url for a in book.due(0.0, {PEER})], book.urls_for_exchange())
    assert (
        (["http://10.0.0.2:7080", "http://10.0.0.3:7080"], None, []),
        (["http://10.0.0.3:7080"], [{"url": "http://10.0.0.2:7080", "node": PEER}]),
    ) == (before, after)


def test_only_verified_addresses_are_saved_as_verified(tmp_path: Path) -> None:
    """After a restart a claim is still a claim and a verified address still verified."""
    book = PeerBook(tmp_path / "peers.json")
    book.add("http://10.0.0.2:7080", node=MALLORY, source="inbound")
    book.succeeded("http://10.0.0.3:7080", PEER, 42)
    book.save()
    again = PeerBook(tmp_path / "peers.json")
    again.load()
    assert (None, PEER) == (
        again.addresses["http://10.0.0.2:7080"].expect,
        again.addresses["http://10.0.0.3:7080"].expect,
    )


def test_a_peers_own_claim_travels_with_its_node_id_and_lists_it_once(tmp_path: Path) -> None:
    """An address a linked peer's hello claims is passed on ``claimed_by`` it (not as its
    ``node``: our dial did not check it); the receiver lists it under that node, so a
    peer it reaches through a relay has one row, also after a restart, while the address
    is still dialled expecting nobody and its node stays unknown to the dial loop."""
    sender = PeerBook()
    sender.add("http://192.168.2.10:7080", node=PEER, source="inbound")
    entry = sender.exchange_entry("http://192.168.2.10:7080", PEER)
    book = PeerBook(tmp_path / "peers.json")
    book.learn_exchanged([entry], "me")
    book.failed("http://192.168.2.10:7080", 0.0)
    linked = book.known_peers(linked={PEER})
    book.save()
    again = PeerBook(tmp_path / "peers.json")
    again.load()
    address = again.addresses["http://192.168.2.10:7080"]
    assert (
        {"url": "http://192.168.2.10:7080", "claimed_by": PEER},
        [],
        [(PEER, "http://192.168.2.10:7080")],
        (None, None, PEER),
    ) == (
        entry,
        linked,
        [(r["node"], r["url"]) for r in again.known_peers(linked=set())],
        (address.node, address.expect, address.claimed_by),
    )


def test_a_claim_our_dial_found_false_is_passed_on_without_a_node() -> None:
    """A linked peer claims an address where our own dial found another node: it goes on
    with neither; a claim naming the receiver itself, or no NodeID, is not taken as one."""
    book = PeerBook()
    book.succeeded("http://10.0.0.2:7080", PEER, 42)
    false = book.exchange_entry("http://10.0.0.2:7080", MALLORY)
    receiver = PeerBook()
    receiver.learn_exchanged(
        [
            {"url": "http://10.0.0.3:7080", "claimed_by": PEER},
            {"url": "http://10.0.0.4:7080", "claimed_by": "bob"},
        ],
        PEER,
    )
    assert ({"url": "http://10.0.0.2:7080"}, ["http://10.0.0.4:7080"], None) == (
        false,
        list(receiver.addresses),
        receiver.addresses["http://10.0.0.4:7080"].claimed_by,
    )


def test_retry_now_ends_the_backoff_of_those_nodes_only() -> None:
    """The addresses of the nodes named are due at once with no failures; a held one
    (its link is up) and other nodes' addresses keep waiting."""
    other = KeyPair.from_seed(b"\x33" * 32).node_id
    book = PeerBook()
    for url, node in (("http://10.0.0.1:1", PEER), ("http://10.0.0.2:1", other)):
        book.add(url, node=node)
        for _ in range(4):
            book.failed(url, 0.0)
    book.add("http://10.0.0.3:1", node=PEER)
    book.hold("http://10.0.0.3:1", 0.0, 3600)
    book.retry_now({PEER}, 1.0)
    assert [(0, 1.0), (4, True), (0, 3600.0)] == [
        (
            book.addresses["http://10.0.0.1:1"].failures,
            book.addresses["http://10.0.0.1:1"].next_try,
        ),
        (
            book.addresses["http://10.0.0.2:1"].failures,
            book.addresses["http://10.0.0.2:1"].next_try > 1.0,
        ),
        (
            book.addresses["http://10.0.0.3:1"].failures,
            book.addresses["http://10.0.0.3:1"].next_try,
        ),
    ]
