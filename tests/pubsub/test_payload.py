"""Binary payloads: bytes ``data`` is signed as base64url text with ``data_enc`` and carried
as a CBOR byte string (hearthnet.pubsub.payload). Pure: codecs, canonical form, frames."""

from __future__ import annotations

import base64
from typing import Any

import cbor2
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hearthnet.errors import BadRequest, InvalidSignature, NotCanonical, PayloadTooLarge
from hearthnet.identity import KeyPair
from hearthnet.pubsub.envelope import (
    MAX_PAYLOAD_BYTES,
    Message,
    StoredMessage,
    canonical_body,
    encoded_payload,
)
from hearthnet.pubsub.envelope_fields import check_payload
from hearthnet.pubsub.frames import Publish, parse_client_frame
from hearthnet.pubsub.payload import (
    DATA_ENC,
    Base64UrlText,
    cbor_envelope,
    decode_bytes,
    decoded_size,
    encode_bytes,
    from_publish,
    json_envelope,
    payload_of,
)
from hearthnet.pubsub.wire import NOSIG, EncodedMessage
from hearthnet.transport.codec import FrameCodec

KEYS = KeyPair.from_seed(b"\x42" * 32)
B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"


def _payload(frame: bytes) -> bytes:
    """The payload of one unmasked WebSocket frame."""
    size = frame[1] & 0x7F
    return frame[{126: 4, 127: 10}.get(size, 2) :]


def _bytes_message(data: bytes, origin_seq: int = 1) -> Message:
    return Message.create(
        KEYS, topic="bin.t", msg_type="blob", data=data, origin_seq=origin_seq, ts=7
    )


@given(st.binary(max_size=300))
def test_bytes_round_trip_through_canonical_base64url(raw: bytes) -> None:
    """encode_bytes is RFC 4648 §5 without padding; decode and size give the bytes back,
    and bytes published over CBOR or as text over JSON make the same envelope body."""
    text = encode_bytes(raw)

    def body(data: Any) -> dict[str, Any]:
        return Message.unsigned(
            KEYS.node_id, topic="a.b", msg_type="m", data=data, origin_seq=1, ts=1, msg_id="I"
        )

    assert (base64.urlsafe_b64encode(raw).rstrip(b"=").decode(), raw, len(raw), body(raw)) == (
        text,
        decode_bytes(text),
        decoded_size(text),
        body(from_publish(text, "base64url")),
    )


@given(st.text(alphabet=B64URL + "=+/ ", max_size=12))
def test_only_canonical_text_decodes(text: str) -> None:
    """Any text either is refused or is exactly what its bytes encode to (one text per bytes)."""
    try:
        raw = decode_bytes(text)
    except BadRequest:
        return
    assert text == encode_bytes(raw)


@pytest.mark.parametrize("text", ["AB", "AAAAB", "AQ==", "a+/b", "A", "é"])
def test_non_canonical_or_foreign_text_is_refused(text: str) -> None:
    """Set unused bits, padding, standard-alphabet characters, bad lengths: bad_request."""
    with pytest.raises(BadRequest):
        decode_bytes(text)


@settings(max_examples=25)
@given(st.lists(st.binary(max_size=80), min_size=1, max_size=4))
def test_json_and_cbor_forms_verify_the_same_signature(payloads: list[bytes]) -> None:
    """A batch of bytes messages: the JSON form and the CBOR form (through cbor2) both
    parse to the same verified message, whose payload is the bytes published."""
    bodies = [
        Message.unsigned(KEYS.node_id, topic="bin.t", msg_type="b", data=p, origin_seq=i + 1, ts=7)
        for i, p in enumerate(payloads)
    ]
    signed = Message.signed_batch(KEYS, bodies, [canonical_body(b) for b in bodies])
    from_json = [Message.parse(orjson.loads(m.raw)) for m in signed]
    from_cbor = [Message.parse(cbor2.loads(cbor2.dumps(cbor_envelope(m.body())))) for m in signed]
    assert (signed, signed, payloads, [DATA_ENC] * len(payloads)) == (
        from_json,
        from_cbor,
        [m.payload for m in from_cbor],
        [m.data_enc for m in from_json],
    )


def test_the_signed_bytes_mark_bytes_and_a_json_string_stays_a_string() -> None:
    """Bytes sign as base64url text plus data_enc; the same text as a JSON string has no
    data_enc, so neither can pass for the other."""
    as_bytes = _bytes_message(b"\x00\xffhi")
    as_text = Message.create(
        KEYS, topic="bin.t", msg_type="blob", data="AP9oaQ", origin_seq=1, ts=7
    )
    stripped = {k: v for k, v in as_bytes.body().items() if k != "data_enc"}
    added = {**as_text.body(), "data_enc": DATA_ENC}
    with pytest.raises(InvalidSignature):
        Message.parse(stripped)
    with pytest.raises(InvalidSignature):
        Message.parse(added)
    unsigned = orjson.loads(as_bytes.raw)
    del unsigned["sig"]
    assert (
        {"data": "AP9oaQ", "data_enc": "base64url"},
        "AP9oaQ",
        b"\x00\xffhi",
        "AP9oaQ",
    ) == (
        {k: unsigned[k] for k in ("data", "data_enc")},
        as_text.payload,
        as_bytes.payload,
        as_text.data,
    )


def test_a_cbor_form_with_changed_bytes_does_not_verify() -> None:
    """Flipping one byte of the CBOR byte string breaks the signature."""
    body = cbor_envelope(_bytes_message(b"abc").body())
    body["data"] = b"abd"
    with pytest.raises(InvalidSignature):
        Message.parse(body)


def test_envelope_data_enc_must_be_base64url_with_canonical_text() -> None:
    """Another encoding name, non-canonical text, or bytes beside data_enc: bad_request."""
    body = _bytes_message(b"ab").body()
    refusals = []
    for change in (
        {"data_enc": "base64"},
        {"data": "YWJ"},  # "YWI" with an unused bit set
        {"data": b"ab"},
    ):
        with pytest.raises(BadRequest) as exc:
            Message.parse({**body, **change})
        refusals.append(type(exc.value).__name__)
    assert ["BadRequest"] * 3 == refusals


def test_the_size_limit_counts_raw_bytes() -> None:
    """256 KiB of bytes is accepted (its base64url is a third larger); one more is refused,
    at publish and when a peer's envelope is parsed."""
    full = bytes(MAX_PAYLOAD_BYTES)
    ok = _bytes_message(full)
    over = {**ok.body(), "data": encode_bytes(full + b"\x00")}
    with pytest.raises(PayloadTooLarge):
        encoded_payload(full + b"\x00")
    with pytest.raises(PayloadTooLarge):
        Message.parse(over)
    assert (MAX_PAYLOAD_BYTES, True) == (
        encoded_payload(full),
        len(ok.data) > MAX_PAYLOAD_BYTES,
    )


def test_the_check_without_the_size_refuses_what_the_size_refuses() -> None:
    """check_payload refuses exactly the payloads encoded_payload does: text that only
    escapes push over the limit, text just over it, non-ASCII text, and other values."""
    texts = ["x" * 16, "\x00" * 16, "x" * 98, "x" * 99, '"' * 40, '"' * 60, "é" * 40, "é" * 50]
    values: list[Any] = [*texts, {"t": "x" * 96}, {"t": "x" * 80}, 12, b"\x00" * 101]

    def refused(check: Any, value: Any) -> bool:
        try:
            check(value, 100)
        except PayloadTooLarge:
            return True
        return False

    assert [refused(encoded_payload, v) for v in values] == [
        refused(check_payload, v) for v in values
    ]


def test_message_forms_carry_bytes_only_over_cbor() -> None:
    """ws_cbor frames (with and without sig) hold a byte string and no data_enc; JSON, WS
    text and SSE hold the signed base64url text with data_enc."""
    message = _bytes_message(b"\x01\x02\x03\xfe")
    item = EncodedMessage(StoredMessage(9, message))
    cbor = [cbor2.loads(_payload(item.form(f)))["data"] for f in ("ws_cbor", "ws_cbor" + NOSIG)]
    json = [orjson.loads(item.form(f))["data"] for f in ("json", "json" + NOSIG)]
    text = orjson.loads(_payload(item.form("ws_text")))["data"]
    sse = orjson.loads(item.form("sse").split(b"\n")[1].removeprefix(b"data: "))
    assert (
        [(b"\x01\x02\x03\xfe", None)] * 2,
        [("AQID_g", "base64url")] * 4,
        [True, False],
    ) == (
        [(c["data"], c.get("data_enc")) for c in cbor],
        [(j["data"], j["data_enc"]) for j in (*json, text, sse)],
        ["sig" in cbor[0], "sig" in cbor[1]],
    )


def test_a_cbor_publish_may_carry_bytes_only_as_its_whole_data() -> None:
    """A publish frame's byte-string data decodes; bytes nested in data or in another
    frame are refused as before."""
    codec = FrameCodec("hearthnet-bus.v2+cbor")

    def decode(obj: dict[str, Any]) -> dict[str, Any]:
        return codec.decode(cbor2.dumps(obj), binary=True, max_bytes=1 << 20)

    frame = decode({"type": "publish", "topic": "a.b", "msg_type": "m", "data": b"\x00"})
    refused = []
    for obj in (
        {"type": "publish", "topic": "a.b", "msg_type": "m", "data": {"x": b"\x00"}},
        {"type": "presence.update", "data": b"\x00"},
        {"type": "publish", "topic": "a.b", "msg_type": "m", "data": 1, "ref": b"r"},
    ):
        with pytest.raises(NotCanonical):
            decode(obj)
        refused.append(True)
    assert (Publish("a.b", "m", b"\x00", None, None), [True] * 3) == (
        parse_client_frame(frame),
        refused,
    )


def test_a_json_publish_sends_bytes_as_base64url_with_data_enc() -> None:
    """data_enc "base64url" marks checked text as bytes (counted as 3 bytes); other names,
    bytes beside it and non-canonical text are refused."""
    base = {"type": "publish", "topic": "a.b", "msg_type": "m"}
    parsed = parse_client_frame({**base, "data": "AQID", "data_enc": "base64url"})
    for bad in (
        {"data": "AQID", "data_enc": "base64"},
        {"data": b"\x01", "data_enc": "base64url"},
        {"data": "AQ==", "data_enc": "base64url"},
    ):
        with pytest.raises(BadRequest):
            parse_client_frame({**base, **bad})
    data = parsed.data  # type: ignore[union-attr]
    assert ("AQID", Base64UrlText, 3) == (data, type(data), encoded_payload(data))


def test_payload_of_either_form_is_the_bytes() -> None:
    """A client reads the same bytes from the JSON and the CBOR envelope, and JSON data
    as it is."""
    message = _bytes_message(b"xyz")
    assert (b"xyz", b"xyz", {"a": 1}, message.body()) == (
        payload_of(message.body()),
        payload_of(cbor_envelope(message.body())),
        payload_of({"data": {"a": 1}}),
        json_envelope(cbor_envelope(message.body())),
    )
