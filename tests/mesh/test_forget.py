"""Forgetting known peer addresses (``hearthnet peers forget``): what is forgotten, what
peer exchange may not bring back, what the answer says. Pure, no sockets."""

from __future__ import annotations

from pathlib import Path

import pytest

from hearthnet.errors import BadRequest, NotFound
from hearthnet.identity import KeyPair
from hearthnet.mesh.addresses import MAX_FORGOTTEN, PeerBook, forget_target
from hearthnet.mesh.forget import forget, forget_notes

GONE = KeyPair.from_seed(b"\x51" * 32).node_id
STAYS = KeyPair.from_seed(b"\x52" * 32).node_id
OWN = KeyPair.from_seed(b"\x53" * 32).node_id


def _book(path: Path | None = None) -> PeerBook:
    book = PeerBook(path)
    book.succeeded("http://10.0.0.5:7080", GONE, 1)  # verified there
    book.add("https://10.0.0.5:7080", source="exchange")  # the same place, other scheme
    book.add("http://192.168.1.5:7080", source="exchange", claimed_by=GONE)  # its claim
    book.succeeded("http://10.0.0.6:7080", STAYS, 1)
    return book


@pytest.mark.parametrize(
    ("text", "target"),
    [
        (GONE, GONE),
        ("10.0.0.5:7080", "http://10.0.0.5:7080"),
        (" https://Host.lan:443/ ", "https://host.lan:443"),
    ],
)
def test_a_target_is_a_node_id_or_an_address(text: str, target: str) -> None:
    """NodeIDs as given; addresses normalised, ``host:port`` taken as http."""
    assert target == forget_target(text)


def test_a_target_that_is_neither_says_what_is_taken() -> None:
    """A typo of a NodeID or a bare host is refused, naming both forms."""
    with pytest.raises(BadRequest, match=r"ed25519:\.\.\. or http://host:port"):
        forget_target("ed25519:short")


def test_forgetting_a_node_forgets_every_address_of_it() -> None:
    """The verified address, the same place under the other scheme, and the address it
    claims go; another node's stays."""
    book = _book()
    answer = forget(book, GONE, links={}, configured=())
    assert (
        {
            "target": GONE,
            "forgotten": ["http://10.0.0.5:7080", "http://192.168.1.5:7080"],
            "linked": [],
            "configured": [],
        },
        ["https://10.0.0.5:7080", "http://10.0.0.6:7080"],
    ) == (answer, list(book.addresses))


def test_forgetting_an_address_takes_both_schemes_and_no_other() -> None:
    """``host:port`` under http and https; the node's other address stays."""
    book = _book()
    answer = forget(book, "http://10.0.0.5:7080", links={}, configured=())
    assert (
        ["http://10.0.0.5:7080", "https://10.0.0.5:7080"],
        ["http://192.168.1.5:7080", "http://10.0.0.6:7080"],
    ) == (answer["forgotten"], list(book.addresses))


def test_nothing_matched_is_not_found_and_marks_nothing() -> None:
    """A target no address matches is refused, saying where the known ones are listed;
    a node linked only by its own dial is named as such."""
    book = _book()
    with pytest.raises(NotFound, match="hearthnet peers lists the known ones") as plain:
        forget(book, "http://10.9.9.9:1", links={}, configured=())
    with pytest.raises(NotFound, match="linked now, by its own dial"):
        forget(book, OWN, links={OWN: None}, configured=())
    assert ({}, 4) == (book.forgotten, len(book.addresses)), plain


def test_peer_exchange_does_not_bring_a_forgotten_node_back() -> None:
    """Shared by a peer again (the same address or the node at a new one): refused."""
    book = _book()
    forget(book, GONE, links={}, configured=())
    book.learn_exchanged(
        [
            {"url": "http://10.0.0.5:7080", "node": GONE},
            {"url": "http://10.0.0.99:7080", "node": GONE},
            {"url": "http://10.0.0.7:7080", "node": STAYS},
        ],
        OWN,
    )
    assert ["https://10.0.0.5:7080", "http://10.0.0.6:7080", "http://10.0.0.7:7080"] == list(
        book.addresses
    )


def test_what_vouches_for_a_forgotten_address_brings_it_back() -> None:
    """Configuration (bootstrap), zeroconf, its inbound hello or our dial working lift the
    marks of that address and node: peer exchange may share the node again; the address
    it claimed, that nothing vouched for, stays forgotten."""
    book = _book()
    forget(book, GONE, links={}, configured=())
    book.add("http://10.0.0.5:7080", node=GONE, source="inbound")
    book.learn_exchanged(
        [
            {"url": "http://10.0.0.99:7080", "node": GONE},
            {"url": "http://192.168.1.5:7080", "claimed_by": GONE},
        ],
        OWN,
    )
    assert (["192.168.1.5:7080"], True, False) == (
        list(book.forgotten),
        "http://10.0.0.99:7080" in book.addresses,
        "http://192.168.1.5:7080" in book.addresses,
    )


def test_forgotten_marks_survive_a_restart_and_are_bounded(tmp_path: Path) -> None:
    """The marks are saved with the book and loaded again; at most MAX_FORGOTTEN, the
    oldest go first."""
    path = tmp_path / "peers.json"
    book = _book(path)
    forget(book, GONE, links={}, configured=())
    for i in range(MAX_FORGOTTEN + 5):
        book.add(f"http://10.1.{i // 250}.{i % 250}:7080")
        forget(book, f"http://10.1.{i // 250}.{i % 250}:7080", links={}, configured=())
    book.save()
    again = PeerBook(path)
    again.load()
    again.learn_exchanged([{"url": "http://10.1.1.9:7080"}], OWN)  # forgotten last
    assert (MAX_FORGOTTEN, False, False) == (
        len(again.forgotten),
        GONE in again.forgotten,  # one of the oldest: dropped
        "http://10.1.1.9:7080" in again.addresses,
    )


def test_the_answer_names_links_up_and_configured_addresses() -> None:
    """A forgotten node linked now, and a forgotten address that the configuration names,
    are in the answer and in the notes for people."""
    book = _book()
    answer = forget(
        book,
        GONE,
        links={GONE: "http://10.0.0.5:7080", STAYS: None},
        configured=("http://10.0.0.5:7080/", "http://10.0.0.6:7080", "not a url"),
    )
    notes = forget_notes(answer)
    assert ([GONE], ["http://10.0.0.5:7080"], 2, True, True) == (
        answer["linked"],
        answer["configured"],
        len(notes),
        notes[0].startswith(f"{GONE} is linked now"),
        "remove it there, or this node dials it again (from the next start" in notes[1],
    )


def test_forgetting_an_address_names_the_node_linked_through_it() -> None:
    """The node whose link uses the forgotten address is named as linked."""
    book = _book()
    answer = forget(
        book, "http://10.0.0.6:7080", links={STAYS: "http://10.0.0.6:7080"}, configured=()
    )
    assert [STAYS] == answer["linked"]
