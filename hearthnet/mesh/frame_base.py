"""What every peer-link frame class shares (spec §7.2): the one table of the fields each
kind may carry (:data:`SHAPES`), the field checks, and :class:`_Frame` (kind, shape check,
encoding). Pure. The classes are in :mod:`~hearthnet.mesh.frames` and
:mod:`~hearthnet.mesh.call_frames`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from hearthnet.errors import BadRequest
from hearthnet.mesh.protocol import HELLO_SHAPE, encode_frame
from hearthnet.shapes import Shape

MAX_SID = 64  # a stream id longer than this is refused

# The fields of each peer-link frame, ``t`` included. One table: a field not listed here is
# refused with bad_request, never ignored.
SHAPES: dict[str, Shape] = {
    "hello": HELLO_SHAPE,
    "msg": Shape.of("msg frame", ("t", "raw", "h")),
    "batch": Shape.of("batch frame", ("t", "origin", "first", "n", "sig", "leaves", "h")),
    "ihave": Shape.of("ihave frame", ("t", "heads", "floors")),
    "iwant": Shape.of("iwant frame", ("t", "want")),
    "presence": Shape.of("presence frame", ("t", "id", "node", "events")),
    "membership": Shape.of("membership frame", ("t", "records")),
    "ping": Shape.of("ping frame", ("t", "seq", "ts")),
    "pong": Shape.of("pong frame", ("t", "seq", "ts_echo", "ts")),
    "bye": Shape.of("bye frame", ("t", "code", "reason", "self_link")),
    "caps": Shape.of("caps frame", ("t", "providers")),
    "peers": Shape.of("peers frame", ("t", "peers")),
    "call": Shape.of(
        "call frame",
        ("t", "sid", "to", "envelope", "signature", "token", "deadline_ms", "inline"),
    ),
    "frame": Shape.of("frame frame", ("t", "sid", "f")),
    "ack": Shape.of("ack frame", ("t", "sid", "upto")),
    "tool_result": Shape.of("tool_result frame", ("t", "sid", "tool_call_id", "body")),
    "cancel": Shape.of("cancel frame", ("t", "sid")),
}


def _int(obj: Mapping[str, Any], name: str, kind: str, *, minimum: int = 0) -> int:
    value = obj.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise BadRequest(f"{kind}.{name} must be an integer >= {minimum}")
    return value


def _opt_int(obj: Mapping[str, Any], name: str, kind: str) -> int | None:
    return None if obj.get(name) is None else _int(obj, name, kind)


def _str(obj: Mapping[str, Any], name: str, kind: str, *, limit: int = 0) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or (limit and len(value) > limit):
        more = f" of at most {limit} characters" if limit else ""
        raise BadRequest(f"{kind}.{name} must be a string{more}")
    return value


def _opt_str(obj: Mapping[str, Any], name: str, kind: str) -> str | None:
    return None if obj.get(name) is None else _str(obj, name, kind)


def _list(obj: Mapping[str, Any], name: str, kind: str) -> tuple[Any, ...]:
    value = obj.get(name)
    if not isinstance(value, list):
        raise BadRequest(f"{kind}.{name} must be a list")
    return tuple(value)


def _int_map(obj: Mapping[str, Any], name: str, kind: str, *, required: bool) -> dict[str, int]:
    value = obj.get(name)
    if value is None and not required:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
        for k, v in value.items()
    ):
        raise BadRequest(f"{kind}.{name} must map strings to integers")
    return value


class _Frame:
    """What every frame class shares: its kind, its shape check and its encoding."""

    __slots__ = ()
    KIND: ClassVar[str]

    @classmethod
    def check(cls, obj: Mapping[str, Any]) -> None:
        """Refuse a map that is not this kind or carries a field the kind does not list."""
        if obj.get("t") != cls.KIND:
            raise BadRequest(f"not a {cls.KIND} frame")
        SHAPES[cls.KIND].check(obj)

    def to_wire(self) -> dict[str, Any]:
        """The frame's fields, without ``t`` (a field left at None is not sent)."""
        raise NotImplementedError

    def encode(self) -> bytes:
        """The frame as CBOR bytes, ready for a link."""
        return encode_frame(self.KIND, **self.to_wire())
