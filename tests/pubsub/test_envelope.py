"""The signed message envelope (spec §6.2). Pure."""

from __future__ import annotations

import orjson
import pytest

from hearthnet.errors import BadRequest, InvalidSignature, PayloadTooLarge
from hearthnet.identity import KeyPair
from hearthnet.pubsub.envelope import Message, validate_type

ORIGIN = KeyPair.from_seed(b"\x40" * 32)


def make(**kw: object) -> Message:
    """A signed message."""
    args: dict[str, object] = {
        "topic": "chat.a",
        "msg_type": "token",
        "data": {"text": "hi"},
        "origin_seq": 1,
        "ts": 1000,
    }
    args.update(kw)
    return Message.create(ORIGIN, **args)


def test_signed_message_parses_back_from_its_bytes() -> None:
    """The raw bytes it travels as parse into an equal, verified message."""
    msg = make(ttl_s=60, sender={"kind": "token", "id": "x/y"})
    assert msg == Message.parse(orjson.loads(msg.raw))


def test_tampering_is_detected() -> None:
    """Changing any field after signing breaks the signature."""
    body = orjson.loads(make().raw)
    body["data"] = {"text": "evil"}
    with pytest.raises(InvalidSignature):
        Message.parse(body)


@pytest.mark.parametrize(
    "change",
    [
        {"id": "x"},
        {"origin_seq": -1},
        {"extra": 1},
        {"sender": {"kind": "robot", "id": "x"}},
        {"topic": "a..b"},
    ],
)
def test_malformed_envelopes(change: dict[str, object]) -> None:
    """Structural problems are bad_request before any signature check."""
    body = {**orjson.loads(make().raw), **change}
    with pytest.raises(BadRequest):
        Message.parse(body)


def test_payload_limit() -> None:
    """data over 256 KiB is payload_too_large."""
    body = orjson.loads(make().raw)
    body["data"] = "x" * (256 * 1024 + 1)
    with pytest.raises(PayloadTooLarge):
        Message.parse(body)


@pytest.mark.parametrize("bad", ["", "t\n", "a b", "x" * 65])
def test_bad_message_types_refused(bad: str) -> None:
    """Types are 1..64 of [A-Za-z0-9_.:-], with no trailing newline."""
    with pytest.raises(BadRequest):
        validate_type(bad)
