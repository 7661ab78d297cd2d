"""Client frames of a pub/sub WebSocket session (spec §2.2, §6.4–6.6, §3.6). Pure parsing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from hearthnet.canonical import MAX_EXACT_INTEGER
from hearthnet.errors import BadRequest
from hearthnet.pubsub.envelope import validate_ttl, validate_type
from hearthnet.pubsub.idempotency import validate_key
from hearthnet.pubsub.payload import from_publish
from hearthnet.pubsub.presence import validate_presence_fields
from hearthnet.pubsub.topics import TopicPattern, validate_topic
from hearthnet.pubsub.wire import ENVELOPE_FIELDS
from hearthnet.shapes import Shape

MAX_PATTERNS_PER_FRAME = 64
MAX_WINDOW = 65536
MAX_REF = 128


@dataclass(frozen=True, slots=True)
class Auth:
    """``{"type":"auth","token"}`` or ``{"type":"auth","identity","ts","nonce","sig"}``."""

    fields: dict[str, Any]
    window: int | None


@dataclass(frozen=True, slots=True)
class Since:
    """A resume point: a cursor ``(epoch, seq)``, a time, or the last N messages."""

    epoch: str | None = None
    seq: int | None = None
    ts: int | None = None
    last: int | None = None


@dataclass(frozen=True, slots=True)
class Subscribe:
    """``{"type":"subscribe","topics":[...],"since"?,"consumer"?,"presence"?,"verify"?,
    "fields"?}``."""

    patterns: tuple[TopicPattern, ...]
    since: Since | None
    consumer: str | None
    presence: dict[str, Any] | None
    verify: bool = False  # spec §6.2: message frames carry sig only when asked
    fields: tuple[str, ...] | None = None  # lean frames: only these envelope fields


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """``{"type":"unsubscribe","topics":[...]}``."""

    patterns: tuple[TopicPattern, ...]


class Publish(NamedTuple):
    """``{"type":"publish","topic","msg_type","data","data_enc"?,"ttl_s"?,"ref"?,
    "idempotency_key"?}`` (the key: :mod:`hearthnet.pubsub.idempotency`);
    ``data`` is bytes for a binary payload (a CBOR byte string, or base64url text with
    ``data_enc``). Immutable like the other frames, but a named tuple: one is made per
    publish, and a frozen dataclass costs ~1 µs to build (its ``__init__`` sets each field
    through ``object.__setattr__``)."""

    topic: str
    msg_type: str
    data: Any
    ttl_s: int | None
    ref: str | None
    key: str | None = None


@dataclass(frozen=True, slots=True)
class PresenceUpdate:
    """``{"type":"presence.update","name"?,"status"?,"meta"?,"topic"?}``."""

    fields: dict[str, Any]
    topic: str | None


@dataclass(frozen=True, slots=True)
class AckUpto:
    """``{"type":"ack","upto":N}``."""

    upto: int


@dataclass(frozen=True, slots=True)
class Ping:
    """``{"type":"ping"}`` (answered ``pong``)."""


ClientFrame = Auth | Subscribe | Unsubscribe | Publish | PresenceUpdate | AckUpto | Ping


def _int(value: object, name: str, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise BadRequest(f"{name} must be an integer >= {minimum}")
    return value


def _patterns(obj: object, frame: str) -> tuple[TopicPattern, ...]:
    if not isinstance(obj, list) or not 1 <= len(obj) <= MAX_PATTERNS_PER_FRAME:
        raise BadRequest(f"{frame}.topics is a list of 1..{MAX_PATTERNS_PER_FRAME} patterns")
    return tuple(TopicPattern.parse(p) for p in obj)


_SINCE_FORMS = 'since is {"epoch"?, "seq"}, {"ts"} or {"last"}'
_SINCE_HINT = 'did you mean since: {"%s": N}?'

# The fields of each client frame (spec §6.4-6.6, §2.2, §3.6). One table: a field that is
# not listed here is refused with bad_request, never ignored.
SHAPES: dict[str, Shape] = {
    "ack": Shape.of("ack frame", ("type", "upto"), {"seq": "did you mean upto?"}),
    "publish": Shape.of(
        "publish frame",
        ("type", "topic", "msg_type", "data", "data_enc", "ttl_s", "ref", "idempotency_key"),
        {
            "ttl": "did you mean ttl_s?",
            "payload": "did you mean data?",
            "key": "did you mean idempotency_key?",
        },
    ),
    "subscribe": Shape.of(
        "subscribe frame",
        ("type", "topics", "since", "consumer", "presence", "verify", "fields"),
        {
            "last": _SINCE_HINT % "last",
            "seq": 'did you mean since: {"epoch": E, "seq": N}?',
            "epoch": 'did you mean since: {"epoch": E, "seq": N}?',
            "ts": _SINCE_HINT % "ts",
            "since_seq": 'did you mean since: {"seq": N}?',
            "since_ts": _SINCE_HINT % "ts",
            "topic": "did you mean topics: [...]?",
            "window": "the window is set by the auth frame",
            "sig": "did you mean verify: true?",
        },
    ),
    "unsubscribe": Shape.of(
        "unsubscribe frame", ("type", "topics"), {"topic": "did you mean topics: [...]?"}
    ),
    "presence.update": Shape.of(
        "presence.update frame",
        ("type", "name", "status", "meta", "topic"),
        {"presence": "name, status and meta go at the top level of presence.update"},
    ),
    "ping": Shape.of("ping frame", ("type",)),
    "auth": Shape.of(
        "auth frame",
        ("type", "token", "identity", "ts", "nonce", "sig", "window"),
        {"signature": "did you mean sig?"},
    ),
}
SINCE_SHAPE = Shape.of("since", ("epoch", "seq", "ts", "last"), {"since_seq": "did you mean seq?"})
# The fields a subscribe's presence object may carry (presence.update adds topic).
SUBSCRIBE_PRESENCE_SHAPE = Shape.of(
    "subscribe presence", ("name", "status", "meta"), {"topic": "presence.update names a topic"}
)
_PROOF_FIELDS = ("identity", "ts", "nonce", "sig")


def parse_since(obj: object) -> Since | None:
    """``{"epoch"?, "seq"}``, ``{"ts"}`` or ``{"last"}``: exactly one form, nothing else.

    Raises:
        BadRequest: an unknown field, a mix of forms, or a wrong type (each named).
    """
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise BadRequest(_SINCE_FORMS)
    SINCE_SHAPE.check(obj)
    forms = ("seq" in obj) + ("ts" in obj) + ("last" in obj)
    if forms != 1 or ("epoch" in obj and "seq" not in obj):
        raise BadRequest(f"{_SINCE_FORMS}, got {sorted(obj)}")
    if "seq" in obj:
        epoch = obj.get("epoch")
        if epoch is not None and not isinstance(epoch, str):
            raise BadRequest("since.epoch must be a string")
        return Since(epoch=epoch, seq=_int(obj["seq"], "since.seq"))
    if "ts" in obj:
        return Since(ts=_int(obj["ts"], "since.ts"))
    return Since(last=min(_int(obj["last"], "since.last"), 10_000))


def reset_reason(since: Since, epoch: str, head_seq: int) -> str | None:
    """Why a cursor ``since`` cannot be used on a log at ``(epoch, head_seq)``; None if it can.

    ``epoch_changed``: the cursor names another epoch (its seqs mean other messages).
    ``cursor_ahead``: same epoch, or none given (``Last-Event-ID``, ``since_seq`` alone),
    but the seq is beyond the head: the node has fewer messages than the client counted.
    """
    if since.seq is None:
        return None
    if since.epoch is not None and since.epoch != epoch:
        return "epoch_changed"
    if since.seq > head_seq:
        return "cursor_ahead"
    return None


def _ack(obj: dict[str, Any]) -> ClientFrame:
    return AckUpto(_int(obj.get("upto"), "ack.upto"))


_new_publish = tuple.__new__  # Publish's fields in order, without its Python __new__


def _publish(obj: dict[str, Any]) -> ClientFrame:
    ref = obj.get("ref")
    if ref is not None and (not isinstance(ref, str) or len(ref) > MAX_REF):
        raise BadRequest(f"publish.ref is a string of at most {MAX_REF} characters")
    for field in ("topic", "msg_type", "data"):
        if field not in obj:
            raise BadRequest(f"publish needs {field}")
    topic, msg_type = obj.get("topic"), obj.get("msg_type")
    if not isinstance(topic, str):
        raise BadRequest("publish.topic must be a string")
    if not isinstance(msg_type, str):
        raise BadRequest("publish.msg_type must be a string (the message type)")
    data_enc, ttl_s, key = obj.get("data_enc"), obj.get("ttl_s"), obj.get("idempotency_key")
    return _new_publish(
        Publish,
        (
            validate_topic(topic),
            validate_type(msg_type),
            obj["data"] if data_enc is None else from_publish(obj["data"], data_enc),
            None if ttl_s is None else validate_ttl(ttl_s),
            ref,
            None if key is None else validate_key(key),
        ),
    )


def _subscribe(obj: dict[str, Any]) -> ClientFrame:
    consumer = obj.get("consumer")
    if consumer is not None and (not isinstance(consumer, str) or not 1 <= len(consumer) <= 64):
        raise BadRequest("subscribe.consumer is a name of 1..64 characters")
    presence = obj.get("presence")
    if presence is not None:
        if not isinstance(presence, dict):
            raise BadRequest("subscribe.presence is an object {name?, status?, meta?}")
        SUBSCRIBE_PRESENCE_SHAPE.check(presence)
        presence = validate_presence_fields(presence)
    verify = obj.get("verify", False)
    if not isinstance(verify, bool):
        raise BadRequest("subscribe.verify is true or false")
    fields = parse_fields(obj.get("fields"))
    if fields is not None and verify:
        raise BadRequest("subscribe.fields and verify: true exclude each other (sig signs all)")
    return Subscribe(
        _patterns(obj.get("topics"), "subscribe"),
        parse_since(obj.get("since")),
        consumer,
        presence,
        verify,
        fields,
    )


def parse_fields(obj: object) -> tuple[str, ...] | None:
    """``fields`` of a subscribe: a list of distinct envelope field names (lean message
    frames), returned in the envelope's order; None when absent.

    Raises:
        BadRequest: not a list of known, distinct names (an unknown one is named).
    """
    if obj is None:
        return None
    if not isinstance(obj, list) or not obj or not all(isinstance(f, str) for f in obj):
        raise BadRequest(
            f"subscribe.fields is a list of envelope fields: {', '.join(ENVELOPE_FIELDS)}"
        )
    for name in obj:
        if name not in ENVELOPE_FIELDS:
            hint = " (sig comes with verify: true)" if name == "sig" else ""
            raise BadRequest(f"unknown envelope field {name!r} in subscribe.fields{hint}")
    if len(set(obj)) != len(obj):
        raise BadRequest("subscribe.fields names a field twice")
    return tuple(f for f in ENVELOPE_FIELDS if f in obj)


def _unsubscribe(obj: dict[str, Any]) -> ClientFrame:
    return Unsubscribe(_patterns(obj.get("topics"), "unsubscribe"))


def _presence_update(obj: dict[str, Any]) -> ClientFrame:
    topic = obj.get("topic")
    return PresenceUpdate(
        validate_presence_fields({k: v for k, v in obj.items() if k not in ("type", "topic")}),
        validate_topic(topic) if topic is not None else None,
    )


def _ping(obj: dict[str, Any]) -> ClientFrame:
    return Ping()


def _auth(obj: dict[str, Any]) -> ClientFrame:
    window = obj.get("window")
    if window is not None:
        window = _int(window, "auth.window", 1)
        if window > MAX_WINDOW:
            raise BadRequest(f"auth.window is 1..{MAX_WINDOW}")
    if "token" in obj and any(k in obj for k in _PROOF_FIELDS):
        raise BadRequest("auth carries a token, or identity, ts, nonce and sig: not both")
    return Auth({k: v for k, v in obj.items() if k not in ("type", "window")}, window)


_PARSERS: dict[str, Callable[[dict[str, Any]], ClientFrame]] = {
    "ack": _ack,
    "publish": _publish,
    "subscribe": _subscribe,
    "unsubscribe": _unsubscribe,
    "presence.update": _presence_update,
    "ping": _ping,
    "auth": _auth,
}
_FRAMES = {kind: (SHAPES[kind], parse) for kind, parse in _PARSERS.items()}


def parse_client_frame(obj: dict[str, Any]) -> ClientFrame:
    """Parse one decoded client frame: its type, then its fields against :data:`SHAPES`.

    Raises:
        BadRequest: unknown type, an unknown field (named, with a hint for known
            mistakes), or a malformed field (the session answers ``error``).
    """
    kind = obj.get("type")
    entry = _FRAMES.get(kind) if isinstance(kind, str) else None
    if entry is None:
        types = ", ".join(sorted(_FRAMES))
        if kind is None:
            raise BadRequest(f"a client frame needs a type: one of {types}")
        raise BadRequest(f"unknown frame type {str(kind)[:32]!r}: one of {types}")
    shape, parser = entry
    if not obj.keys() <= shape.fields:
        shape.refuse(obj.keys())
    return parser(obj)


# --- the ack fast path ----------------------------------------------------------------------
# Subscribers ack every half window, so at 1,000 subscribers acks outnumber publishes; the
# shape every client sends (hearthnet.js, the Python client, the benchmark's generator) is
# recognised from its bytes. Anything else, or anything in doubt, goes to the full parser.
_ACK_JSON = b'{"type":"ack","upto":'
_ACK_JSON_MAX = len(_ACK_JSON) + 16  # "}" and at most 15 digits: always below 2^53
_ACK_CBOR = b"\xa2dtypecackdupto"  # map(2) {"type": "ack", "upto": <uint follows>}
_ACK_CBOR_LEN = len(_ACK_CBOR)
_CBOR_UINT_BYTES = {0x18: 1, 0x19: 2, 0x1A: 4, 0x1B: 8}


def fast_ack_upto(payload: bytes | bytearray | str, binary: bool) -> int | None:
    """The ``upto`` of ``{"type":"ack","upto":N}`` written the usual way (compact JSON, or
    CBOR with these two keys in this order), read from the bytes without decoding; None
    for any other message. Where it gives a number, :func:`parse_client_frame` of the
    decoded message gives :class:`AckUpto` with the same one."""
    if isinstance(payload, str):
        return None
    if not binary:
        if len(payload) > _ACK_JSON_MAX or not payload.startswith(_ACK_JSON):
            return None
        digits = payload[len(_ACK_JSON) : -1]
        if (
            payload[-1] != 0x7D  # "}"
            or not digits.isdigit()  # ASCII digits only, at least one
            or (digits[0] == 0x30 and len(digits) > 1)  # JSON has no leading zeros
        ):
            return None
        return int(digits)
    if not payload.startswith(_ACK_CBOR) or len(payload) <= _ACK_CBOR_LEN:
        return None
    head = payload[_ACK_CBOR_LEN]
    if head < 0x18:  # an unsigned integer below 24, in the head byte
        return head if len(payload) == _ACK_CBOR_LEN + 1 else None
    size = _CBOR_UINT_BYTES.get(head)
    if size is None or len(payload) != _ACK_CBOR_LEN + 1 + size:
        return None
    value = int.from_bytes(payload[_ACK_CBOR_LEN + 1 :], "big")
    return value if value <= MAX_EXACT_INTEGER else None
