"""Bytes on the wire for pub/sub: each committed message is encoded once per transport
form and the same bytes go to every subscriber of that form (spec §11). Pure.

Forms: ``ws_text`` (a complete unmasked WebSocket text frame, header included),
``ws_cbor`` (a binary frame with the CBOR form), ``sse`` (an SSE event with ``id:``)
and ``json`` (the frame object's JSON, for long-poll and history bodies). Each form has an
unsigned variant (the form's name + :data:`NOSIG`): the same frame with the envelope's
``sig`` left out, for subscribers that did not ask to verify (spec §6.2), and lean
variants (:func:`lean_form`): the frame's ``data`` holds only the envelope fields a
subscriber named in its subscribe (``fields``), in the envelope's order.
"""

from __future__ import annotations

from typing import Any

import orjson

from hearthnet import cbor
from hearthnet.pubsub.envelope import Message, StoredMessage
from hearthnet.transport.websocket import OP_BINARY, OP_TEXT, ws_frame

FORMS = ("ws_text", "ws_cbor", "sse", "json")
NOSIG = "-nosig"


_UNSIGNED = {form: form + NOSIG for form in FORMS}  # one string each, not one per session
_WS_TEXT_NOSIG = _UNSIGNED["ws_text"]  # what most subscribers take (WebSocket, JSON)
LEAN = "~"  # a lean form's name: the form, LEAN, the fields joined by commas
# The envelope fields a subscriber may ask for (``fields`` in subscribe), in the order a
# lean frame carries them; ``data_enc`` comes with ``data`` (it says how to read it).
ENVELOPE_FIELDS = ("id", "topic", "type", "data", "origin", "origin_seq", "ts", "ttl_s", "sender")
_LEAN_NAMES: dict[tuple[str, tuple[str, ...]], str] = {}  # at most 4 forms x 2^9 field sets


# A lean form's name -> (its form, its fields in envelope order): parsed once per name.
_LEAN_PARTS: dict[str, tuple[str, tuple[str, ...]]] = {}


def lean_form(form: str, fields: tuple[str, ...]) -> str:
    """The name of form ``form`` (one of :data:`FORMS`) whose message frames carry only
    ``fields`` of the envelope (no ``sig``); one string per form and field set."""
    key = (form, tuple(f for f in ENVELOPE_FIELDS if f in fields))
    name = _LEAN_NAMES.get(key)
    if name is None:
        name = _LEAN_NAMES[key] = form + LEAN + ",".join(key[1])
        _LEAN_PARTS[name] = key
    return name


def lean_body(body: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """The ``fields`` (in envelope order) of ``body``, with ``data_enc`` beside ``data``
    when the message is bytes."""
    out: dict[str, Any] = {}
    for name in fields:
        if name in body:
            out[name] = body[name]
            if name == "data" and "data_enc" in body:
                out["data_enc"] = body["data_enc"]
    return out


def message_form(form: str, verify: bool) -> str:
    """The form a subscriber's message frames take: ``form`` with ``sig`` when it asked to
    verify, else its unsigned variant."""
    return form if verify else _UNSIGNED[form]


def unsigned_envelope(message: Message) -> bytes:
    """The envelope's JSON bytes without ``sig``: cut from the stored bytes when ``sig`` is
    their last key (every message signed here, and those stored from peers in that order),
    else encoded again. The bytes after the cut must be exactly ``sig`` and the closing
    brace, so the cut is at the top level even when ``data`` holds a ``"sig"`` key."""
    known = message.unsigned_bytes()
    if known is not None:
        return known
    raw = message.raw
    cut = raw.rfind(b',"sig":')
    if cut > 0 and raw[cut + 7 : -1] == orjson.dumps(message.sig):
        return raw[:cut] + b"}"
    body = message.body()
    del body["sig"]
    return orjson.dumps(body)


def sse_bytes(event: str, data: bytes, event_id: int | None = None) -> bytes:
    """One SSE event; ``data`` is one line of JSON."""
    out = b"event: " + event.encode() + b"\ndata: " + data + b"\n"
    if event_id is not None:
        out += b"id: " + str(event_id).encode() + b"\n"
    return out + b"\n"


class EncodedMessage:
    """One committed message with its encodings, each made at most once."""

    __slots__ = (
        "_json",
        "_lean",
        "_nosig",
        "_sse",
        "_ws_cbor",
        "_ws_text",
        "_ws_text_nosig",
        "stored",
    )

    def __init__(self, stored: StoredMessage) -> None:
        self.stored = stored
        self._json: bytes | None = None
        self._ws_text: bytes | None = None
        self._ws_text_nosig: bytes | None = None
        self._ws_cbor: bytes | None = None
        self._sse: bytes | None = None
        self._nosig: dict[str, bytes] | None = None
        self._lean: dict[str, bytes] | None = None

    @property
    def seq(self) -> int:
        """The message's log position."""
        return self.stored.seq

    @property
    def topic(self) -> str:
        """The message's topic."""
        return self.stored.topic

    def json(self) -> bytes:
        """``{"event":"message","data":<envelope>,"seq":N}`` as JSON."""
        if self._json is None:
            self._json = self.stored.frame_bytes()
        return self._json

    def ws_text(self) -> bytes:
        """The JSON frame inside a WebSocket text frame."""
        if self._ws_text is None:
            self._ws_text = ws_frame(self.json(), OP_TEXT)
        return self._ws_text

    def ws_cbor(self) -> bytes:
        """The CBOR frame inside a WebSocket binary frame (a bytes message's ``data`` as a
        byte string)."""
        if self._ws_cbor is None:
            self._ws_cbor = ws_frame(cbor.dumps(self.stored.frame_cbor()), OP_BINARY)
        return self._ws_cbor

    def sse(self) -> bytes:
        """``event: message`` with the envelope as data and the seq as ``id:``."""
        if self._sse is None:
            self._sse = sse_bytes("message", self.stored.message.raw, self.stored.seq)
        return self._sse

    def ws_text_unsigned(self) -> bytes:
        """``ws_text`` without ``sig``, the form most subscribers take: made in one step
        from the stored envelope bytes when they are known without encoding."""
        out = self._ws_text_nosig
        if out is None:
            stored = self.stored
            envelope = stored.unsigned_bytes()
            if envelope is None:
                out = self.unsigned("ws_text")
            else:
                out = ws_frame(
                    b'{"event":"message","data":%b,"seq":%d}' % (envelope, stored.seq), OP_TEXT
                )
            self._ws_text_nosig = out
        return out

    def unsigned(self, name: str) -> bytes:
        """Form ``name`` (one of :data:`FORMS`) with the envelope's ``sig`` left out."""
        cache = self._nosig
        if cache is None:
            cache = self._nosig = {}
        out = cache.get(name)
        if out is not None:
            return out
        if name == "ws_cbor":
            out = ws_frame(cbor.dumps(self.stored.frame_cbor(sig=False)), OP_BINARY)
        else:
            envelope = cache.get("envelope")
            if envelope is None:
                known = self.stored.unsigned_bytes()  # no Message made for it
                envelope = cache["envelope"] = (
                    known if known is not None else unsigned_envelope(self.stored.message)
                )
            if name == "sse":
                out = sse_bytes("message", envelope, self.stored.seq)
            else:
                json = cache.get("json")
                if json is None:
                    json = cache["json"] = (
                        b'{"event":"message","data":'
                        + envelope
                        + b',"seq":'
                        + str(self.stored.seq).encode()
                        + b"}"
                    )
                out = json if name == "json" else ws_frame(json, OP_TEXT)
        cache[name] = out
        return out

    def lean(self, name: str) -> bytes:
        """Lean form ``name`` (:func:`lean_form`): the frame with only the named fields."""
        cache = self._lean
        if cache is None:
            cache = self._lean = {}
        out = cache.get(name)
        if out is not None:
            return out
        parts = _LEAN_PARTS.get(name)
        if parts is None:  # a name not made by lean_form
            form, _, text = name.partition(LEAN)
            parts = (form, tuple(text.split(",")))
        form, fields = parts
        stored = self.stored
        if form == "ws_cbor":
            frame = stored.frame_cbor(sig=False)
            frame["data"] = lean_body(frame["data"], fields)
            out = ws_frame(cbor.dumps(frame), OP_BINARY)
        else:
            body = stored.fields
            if body is None:
                body = stored.message.body(sig=False)
            envelope = orjson.dumps(lean_body(body, fields))
            if form == "sse":
                out = sse_bytes("message", envelope, stored.seq)
            else:
                out = b'{"event":"message","data":%b,"seq":%d}' % (envelope, stored.seq)
                if form == "ws_text":
                    out = ws_frame(out, OP_TEXT)
        cache[name] = out
        return out

    def form(self, name: str) -> bytes:
        """The encoding called ``name`` (one of :data:`FORMS`, its unsigned variant, or a
        lean form)."""
        if name == _WS_TEXT_NOSIG:
            return self.ws_text_unsigned()
        if LEAN in name:
            return self.lean(name)
        if name.endswith(NOSIG):
            return self.unsigned(name[: -len(NOSIG)])
        if name == "ws_text":
            return self.ws_text()
        if name == "ws_cbor":
            return self.ws_cbor()
        if name == "sse":
            return self.sse()
        return self.json()


def control_frame(form: str, event: str, data: dict[str, Any]) -> bytes:
    """A non-message frame (``subscribed``, ``gap``, ``presence``, ``error``...) in ``form``."""
    obj = {"event": event, "data": data}
    if form == "ws_text":
        return ws_frame(orjson.dumps(obj), OP_TEXT)
    if form == "ws_cbor":
        return ws_frame(cbor.dumps(obj), OP_BINARY)
    if form == "sse":
        return sse_bytes(event, orjson.dumps(data))
    return orjson.dumps(obj)


class TopicBatch:
    """The messages of one topic in one committed batch, encoded once per form and shared by
    every subscriber: ``form(name)`` gives ``(seqs, frames)`` lists a subscriber's channel
    takes slices of, with no per-subscriber work per message."""

    __slots__ = ("_forms", "_joined", "_streams", "items", "seqs", "topic")

    def __init__(self, topic: str, items: list[EncodedMessage]) -> None:
        self.topic = topic
        self.items = items
        self.seqs = [item.seq for item in items]
        self._forms: dict[str, list[bytes]] = {}
        self._joined: dict[str, bytes] = {}
        self._streams: dict[str, tuple[list[int], list[bytes], bytes]] = {}

    def form(self, name: str) -> tuple[list[int], list[bytes]]:
        """``(seqs, frames)`` in form ``name``."""
        frames = self._forms.get(name)
        if frames is None:
            frames = self._forms[name] = [item.form(name) for item in self.items]
        return self.seqs, frames

    def stream(self, name: str) -> tuple[list[int], list[bytes], bytes]:
        """``(seqs, frames, whole)`` in form ``name`` for a byte stream, ``whole`` being
        the frames joined (:meth:`joined`): one tuple per form, shared by every subscriber
        of the form, so nothing is made per subscriber."""
        out = self._streams.get(name)
        if out is None:
            seqs, frames = self.form(name)
            out = self._streams[name] = (seqs, frames, self.joined(name))
        return out

    def joined_forms(self) -> list[bytes]:
        """Every joined batch made so far (one per form a subscriber took whole)."""
        return list(self._joined.values())

    def joined(self, name: str) -> bytes:
        """All frames of form ``name`` as one bytes object, made once for every subscriber
        that takes the whole batch (a stream form: frames written back to back)."""
        data = self._joined.get(name)
        if data is None:
            data = self._joined[name] = b"".join(self.form(name)[1])
        return data
