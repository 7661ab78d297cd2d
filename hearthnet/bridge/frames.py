"""What ``hearthnet bridge`` reads and writes (docs/bridge.md), and its bookkeeping. Pure.

A script writes one JSON object per line. Pub/sub frames are the WebSocket client frames of
spec §6.4–6.5 unchanged (``subscribe``, ``unsubscribe``, ``publish``, ``presence.update``,
``ack``, ``ping``); bus frames are ``call``, ``tool_result`` and ``cancel``, each naming its
call by the ``id`` the script chose. The bridge writes the node's frames back unchanged
(``{"event", "data", "seq"?}``), a call's frames with ``"call": id`` added, and every refusal
as an ``error`` frame with a code of spec §2.4.

:func:`parse_command` turns a line into a command or a refusal; :class:`PublishLedger`
tracks publishes the node has not answered (so that the bridge stops reading when too many
are in flight and knows when it may exit); :class:`AckPacer` decides when to ack the
deliveries written out (spec §3.6: at least every half window).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from hearthnet.bus.envelope import validate_capability_name, validate_version
from hearthnet.errors import BadRequest, PayloadTooLarge, WireError
from hearthnet.ids import is_node_id
from hearthnet.pubsub.frames import parse_client_frame
from hearthnet.shapes import Shape

# spec §2.5: a WebSocket message is at most 1 MiB; a line carries one, plus a little.
MAX_LINE_BYTES = 1024 * 1024 + 4096
MAX_CALL_ID = 128
PUBSUB_TYPES = frozenset({"subscribe", "unsubscribe", "publish", "presence.update", "ack", "ping"})
# Refs the bridge gives publishes that came without one; they never reach the script.
OWN_REF_PREFIX = "\x00bridge:"

CALL_SHAPE = Shape.of(
    "call frame",
    ("type", "id", "capability", "input", "params", "target", "deadline_ms", "stream"),
    {"body": "input", "envelope": "capability (the bridge signs the envelope itself)"},
)
TOOL_RESULT_SHAPE = Shape.of("tool_result frame", ("type", "call", "tool_call_id", "body"))
CANCEL_SHAPE = Shape.of("cancel frame", ("type", "call"))


@dataclass(frozen=True, slots=True)
class PubSubCommand:
    """A pub/sub client frame, checked, to send as it is on the session."""

    frame: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CallCommand:
    """``{"type":"call","id","capability","input"?,"params"?,"target"?,"deadline_ms"?,
    "stream"?}``; ``stream`` None: the capability's descriptor decides."""

    id: str
    capability: str
    input: Any
    params: dict[str, Any] | None
    target: str | None
    deadline_ms: int | None
    stream: bool | None


@dataclass(frozen=True, slots=True)
class ToolResultCommand:
    """``{"type":"tool_result","call","tool_call_id","body"}``: answer a ``tool_call``."""

    call: str
    tool_call_id: str
    body: Any


@dataclass(frozen=True, slots=True)
class CancelCommand:
    """``{"type":"cancel","call"}``: cancel a running call."""

    call: str


@dataclass(frozen=True, slots=True)
class Refusal:
    """A line the bridge refuses; ``frame`` is the ``error`` frame to write."""

    frame: dict[str, Any]


Command = PubSubCommand | CallCommand | ToolResultCommand | CancelCommand


def error_frame(
    error: WireError, *, call: str | None = None, ref: str | None = None, line: int | None = None
) -> dict[str, Any]:
    """``{"event":"error","data":{code, message, ref?, line?},"call"?}``."""
    data = error.to_frame_data()
    if ref is not None:
        data["ref"] = ref
    if line is not None:
        data["line"] = line
    frame: dict[str, Any] = {"event": "error", "data": data}
    if call is not None:
        frame["call"] = call
    return frame


def too_long(line: int) -> Refusal:
    """The refusal of a line over :data:`MAX_LINE_BYTES` (the bridge skips it)."""
    return Refusal(
        error_frame(PayloadTooLarge(f"a line is at most {MAX_LINE_BYTES} bytes"), line=line)
    )


def parse_command(raw: bytes, line: int) -> Command | Refusal:
    """One line of input: the command, or the refusal to write (with the line number, and
    the ``ref`` or call ``id`` when the line had one)."""
    if len(raw) > MAX_LINE_BYTES:
        return too_long(line)
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return Refusal(error_frame(BadRequest(f"not JSON: {exc}"[:200]), line=line))
    if not isinstance(obj, dict):
        return Refusal(error_frame(BadRequest("a line is one JSON object"), line=line))
    kind = obj.get("type")
    try:
        if kind in PUBSUB_TYPES:
            parse_client_frame(obj)  # the node would refuse it the same way, later
            _check_ref(obj)
            return PubSubCommand(obj)
        if kind == "call":
            return _call(obj)
        if kind == "tool_result":
            TOOL_RESULT_SHAPE.check(obj)
            return ToolResultCommand(
                _call_id(obj.get("call"), "call"), _text(obj, "tool_call_id"), obj.get("body")
            )
        if kind == "cancel":
            CANCEL_SHAPE.check(obj)
            return CancelCommand(_call_id(obj.get("call"), "call"))
        if kind == "auth":
            raise BadRequest("the bridge authenticates the session itself (--data-dir, --token)")
        raise BadRequest(
            f"unknown frame type {str(kind)[:32]!r}: one of {', '.join(sorted(PUBSUB_TYPES))}, "
            "call, tool_result, cancel"
        )
    except WireError as exc:
        ref = obj.get("ref")
        call = obj.get("id") if kind == "call" else obj.get("call")
        return Refusal(
            error_frame(
                exc,
                ref=ref if isinstance(ref, str) else None,
                call=call if isinstance(call, str) else None,
                line=line,
            )
        )


def _check_ref(frame: dict[str, Any]) -> None:
    """A script's own ref must not look like the bridge's (it would be taken off)."""
    ref = frame.get("ref")
    if isinstance(ref, str) and ref.startswith(OWN_REF_PREFIX):
        raise BadRequest("a ref must not start with a NUL character")


def _text(obj: dict[str, Any], name: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{name} is a non-empty string")
    return value


def _call_id(value: object, field: str) -> str:
    """A call's id: yours, 1..MAX_CALL_ID characters, tagging every frame of its answer."""
    if value is None:
        raise BadRequest(
            f"{field} is missing: the call's id (yours, 1..{MAX_CALL_ID} characters; every"
            " frame of its answer carries it)"
        )
    if not isinstance(value, str) or not 1 <= len(value) <= MAX_CALL_ID:
        raise BadRequest(f"{field}: a call id is a string of 1..{MAX_CALL_ID} characters")
    return value


def _call(obj: dict[str, Any]) -> CallCommand:
    CALL_SHAPE.check(obj)
    call_id = _call_id(obj.get("id"), "id")
    capability = _text(obj, "capability")
    name, _, version = capability.partition("@")
    validate_capability_name(name)
    if version:
        validate_version(version if "." in version else version + ".0")
    params = obj.get("params")
    if params is not None and not isinstance(params, dict):
        raise BadRequest("params is an object")
    target = obj.get("target")
    if target is not None and not is_node_id(target):
        raise BadRequest("target is a NodeID")
    deadline = obj.get("deadline_ms")
    if deadline is not None and (
        not isinstance(deadline, int) or isinstance(deadline, bool) or deadline < 1
    ):
        raise BadRequest("deadline_ms is a positive integer")
    stream = obj.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise BadRequest("stream is true or false")
    return CallCommand(call_id, capability, obj.get("input", {}), params, target, deadline, stream)


class PublishLedger:
    """Publishes sent on the session and not yet answered (``published.ok`` or ``error``
    with their ``ref``). A publish without a ``ref`` gets one of the bridge's, which is
    taken off the answer again, so the script sees what the node would have sent it."""

    def __init__(self) -> None:
        self._waiting: dict[str, int] = {}
        self._count = 0
        self._issued = 0

    @property
    def outstanding(self) -> int:
        """Publishes not answered yet."""
        return self._count

    def refs(self) -> list[str | None]:
        """The refs waiting for an answer (None for the bridge's own), one per publish."""
        return [
            None if ref.startswith(OWN_REF_PREFIX) else ref
            for ref, n in self._waiting.items()
            for _ in range(n)
        ]

    def sending(self, frame: dict[str, Any]) -> dict[str, Any]:
        """A publish frame about to go: remember its ref (giving it one if it has none)."""
        ref = frame.get("ref")
        if not isinstance(ref, str):
            self._issued += 1
            ref = f"{OWN_REF_PREFIX}{self._issued}"
            frame = {**frame, "ref": ref}
        self._waiting[ref] = self._waiting.get(ref, 0) + 1
        self._count += 1
        return frame

    def answered(self, frame: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """A frame from the node: what the script should see, and whether it answered a
        publish (then it is counted off)."""
        data = frame.get("data")
        if frame.get("event") not in ("published.ok", "error") or not isinstance(data, dict):
            return frame, False
        ref = data.get("ref")
        if not isinstance(ref, str) or ref not in self._waiting:
            return frame, False
        left = self._waiting[ref] - 1
        if left:
            self._waiting[ref] = left
        else:
            del self._waiting[ref]
        self._count -= 1
        if ref.startswith(OWN_REF_PREFIX):
            return {**frame, "data": {**data, "ref": None}}, True
        return frame, True


class AckPacer:
    """When to ack message frames written out (spec §3.6): at half the window, and when
    the session goes quiet, never for more than was written."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.written = 0  # the highest seq written out
        self.acked = 0
        self.unacked = 0

    def wrote(self, seq: int) -> int | None:
        """A message frame with ``seq`` is out: the seq to ack now, if due."""
        self.written = max(self.written, seq)
        self.unacked += 1
        if self.unacked >= max(1, self.window // 2):
            return self._ack()
        return None

    def idle(self) -> int | None:
        """Nothing more arrived for a moment: ack what was written, if anything."""
        return self._ack() if self.unacked else None

    def _ack(self) -> int | None:
        self.unacked = 0
        if self.written <= self.acked:
            return None
        self.acked = self.written
        return self.written
