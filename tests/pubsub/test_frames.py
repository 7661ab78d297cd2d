"""Parsing pub/sub client frames (spec §6.5). Pure."""

from __future__ import annotations

from typing import Any

import cbor2
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hearthnet.errors import BadRequest, HearthNetError
from hearthnet.pubsub.frames import (
    AckUpto,
    Auth,
    Ping,
    PresenceUpdate,
    Publish,
    Since,
    Subscribe,
    Unsubscribe,
    fast_ack_upto,
    parse_client_frame,
    reset_reason,
)
from hearthnet.transport.codec import SUBPROTOCOL_CBOR, SUBPROTOCOL_JSON, FrameCodec


def test_frames_parse() -> None:
    """Each frame type becomes its value."""
    sub = parse_client_frame(
        {
            "type": "subscribe",
            "topics": ["chat.*"],
            "since": {"epoch": "e", "seq": 4},
            "consumer": "c1",
            "presence": {"name": "ann"},
        }
    )
    assert isinstance(sub, Subscribe)
    assert (["chat.*"], Since(epoch="e", seq=4), "c1", {"name": "ann"}) == (
        [p.text for p in sub.patterns],
        sub.since,
        sub.consumer,
        sub.presence,
    )
    assert [
        AckUpto(9),
        Ping(),
        Publish("a.b", "token", {"t": 1}, 60, "r1"),
        Auth({"token": "t"}, 64),
    ] == [
        parse_client_frame({"type": "ack", "upto": 9}),
        parse_client_frame({"type": "ping"}),
        parse_client_frame(
            {
                "type": "publish",
                "topic": "a.b",
                "msg_type": "token",
                "data": {"t": 1},
                "ttl_s": 60,
                "ref": "r1",
            }
        ),
        parse_client_frame({"type": "auth", "token": "t", "window": 64}),
    ]


@pytest.mark.parametrize(
    "frame",
    [
        {"type": "dance"},
        {},
        {"type": "ack"},
        {"type": "ack", "upto": -1},
        {"type": "subscribe", "topics": []},
        {"type": "subscribe", "topics": ["a..b"]},
        {"type": "subscribe", "topics": ["a"], "since": {"seq": "1"}},
        {"type": "subscribe", "topics": ["a"], "since": {"when": 1}},
        {"type": "publish", "topic": "a.*", "msg_type": "x", "data": 1},
        {"type": "publish", "topic": "a", "msg_type": "bad type", "data": 1},
        {"type": "publish", "topic": "a", "msg_type": "x"},
        {"type": "publish", "topic": "a", "msg_type": "x", "data": 1, "ttl_s": 0},
        {"type": "auth", "window": 0},
        {"type": "auth", "window": 70000},
    ],
)
def test_bad_frames(frame: dict[str, object]) -> None:
    """Malformed frames are bad_request (the session answers error and goes on)."""
    with pytest.raises(BadRequest):
        parse_client_frame(frame)


def refusal(frame: dict[str, object]) -> str:
    """The message of the bad_request that ``frame`` gets."""
    with pytest.raises(BadRequest) as refused:
        parse_client_frame(frame)
    return refused.value.message


def test_subscribe_with_last_at_the_top_level_is_refused_with_a_hint() -> None:
    """The mistake of the attack review: `last: 3` beside topics instead of inside since."""
    assert (
        "unknown field 'last' in subscribe frame (did you mean since: {\"last\": N}?)"
        == refusal({"type": "subscribe", "topics": ["a"], "last": 3})
    )


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (
            {"type": "subscribe", "topics": ["a"], "colour": "red"},
            "unknown field 'colour' in subscribe frame",
        ),
        (
            {"type": "unsubscribe", "topics": ["a"], "since": {"last": 1}},
            "unknown field 'since' in unsubscribe frame",
        ),
        (
            {"type": "publish", "topic": "a", "msg_type": "x", "data": 1, "ttl": 5},
            "unknown field 'ttl' in publish frame (did you mean ttl_s?)",
        ),
        (
            {"type": "presence.update", "name": "ann", "mood": "ok"},
            "unknown field 'mood' in presence.update frame",
        ),
        (
            {"type": "ack", "upto": 1, "seq": 1},
            "unknown field 'seq' in ack frame (did you mean upto?)",
        ),
        ({"type": "ping", "ts": 1}, "unknown field 'ts' in ping frame"),
        (
            {"type": "auth", "token": "t", "window": 8, "signature": "s"},
            "unknown field 'signature' in auth frame (did you mean sig?)",
        ),
        (
            {"type": "subscribe", "topics": ["a"], "since": {"last": 1, "limit": 2}},
            "unknown field 'limit' in since",
        ),
        (
            {"type": "subscribe", "topics": ["a"], "presence": {"name": "ann", "topic": "a"}},
            "unknown field 'topic' in subscribe presence (presence.update names a topic)",
        ),
    ],
)
def test_every_frame_type_refuses_unknown_fields_by_name(
    frame: dict[str, object], message: str
) -> None:
    """Each client frame type (and the objects nested in one) names an unknown field."""
    assert message == refusal(frame)


def test_several_unknown_fields_are_all_named() -> None:
    """More than one unknown field: each is named, in the frame's order."""
    assert "unknown fields 'b', 'a' in ping frame" == refusal({"type": "ping", "b": 1, "a": 2})


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        ({"type": "ack", "upto": "1"}, "ack.upto must be an integer >= 0"),
        ({"type": "auth", "token": "t", "window": 0}, "auth.window must be an integer >= 1"),
        ({"type": "subscribe", "topics": "a"}, "subscribe.topics is a list of 1..64 patterns"),
        ({"type": "unsubscribe", "topics": []}, "unsubscribe.topics is a list of 1..64 patterns"),
        (
            {"type": "subscribe", "topics": ["a"], "consumer": 5},
            "subscribe.consumer is a name of 1..64 characters",
        ),
        (
            {"type": "subscribe", "topics": ["a"], "presence": "ann"},
            "subscribe.presence is an object {name?, status?, meta?}",
        ),
        (
            {"type": "subscribe", "topics": ["a"], "since": {"seq": "1"}},
            "since.seq must be an integer >= 0",
        ),
        (
            {"type": "subscribe", "topics": ["a"], "since": {"epoch": 1, "seq": 1}},
            "since.epoch must be a string",
        ),
        (
            {"type": "publish", "topic": "a", "msg_type": "x", "data": 1, "ref": 7},
            "publish.ref is a string of at most 128 characters",
        ),
        (
            {"type": "publish", "topic": ["a"], "msg_type": "x", "data": 1},
            "publish.topic must be a string",
        ),
        (
            {"type": "publish", "topic": "a", "msg_type": 7, "data": 1},
            "publish.msg_type must be a string (the message type)",
        ),
    ],
)
def test_wrong_types_name_the_field(frame: dict[str, object], message: str) -> None:
    """A field of the wrong type is bad_request naming the field."""
    assert message == refusal(frame)


@pytest.mark.parametrize("missing", ["topic", "msg_type", "data"])
def test_a_publish_without_a_field_names_it(missing: str) -> None:
    frame: dict[str, object] = {"type": "publish", "topic": "a", "msg_type": "x", "data": 1}
    del frame[missing]
    assert f"publish needs {missing}" == refusal(frame)


@pytest.mark.parametrize(
    "since",
    [{"seq": 1, "ts": 2}, {"last": 1, "ts": 2}, {"epoch": "e"}, {"epoch": "e", "last": 1}, {}],
)
def test_since_takes_exactly_one_form(since: dict[str, object]) -> None:
    """since is one of {epoch?, seq}, {ts}, {last}: a mix is refused, not half applied."""
    message = refusal({"type": "subscribe", "topics": ["a"], "since": since})
    assert message.startswith('since is {"epoch"?, "seq"}, {"ts"} or {"last"}')


def test_auth_carries_a_token_or_a_proof_not_both() -> None:
    """A token beside identity-proof fields is refused (which one would be checked?)."""
    assert "auth carries a token, or identity, ts, nonce and sig: not both" == refusal(
        {"type": "auth", "token": "t", "identity": "n", "ts": 1, "nonce": "x" * 8, "sig": "s"}
    )


def test_every_documented_field_is_accepted() -> None:
    """Frames with all their optional fields parse (the tables are not too strict)."""
    frames: list[dict[str, Any]] = [
        {"type": "subscribe", "topics": ["a.*"], "since": {"ts": 5}, "consumer": "c"},
        {
            "type": "subscribe",
            "topics": ["a"],
            "presence": {"name": "n", "status": "s", "meta": {}},
        },
        {"type": "unsubscribe", "topics": ["a"]},
        {"type": "presence.update", "name": "n", "status": "s", "meta": {"k": 1}, "topic": "a"},
        {"type": "auth", "identity": "n", "ts": 1, "nonce": "abcdefgh", "sig": "s", "window": 2},
    ]
    assert [Subscribe, Subscribe, Unsubscribe, PresenceUpdate, Auth] == [
        type(parse_client_frame(f)) for f in frames
    ]


@pytest.mark.parametrize(
    ("since", "reason"),
    [
        (Since(epoch="e1", seq=3), None),
        (Since(seq=5), None),
        (Since(epoch="e0", seq=3), "epoch_changed"),
        (Since(epoch="e0", seq=99), "epoch_changed"),
        (Since(epoch="e1", seq=6), "cursor_ahead"),
        (Since(seq=6), "cursor_ahead"),
        (Since(ts=10**13), None),
        (Since(last=3), None),
    ],
)
def test_reset_reason(since: Since, reason: str | None) -> None:
    """Another epoch is epoch_changed; beyond the head of this one (or none) is cursor_ahead."""
    assert reason == reset_reason(since, "e1", 5)


def _full_ack(payload: bytes, binary: bool) -> int | None:
    """What the full decoder and parser make of a client message: an ack's upto, or None."""
    codec = FrameCodec(SUBPROTOCOL_CBOR if binary else SUBPROTOCOL_JSON)
    try:
        frame = parse_client_frame(codec.decode(payload, binary=binary, max_bytes=1 << 20))
    except HearthNetError:
        return None
    return frame.upto if isinstance(frame, AckUpto) else None


_UPTO = st.one_of(
    st.integers(min_value=0, max_value=30),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from([2**53 - 1, 2**53, 2**53 + 1, 10**15 - 1, 10**15, 2**64 - 1]),
)


def _ack_texts(upto: int) -> list[bytes]:
    """An ack as clients write it, and near misses of that shape."""
    usual = b'{"type":"ack","upto":%d}' % upto
    return [
        usual,
        usual.replace(b":", b": "),
        b'{"type":"ack","upto":0%d}' % upto,
        b'{"type":"ack","upto":%d.0}' % upto,
        b'{"type":"ack","upto":%de0}' % upto,
        b'{"upto":%d,"type":"ack"}' % upto,
        usual[:-1] + b',"seq":1}',
        usual + b" ",
        usual[:-1],
        cbor2.dumps({"type": "ack", "upto": upto}),
        cbor2.dumps({"upto": upto, "type": "ack"}),
    ]


@given(
    upto=_UPTO,
    cut=st.integers(min_value=0, max_value=40),
    junk=st.binary(max_size=9),
    binary=st.booleans(),
)
@settings(max_examples=80, deadline=None)
def test_the_ack_fast_path_agrees_with_the_full_parser(
    upto: int, cut: int, junk: bytes, binary: bool
) -> None:
    """Wherever the byte-level ack reader gives a number, the full parser gives that ack."""
    candidates = _ack_texts(upto)
    candidates += [c[:cut] + junk + c[cut:] for c in candidates]  # mutated
    candidates += [c[:cut] + junk + c[cut + len(junk) :] for c in candidates]
    candidates.append(b"\xa2dtypecackdupto" + junk)  # any uint encoding, or none
    for payload in candidates:
        fast = fast_ack_upto(payload, binary)
        if fast is not None:
            assert (payload, binary, fast) == (payload, binary, _full_ack(payload, binary))


@given(upto=st.integers(min_value=0, max_value=2**53))
@settings(max_examples=50, deadline=None)
def test_the_ack_fast_path_reads_every_client_ack(upto: int) -> None:
    """Acks as the clients write them (compact JSON, CBOR) all take the fast path."""
    json_ack = b'{"type":"ack","upto":%d}' % upto
    cbor_ack = cbor2.dumps({"type": "ack", "upto": upto})
    expected = (upto if upto < 10**15 else None, upto)  # 16 digits: the full parser decides
    assert expected == (fast_ack_upto(json_ack, False), fast_ack_upto(cbor_ack, True))
    assert (upto, upto) == (_full_ack(json_ack, False), _full_ack(cbor_ack, True))


def test_frames_unmasked_in_place_read_as_their_bytes() -> None:
    """A lean socket's frames arrive as the bytearray they were unmasked in: the ack fast
    path and both codecs read them as they read bytes."""
    publish = {"type": "publish", "topic": "chat.x", "msg_type": "t", "data": {"n": 1}}
    json_codec, cbor_codec = FrameCodec(SUBPROTOCOL_JSON), FrameCodec(SUBPROTOCOL_CBOR)
    cases = [
        (b'{"type":"ack","upto":57}', False, json_codec),
        (orjson.dumps(publish), False, json_codec),
        (cbor2.dumps({"type": "ack", "upto": 57}), True, cbor_codec),
        (cbor2.dumps(publish), True, cbor_codec),
    ]

    def read(payload: bytes | bytearray, binary: bool, codec: FrameCodec) -> Any:
        return fast_ack_upto(payload, binary), codec.decode(payload, binary=binary, max_bytes=999)

    expected = [(57, {"type": "ack", "upto": 57}), (None, publish)] * 2
    assert expected == [read(p, binary, codec) for p, binary, codec in cases]
    assert expected == [read(bytearray(p), binary, codec) for p, binary, codec in cases]
