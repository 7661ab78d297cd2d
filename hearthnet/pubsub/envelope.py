"""The signed pub/sub message envelope (spec §6.2).

``{"id", "topic", "type", "data", "data_enc"?, "origin", "origin_seq", "ts", "ttl_s"?,
"sender"?, "sig"}``, signed by the origin node over the JCS form without ``sig``: either
alone (``sig`` is a signature string) or in a batch (``sig`` is
``{"batch", "first", "n", "path"}``, see
:mod:`hearthnet.pubsub.batchsig`). A :class:`Message` always carries a verified signature
(it is made by :meth:`Message.create` or :meth:`Message.signed_batch`, which sign, or by
:meth:`Message.parse`, which verifies), and keeps the exact JSON bytes it travels as, so
fan-out never re-encodes it.

A message's ``data`` may be bytes: the envelope then holds it as base64url text with
``"data_enc": "base64url"`` (its JSON form, which is signed), and CBOR frames carry it as
a byte string (see :mod:`hearthnet.pubsub.payload`). What each field must be, and the
canonical bytes a signature covers, are :mod:`hearthnet.pubsub.envelope_fields`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from hearthnet.canonical import MAX_EXACT_INTEGER, canonicalize
from hearthnet.errors import BadRequest, InvalidSignature
from hearthnet.identity import KeyPair, verify_object
from hearthnet.pubsub.batchsig import VERIFIER, BatchVerifier, SignedBatch
from hearthnet.pubsub.envelope_fields import (
    MAX_PAYLOAD_BYTES,
    MAX_TTL_S,
    canonical_body,
    checked_fields,
    encoded_payload,
    unsigned_fields,
    validate_ttl,
    validate_type,
    with_sig,
)
from hearthnet.pubsub.merkle import hash_leaves
from hearthnet.pubsub.payload import decode_bytes, json_envelope, stored_bytes

# The field checks and canonical bytes live in envelope_fields; importable from here too.
__all__ = [
    "MAX_PAYLOAD_BYTES",
    "MAX_TTL_S",
    "Message",
    "StoredMessage",
    "canonical_body",
    "encoded_payload",
    "unsigned_fields",
    "validate_ttl",
    "validate_type",
]


@dataclass(frozen=True, slots=True)
class Message:
    """A verified message, with the bytes it travels as.

    A message of a batch signed here (or read back from the log) may hold its batch
    instead of its proof: ``sig`` and ``raw`` are then made on first use (the proof's JSON
    costs a few µs, paid only by messages that go out with ``sig``), and
    :meth:`unsigned_bytes` never needs them.
    """

    id: str
    topic: str
    type: str
    data: Any
    origin: str
    origin_seq: int
    ts: int
    # A signature string or a batch proof (spec §6.2); None until sealed from ``batch``.
    sig_: str | dict[str, Any] | None = field(compare=False, repr=False)
    ttl_s: int | None = None
    sender: dict[str, str] | None = None
    # The envelope's JSON bytes; while ``sig_`` is None, the canonical bytes without sig.
    raw_: bytes = field(default=b"", compare=False, repr=False)
    # len(raw) up to the `,"sig":` that ends it, when known (signed here): raw[:n] + b"}" is
    # the envelope without sig. 0: unknown.
    unsigned_len: int = field(default=0, compare=False, repr=False)
    # "base64url" when data is bytes, held as that text (see hearthnet.pubsub.payload)
    data_enc: str | None = None
    batch: SignedBatch | None = field(default=None, compare=False, repr=False)

    @property
    def sig(self) -> str | dict[str, Any]:
        """The signature string, or the batch proof ``{"batch", "first", "n", "path"}``."""
        sig = self.sig_
        if sig is None:
            return self._seal()[0]
        return sig

    @property
    def raw(self) -> bytes:
        """The envelope's JSON bytes, ``sig`` last."""
        if self.sig_ is None:
            return self._seal()[1]
        return self.raw_

    @property
    def sealed(self) -> bool:
        """Whether ``sig`` and ``raw`` are made already (False: made on first use)."""
        return self.sig_ is not None

    def _seal(self) -> tuple[str | dict[str, Any], bytes]:
        """Make ``sig`` and ``raw`` from the batch (once; a race makes the same bytes)."""
        if self.batch is None:
            raise ValueError("a message without sig needs its batch")
        sig, text = self.batch.proof(self.origin_seq)
        raw = self.raw_[:-1] + b',"sig":' + text + b"}"
        object.__setattr__(self, "raw_", raw)
        object.__setattr__(self, "sig_", sig)
        return sig, raw

    def unsigned_bytes(self) -> bytes | None:
        """The envelope's JSON bytes without ``sig`` when known without encoding (signed
        here, or stored without ``sig``), else None."""
        if self.sig_ is None:
            return self.raw_
        if self.unsigned_len:
            return self.raw_[: self.unsigned_len] + b"}"
        return None

    @property
    def payload(self) -> Any:
        """The payload as published: bytes for a bytes message, else ``data``."""
        return decode_bytes(self.data) if self.data_enc is not None else self.data

    @property
    def expires_ms(self) -> int | None:
        """When the message's own TTL runs out (None: no TTL)."""
        return self.ts + self.ttl_s * 1000 if self.ttl_s is not None else None

    def body(self, *, sig: bool = True) -> dict[str, Any]:
        """The envelope as a JSON object, with ``sig`` unless ``sig=False`` (which never
        makes a batch member's proof)."""
        out: dict[str, Any] = {
            "id": self.id,
            "topic": self.topic,
            "type": self.type,
            "data": self.data,
            "origin": self.origin,
            "origin_seq": self.origin_seq,
            "ts": self.ts,
        }
        if self.data_enc is not None:
            out["data_enc"] = self.data_enc
        if self.ttl_s is not None:
            out["ttl_s"] = self.ttl_s
        if self.sender is not None:
            out["sender"] = self.sender
        if sig:
            out["sig"] = self.sig
        return out

    @staticmethod
    def unsigned(
        origin_id: str,
        *,
        topic: str,
        msg_type: str,
        data: Any,
        origin_seq: int,
        ts: int,
        ttl_s: int | None = None,
        sender: dict[str, str] | None = None,
        msg_id: str | None = None,
    ) -> dict[str, Any]:
        """A new message's fields, all but ``sig`` (inputs already validated); bytes
        ``data`` takes its JSON form (base64url text and ``data_enc``)."""
        return unsigned_fields(
            origin_id, topic, msg_type, data, origin_seq, ts, ttl_s, sender, msg_id
        )

    @classmethod
    def signed(cls, origin: KeyPair, body: dict[str, Any]) -> Message:
        """Sign an :meth:`unsigned` body as the origin node (safe to call from a thread:
        the ed25519 work runs without the GIL)."""
        body = {**body, "sig": origin.sign_object(body)}
        return cls.trusted(body, orjson.dumps(body))

    @classmethod
    def signed_batch(
        cls, origin: KeyPair, bodies: list[dict[str, Any]], canonical: list[bytes]
    ) -> list[Message]:
        """Sign :meth:`unsigned` bodies of consecutive ``origin_seq`` with one batch
        signature (spec §6.2), given each body's :func:`canonical_body` bytes; a single
        body gets an ordinary signature. Each message of a batch holds the batch
        (:attr:`batch`) and makes its proof on first use. Safe to call from a thread."""
        if len(bodies) == 1:
            sig = origin.sign_bytes(canonical[0])
            bodies[0]["sig"] = sig
            return [cls.trusted(bodies[0], with_sig(canonical[0], sig), len(canonical[0]) - 1)]
        batch = SignedBatch.sign(origin, bodies[0]["origin_seq"], hash_leaves(canonical))
        return [
            cls.in_batch(body, leaf, batch) for body, leaf in zip(bodies, canonical, strict=True)
        ]

    @classmethod
    def in_batch(cls, body: dict[str, Any], canonical: bytes, batch: SignedBatch) -> Message:
        """A message of ``batch`` from its fields without ``sig`` and their canonical bytes
        (signed here, or read back from the log): no validation, no signature check."""
        return cls(
            body["id"],
            body["topic"],
            body["type"],
            body["data"],
            body["origin"],
            body["origin_seq"],
            body["ts"],
            None,
            body.get("ttl_s"),
            body.get("sender"),
            canonical,
            len(canonical) - 1,
            body.get("data_enc"),
            batch,
        )

    @classmethod
    def trusted(cls, body: dict[str, Any], raw: bytes, unsigned_len: int = 0) -> Message:
        """A message from fields already checked and signed (ours, or read back from the
        log, where only verified messages are stored): no validation, no signature check.
        ``unsigned_len``: see the field."""
        return cls(
            body["id"],
            body["topic"],
            body["type"],
            body["data"],
            body["origin"],
            body["origin_seq"],
            body["ts"],
            body["sig"],
            body.get("ttl_s"),
            body.get("sender"),
            raw,
            unsigned_len,
            body.get("data_enc"),
        )

    @classmethod
    def proved(
        cls,
        obj: dict[str, Any],
        sig: dict[str, Any],
        raw: bytes,
        leaf_len: int,
        batch: SignedBatch | None = None,
    ) -> Message:
        """A message of a batch whose root and signature the caller verified from all its
        leaves (a batch gossiped whole, spec §6.2): its fields are validated here, its
        signature is not checked again. ``obj`` is the parsed leaf (without ``sig``), ``sig``
        its rebuilt proof, ``raw`` the envelope with that proof, ``leaf_len`` the leaf's
        length, ``batch`` the verified batch (the log stores a message holding it with
        its batch, once).

        Raises:
            BadRequest: malformed envelope.
            PayloadTooLarge: data over 256 KiB.
        """
        obj["sig"] = sig
        return cls._checked(obj, checked_fields(obj), sig, raw, leaf_len - 1, batch=batch)

    def leaf(self) -> bytes:
        """The JCS bytes of the message without ``sig`` (what a signature covers)."""
        unsigned = self.unsigned_bytes()
        if unsigned is not None:
            return unsigned
        body = self.body(sig=False)
        if self.origin_seq <= MAX_EXACT_INTEGER and self.ts <= MAX_EXACT_INTEGER:
            return canonical_body(body)
        return canonicalize(body)

    @classmethod
    def create(cls, origin: KeyPair, **fields: Any) -> Message:
        """Sign a new message as the origin node (fields as for :meth:`unsigned`)."""
        return cls.signed(origin, cls.unsigned(origin.node_id, **fields))

    @classmethod
    def parse(
        cls, obj: object, *, raw: bytes | None = None, verifier: BatchVerifier = VERIFIER
    ) -> Message:
        """Validate an envelope and verify its signature (messages from peers or the log).

        ``obj`` is the JSON form, or the CBOR form of a bytes message (byte-string
        ``data``, no ``data_enc``), which is verified as its JSON form. A batch signature
        is checked once per batch by ``verifier`` (the process's own by default); each
        message's Merkle path is checked every time.

        Raises:
            BadRequest: malformed envelope.
            PayloadTooLarge: data over 256 KiB.
            InvalidSignature: the origin's signature does not verify.
        """
        if not isinstance(obj, dict):
            raise BadRequest("a message is an object")
        if type(obj.get("data")) is bytes:
            obj, raw = json_envelope(obj), None
        checked = checked_fields(obj)
        sig = obj["sig"]
        if isinstance(sig, dict):
            unsigned = {k: v for k, v in obj.items() if k != "sig"}
            try:
                # Every field but data is validated above; the integers must be exact.
                if obj["origin_seq"] <= MAX_EXACT_INTEGER and obj["ts"] <= MAX_EXACT_INTEGER:
                    leaf = canonical_body(unsigned)
                else:
                    leaf = canonicalize(unsigned)
            except BadRequest as exc:
                raise InvalidSignature(f"cannot canonicalize signed object: {exc}") from exc
            verifier.verify(obj["origin"], leaf, obj["origin_seq"], sig)
        else:
            verify_object(obj["origin"], obj, sig, "sig")
            verifier.count_single()
        return cls._checked(obj, checked, sig, raw if raw is not None else orjson.dumps(obj))

    @classmethod
    def _checked(
        cls,
        obj: dict[str, Any],
        checked: tuple[str, str, int | None, Any, Any],
        sig: str | dict[str, Any],
        raw: bytes,
        unsigned_len: int = 0,
        *,
        batch: SignedBatch | None = None,
    ) -> Message:
        """A message of an envelope whose fields :func:`checked_fields` returned as
        ``checked`` and whose signature was verified."""
        topic, msg_type, ttl_s, sender, data_enc = checked
        return cls(
            obj["id"],
            topic,
            msg_type,
            obj["data"],
            obj["origin"],
            obj["origin_seq"],
            obj["ts"],
            sig,
            ttl_s,
            sender,
            raw,
            unsigned_len,
            data_enc,
            batch,
        )


class StoredMessage:
    """A message at its position in this node's log (spec §6.3).

    A message of a batch signed here is committed as its fields and canonical bytes
    (:meth:`of_batch`): its :class:`Message` is made on first use of :attr:`message`, so
    a commit nobody reads (no subscriber, no peer) makes no message object. Immutable by
    convention: nothing sets an attribute after construction.
    """

    __slots__ = ("_message", "batch", "fields", "leaf", "seq", "source")

    def __init__(self, seq: int, message: Message, source: str | None = None) -> None:
        self.seq = seq
        self._message: Message | None = message
        self.source = source  # the peer it came from (None: published here); not stored
        # Set by of_batch only: the fields without sig and their canonical bytes.
        self.fields: dict[str, Any] | None = None
        self.leaf = b""
        self.batch: SignedBatch | None = message.batch

    @classmethod
    def of_batch(
        cls, seq: int, fields: dict[str, Any], leaf: bytes, batch: SignedBatch
    ) -> StoredMessage:
        """Message ``fields`` (without ``sig``, ``leaf`` their canonical bytes) of
        ``batch``, signed here, at ``seq``; its :class:`Message` is made on first use."""
        out = cls.__new__(cls)
        out.seq, out._message, out.source = seq, None, None
        out.fields, out.leaf, out.batch = fields, leaf, batch
        return out

    @property
    def message(self) -> Message:
        """The message (made from the fields on first use; a race makes an equal one)."""
        message = self._message
        if message is None:
            assert self.fields is not None
            assert self.batch is not None
            message = self._message = Message.in_batch(self.fields, self.leaf, self.batch)
        return message

    @property
    def topic(self) -> str:
        """The message's topic (without making the :class:`Message`)."""
        fields = self.fields
        if fields is None:
            return self.message.topic
        topic: str = fields["topic"]
        return topic

    @property
    def origin(self) -> str:
        """The message's origin node (without making the :class:`Message`)."""
        fields = self.fields
        if fields is None:
            return self.message.origin
        origin: str = fields["origin"]
        return origin

    @property
    def origin_seq(self) -> int:
        """The message's ``origin_seq`` (without making the :class:`Message`)."""
        fields = self.fields
        if fields is None:
            return self.message.origin_seq
        origin_seq: int = fields["origin_seq"]
        return origin_seq

    def unsigned_bytes(self) -> bytes | None:
        """The envelope's JSON bytes without ``sig`` when known without encoding (see
        :meth:`Message.unsigned_bytes`)."""
        if self.fields is not None:
            return self.leaf
        return self.message.unsigned_bytes()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StoredMessage):
            return NotImplemented
        return (self.seq, self.message, self.source) == (other.seq, other.message, other.source)

    def __hash__(self) -> int:
        return hash((self.seq, self.message.id))

    def __repr__(self) -> str:
        return f"StoredMessage(seq={self.seq}, message={self.message!r}, source={self.source!r})"

    def frame_json(self) -> dict[str, Any]:
        """``{"event":"message","data":<envelope>,"seq":N}`` as an object (history, long-poll)."""
        return {"event": "message", "data": self.message.body(), "seq": self.seq}

    def frame_cbor(self, *, sig: bool = True) -> dict[str, Any]:
        """The message frame as a CBOR frame carries it: a bytes message's ``data`` is a
        byte string (see :mod:`hearthnet.pubsub.payload`); without ``sig`` when asked."""
        body = self.message.body(sig=sig)  # a new dict: changed in place (once per message)
        if self.message.data_enc is not None:
            del body["data_enc"]
            body["data"] = stored_bytes(self.message.data)
        return {"event": "message", "data": body, "seq": self.seq}

    def frame_bytes(self) -> bytes:
        """The same frame as JSON bytes, built around the stored envelope bytes."""
        return (
            b'{"event":"message","data":'
            + self.message.raw
            + b',"seq":'
            + str(self.seq).encode()
            + b"}"
        )
