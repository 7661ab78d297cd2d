"""Typed peer-link frames: parsing is strict, serialising round-trips. Pure."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hearthnet.errors import BadRequest
from hearthnet.mesh.call_frames import Ack, Call
from hearthnet.mesh.frames import (
    FRAME_CLASSES,
    IHave,
    IWant,
    Msg,
    Ping,
    Pong,
    Presence,
    parse_frame,
)
from hearthnet.mesh.protocol import CARRIED_FRAME_KINDS, FRAME_KINDS, decode_frame
from hearthnet.mesh.relay_frames import RELAY_FRAME_KINDS

SAMPLES = [
    Msg(b'{"id":"x"}', 3),
    IHave({"ed25519:a": 5}, {"ed25519:a": 1}),
    IWant({"ed25519:a": (1, 5)}),
    Presence("01J", "ed25519:a", ({"topic": "t", "kind": "join", "member": {}},)),
    Ping(7, 1_700_000_000_000),
    Pong(7, 1_700_000_000_000, 1_700_000_000_005),
    Call("sid1", "ed25519:b", {"capability": "x"}, "sig", None, 500, True),
    Ack("sid1", 8),
]


@pytest.mark.parametrize("frame", SAMPLES, ids=lambda f: f.KIND)
def test_a_frame_parses_back_from_its_encoding(frame: object) -> None:
    """encode() then decode_frame() and parse_frame() give the same frame back."""
    assert frame == parse_frame(decode_frame(frame.encode()))  # type: ignore[attr-defined]


def test_an_unknown_field_is_refused_by_name() -> None:
    """A field the kind does not list is bad_request naming that field."""
    with pytest.raises(BadRequest) as refused:
        parse_frame({"t": "ping", "seq": 1, "ts": 2, "tss": 3})
    assert "unknown field 'tss' in ping frame" == refused.value.message


def test_a_field_of_the_wrong_type_is_refused() -> None:
    """An iwant span that is not two integers is bad_request."""
    with pytest.raises(BadRequest) as refused:
        parse_frame({"t": "iwant", "want": {"ed25519:a": [1, "5"]}})
    assert "iwant.want must map origins to [from, to]" == refused.value.message


def test_every_kind_but_hello_and_the_relay_frames_has_a_class() -> None:
    """The typed frames cover the link's kinds; hello is the handshake's, the relay and
    path frames are relay_frames.py's, the carried requests federation/carrier.py's."""
    kinds = FRAME_KINDS - {"hello"} - RELAY_FRAME_KINDS - CARRIED_FRAME_KINDS
    assert kinds == set(FRAME_CLASSES)


def test_hello_and_relay_frames_are_left_to_others() -> None:
    """parse_frame leaves the kinds an established link does not handle to others."""
    assert (None, None) == (parse_frame({"t": "hello"}), parse_frame({"t": "route"}))


origins = st.text(min_size=1, max_size=12)
seqs = st.integers(min_value=0, max_value=2**53)


@given(st.dictionaries(origins, seqs, max_size=8), st.dictionaries(origins, seqs, max_size=8))
def test_ihave_round_trips(heads: dict[str, int], floors: dict[str, int]) -> None:
    """Any heads and floors survive encode, decode and parse."""
    frame = IHave(heads, floors)
    assert frame == parse_frame(decode_frame(frame.encode()))


@given(st.dictionaries(origins, st.tuples(seqs, seqs), max_size=8))
def test_iwant_round_trips(want: dict[str, tuple[int, int]]) -> None:
    """Any ranges survive encode, decode and parse."""
    frame = IWant(want)
    assert frame == parse_frame(decode_frame(frame.encode()))
