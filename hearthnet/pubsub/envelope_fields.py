"""What the fields of a pub/sub message envelope must be (spec §6.2), and the canonical
bytes a signature covers. Pure.

The checks here run where a message comes in (a publish at the edge, an envelope from a
peer or the log: :meth:`~hearthnet.pubsub.envelope.Message.parse`); the signed object
with its bytes is :class:`~hearthnet.pubsub.envelope.Message`.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from hearthnet.canonical import canonicalize, orjson_is_canonical
from hearthnet.errors import BadRequest, PayloadTooLarge
from hearthnet.ids import is_node_id, is_ulid, new_ulid
from hearthnet.pubsub.payload import (
    DATA_ENC,
    Base64UrlText,
    check_text,
    decoded_size,
    encode_bytes,
)
from hearthnet.pubsub.topics import validate_topic

MAX_PAYLOAD_BYTES = 256 * 1024
MAX_TTL_S = 365 * 24 * 3600
_TYPE_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,64}\Z")
SENDER_KINDS = ("node", "device", "token")
_FIELDS = frozenset(
    {
        "id",
        "topic",
        "type",
        "data",
        "data_enc",
        "origin",
        "origin_seq",
        "ts",
        "ttl_s",
        "sender",
        "sig",
    }
)


# Types seen valid: a publisher sends the same few, so most checks are one dict look-up.
_VALID_TYPES: dict[str, None] = {}
_VALID_TYPES_MAX = 4096


def validate_type(msg_type: object) -> str:
    """A message type: 1..64 of ``[A-Za-z0-9_.:-]`` (``token``, ``message.complete``)."""
    if type(msg_type) is str and msg_type in _VALID_TYPES:
        return msg_type
    if not isinstance(msg_type, str) or not _TYPE_RE.match(msg_type):
        raise BadRequest("a message type is 1..64 characters of [A-Za-z0-9_.:-]")
    if len(_VALID_TYPES) >= _VALID_TYPES_MAX:
        _VALID_TYPES.clear()
    _VALID_TYPES[msg_type] = None
    return msg_type


def validate_ttl(ttl_s: object) -> int | None:
    """An optional positive integer TTL in seconds."""
    if ttl_s is None:
        return None
    if not isinstance(ttl_s, int) or isinstance(ttl_s, bool) or not 1 <= ttl_s <= MAX_TTL_S:
        raise BadRequest(f"ttl_s must be an integer from 1 to {MAX_TTL_S}")
    return ttl_s


def encoded_payload(data: Any, max_bytes: int = MAX_PAYLOAD_BYTES) -> int:
    """Check ``data`` against the payload limit; returns the size it counts: its JSON
    bytes, or the raw bytes of a binary payload (not its base64url form).

    Raises:
        BadRequest: ``data`` has no JSON form.
        PayloadTooLarge: over ``max_bytes``.
    """
    if type(data) is bytes:
        size = len(data)
    elif type(data) is Base64UrlText:
        size = decoded_size(data)
    else:
        try:
            size = len(orjson.dumps(data))
        except TypeError as exc:
            raise BadRequest(f"data is not JSON: {exc}") from exc
    if size > max_bytes:
        raise PayloadTooLarge(f"data is {size} bytes; the limit is {max_bytes}")
    return size


def check_payload(data: Any, max_bytes: int = MAX_PAYLOAD_BYTES) -> None:
    """:func:`encoded_payload`'s check without its size: ASCII text too short to pass
    ``max_bytes`` even if every character were escaped (6 bytes, ``\\u00xx``, plus the
    quotes) is not encoded for it.

    Raises:
        BadRequest, PayloadTooLarge: as :func:`encoded_payload`.
    """
    if type(data) is str and len(data) * 6 + 2 <= max_bytes and data.isascii():
        return
    encoded_payload(data, max_bytes)


def canonical_body(body: dict[str, Any]) -> bytes:
    """The JCS bytes of a message body without ``sig`` (a batch leaf, the signed bytes).

    Our own bodies hold only ASCII keys, validated strings and small integers around
    ``data``, so only ``data`` needs the check that orjson's sorted output is JCS.

    Raises:
        NotCanonical: ``data`` (or a field) has no exact canonical form.
    """
    data = body["data"]
    if type(data) is str or orjson_is_canonical(data):
        try:
            return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:
            pass  # the exact path says what is wrong
    return canonicalize(body)


def with_sig(canonical: bytes, sig: str | dict[str, Any]) -> bytes:
    """The envelope's JSON bytes: the canonical body with ``sig`` added as the last key."""
    return canonical[:-1] + b',"sig":' + orjson.dumps(sig) + b"}"


def unsigned_fields(  # noqa: PLR0917 - positional: every publish calls it
    origin_id: str,
    topic: str,
    msg_type: str,
    data: Any,
    origin_seq: int,
    ts: int,
    ttl_s: int | None = None,
    sender: dict[str, str] | None = None,
    msg_id: str | None = None,
) -> dict[str, Any]:
    """A new message's fields, all but ``sig`` (inputs already validated); bytes ``data``
    takes its JSON form (base64url text and ``data_enc``). What :meth:`Message.unsigned`
    gives, called positionally (keywords cost ~1 µs a call on every publish). ``msg_id``
    ``""``: the id is given later (the log gives a commit's ids at once)."""
    body: dict[str, Any] = {
        "id": new_ulid(ts) if msg_id is None else msg_id,
        "topic": topic,
        "type": msg_type,
        "data": data,
        "origin": origin_id,
        "origin_seq": origin_seq,
        "ts": ts,
    }
    if type(data) is bytes:
        body["data"] = encode_bytes(data)
        body["data_enc"] = DATA_ENC
    elif type(data) is Base64UrlText:  # checked canonical where it came in
        body["data"] = str(data)
        body["data_enc"] = DATA_ENC
    if ttl_s is not None:
        body["ttl_s"] = ttl_s
    if sender is not None:
        body["sender"] = sender
    return body


def checked_fields(obj: dict[str, Any]) -> tuple[str, str, int | None, Any, Any]:
    """Validate an envelope's fields but ``sig``: topic, type, ttl_s, sender, data_enc.

    Raises:
        BadRequest: malformed envelope.
        PayloadTooLarge: data over 256 KiB.
    """
    if set(obj) - _FIELDS or not {
        "id",
        "topic",
        "type",
        "data",
        "origin",
        "origin_seq",
        "ts",
        "sig",
    } <= set(obj):
        raise BadRequest(
            "message fields are id, topic, type, data, data_enc?, origin, origin_seq, "
            "ts, ttl_s?, sender?, sig"
        )
    if not is_ulid(obj["id"]) or not is_node_id(obj["origin"]):
        raise BadRequest("message id must be a ULID and origin a NodeID")
    for key in ("origin_seq", "ts"):
        value = obj[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BadRequest(f"message {key} must be a non-negative integer")
    sender = obj.get("sender")
    if sender is not None and (
        not isinstance(sender, dict)
        or set(sender) != {"kind", "id"}
        or sender["kind"] not in SENDER_KINDS
        or not isinstance(sender["id"], str)
    ):
        raise BadRequest("sender is {kind: node|device|token, id}")
    topic = validate_topic(obj["topic"])
    msg_type = validate_type(obj["type"])
    ttl_s = validate_ttl(obj.get("ttl_s"))
    data_enc = obj.get("data_enc")
    if data_enc is None:
        encoded_payload(obj["data"])
    elif data_enc == DATA_ENC:
        encoded_payload(Base64UrlText(check_text(obj["data"])))
    else:
        raise BadRequest(f'data_enc is "{DATA_ENC}" or absent')
    return topic, msg_type, ttl_s, sender, data_enc
