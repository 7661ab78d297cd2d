"""Client frames of a pub/sub WebSocket session (spec §2.2, §6.4–6.6, §3.6). Pure parsing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hearthnet.errors import BadRequest
from hearthnet.pubsub.envelope import validate_ttl, validate_type
from hearthnet.pubsub.presence import validate_presence_fields
from hearthnet.pubsub.topics import TopicPattern, validate_topic

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
    """``{"type":"subscribe","topics":[...],"since"?,"consumer"?,"presence"?}``."""

    patterns: tuple[TopicPattern, ...]
    since: Since | None
    consumer: str | None
    presence: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """``{"type":"unsubscribe","topics":[...]}``."""

    patterns: tuple[TopicPattern, ...]


@dataclass(frozen=True, slots=True)
class Publish:
    """``{"type":"publish","topic","msg_type","data","ttl_s"?,"ref"?}``."""

    topic: str
    msg_type: str
    data: Any
    ttl_s: int | None
    ref: str | None


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


def _patterns(obj: object) -> tuple[TopicPattern, ...]:
    if not isinstance(obj, list) or not 1 <= len(obj) <= MAX_PATTERNS_PER_FRAME:
        raise BadRequest(f"topics is a list of 1..{MAX_PATTERNS_PER_FRAME} patterns")
    return tuple(TopicPattern.parse(p) for p in obj)


def parse_since(obj: object) -> Since | None:
    """``{"epoch","seq"}``, ``{"ts"}`` or ``{"last"}``."""
    if obj is None:
        return None
    if not isinstance(obj, dict):
        raise BadRequest('since is {"epoch","seq"}, {"ts"} or {"last"}')
    if "seq" in obj:
        epoch = obj.get("epoch")
        if epoch is not None and not isinstance(epoch, str):
            raise BadRequest("since.epoch must be a string")
        return Since(epoch=epoch, seq=_int(obj["seq"], "since.seq"))
    if "ts" in obj:
        return Since(ts=_int(obj["ts"], "since.ts"))
    if "last" in obj:
        return Since(last=min(_int(obj["last"], "since.last"), 10_000))
    raise BadRequest('since is {"epoch","seq"}, {"ts"} or {"last"}')


def parse_client_frame(obj: dict[str, Any]) -> ClientFrame:
    """Parse one decoded client frame.

    Raises:
        BadRequest: unknown type or malformed fields (the session answers ``error``).
    """
    kind = obj.get("type")
    if kind == "ack":
        return AckUpto(_int(obj.get("upto"), "ack.upto"))
    if kind == "publish":
        ref = obj.get("ref")
        if ref is not None and (not isinstance(ref, str) or len(ref) > MAX_REF):
            raise BadRequest(f"ref is a string of at most {MAX_REF} characters")
        if "data" not in obj:
            raise BadRequest("publish needs data")
        return Publish(
            validate_topic(obj.get("topic")),
            validate_type(obj.get("msg_type")),
            obj["data"],
            validate_ttl(obj.get("ttl_s")),
            ref,
        )
    if kind == "subscribe":
        consumer = obj.get("consumer")
        if consumer is not None and (not isinstance(consumer, str) or not 1 <= len(consumer) <= 64):
            raise BadRequest("consumer is a name of 1..64 characters")
        presence = obj.get("presence")
        return Subscribe(
            _patterns(obj.get("topics")),
            parse_since(obj.get("since")),
            consumer,
            validate_presence_fields(presence) if presence is not None else None,
        )
    if kind == "unsubscribe":
        return Unsubscribe(_patterns(obj.get("topics")))
    if kind == "presence.update":
        topic = obj.get("topic")
        return PresenceUpdate(
            validate_presence_fields({k: v for k, v in obj.items() if k != "type"}),
            validate_topic(topic) if topic is not None else None,
        )
    if kind == "ping":
        return Ping()
    if kind == "auth":
        window = obj.get("window")
        if window is not None:
            window = _int(window, "window", 1)
            if window > MAX_WINDOW:
                raise BadRequest(f"window is 1..{MAX_WINDOW}")
        return Auth({k: v for k, v in obj.items() if k not in ("type", "window")}, window)
    raise BadRequest(f"unknown frame type {str(kind)[:32]!r}")
