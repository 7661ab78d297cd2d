"""Binary payloads: how a message whose ``data`` is bytes looks in each form. Pure.

A message's ``data`` is a JSON value or a byte string. The signed object (spec §1.3) is
JSON, so bytes take one JSON form everywhere JSON is used (the canonical bytes that are
signed, JSON and SSE frames, history, long-poll, the log, gossip): ``data`` holds the
bytes as **base64url without padding** (RFC 4648 §5, ``-`` and ``_``, no ``=``) and the
envelope carries ``"data_enc": "base64url"``. Both fields are signed, so the marker cannot
be stripped or added without breaking the signature, and a JSON value that happens to be a
string is never mistaken for bytes.

Over the CBOR subprotocol the same message carries ``data`` as a CBOR byte string and no
``data_enc`` (the byte string is the marker). :func:`json_envelope` maps it back to the
signed form, so a CBOR client verifies the same signature a JSON client does.

The base64url text must be canonical (what :func:`encode_bytes` writes: no padding, the
unused low bits of the last character zero), so that bytes → text is one-to-one and every
carrier rebuilds exactly the signed text. Size limits count the raw bytes.
"""

from __future__ import annotations

import binascii
from typing import Any

from hearthnet.errors import BadRequest

DATA_ENC = "base64url"  # the one encoding a bytes message's JSON form uses
_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_TO_STANDARD = bytes.maketrans(b"-_", b"+/")
_TO_URL = bytes.maketrans(b"+/", b"-_")


def encode_bytes(raw: bytes) -> str:
    """``raw`` as canonical base64url without padding."""
    return binascii.b2a_base64(raw, newline=False).translate(_TO_URL).rstrip(b"=").decode()


class Base64UrlText(str):
    """Bytes a JSON client sent as base64url text (``data_enc``), checked canonical: the
    envelope keeps the text as it came, without decoding and encoding it again."""

    __slots__ = ()


def check_text(text: object) -> str:
    """``text`` if it is canonical unpadded base64url (the JSON form of a bytes ``data``).

    Raises:
        BadRequest: not a string, a character outside ``[A-Za-z0-9_-]`` (padding
            included), an impossible length, or non-zero unused bits in the last character.
    """
    if not isinstance(text, str) or not text.isascii():
        raise BadRequest('data with data_enc "base64url" is base64url text')
    encoded = text.encode()
    if encoded.translate(None, _ALPHABET):  # what is left is not base64url
        raise BadRequest("data is base64url without padding ([A-Za-z0-9_-] only, no =)")
    rest = len(encoded) % 4
    if rest == 1:
        raise BadRequest("data is not base64url: its length cannot be 1 more than 4n")
    # One text per byte string: the bits of the last character that hold no data are 0.
    if rest and _ALPHABET.index(encoded[-1]) & (0x0F if rest == 2 else 0x03):
        raise BadRequest("data is not canonical base64url (unused bits must be zero)")
    return text


def decode_bytes(text: object) -> bytes:
    """The bytes of canonical unpadded base64url text (see :func:`check_text`).

    Raises:
        BadRequest: as :func:`check_text`.
    """
    return stored_bytes(check_text(text))


def decoded_size(text: str) -> int:
    """How many bytes unpadded base64url ``text`` of a possible length holds (without
    decoding it)."""
    return len(text) * 3 // 4


def from_publish(data: Any, data_enc: object) -> Any:
    """A publish's ``data`` as the client sent it, with its ``data_enc`` (None: absent):
    bytes for a byte string (CBOR), :class:`Base64UrlText` for base64url text with
    ``data_enc``, else the JSON value.

    Raises:
        BadRequest: an unknown ``data_enc``, ``data_enc`` beside a byte string, or text
            that is not canonical base64url.
    """
    if data_enc is None:
        return data
    if data_enc != DATA_ENC:
        raise BadRequest(f'data_enc is "{DATA_ENC}" or absent')
    if isinstance(data, bytes):
        raise BadRequest("a CBOR byte string needs no data_enc (it is for base64url text)")
    return Base64UrlText(check_text(data))


def json_envelope(obj: dict[str, Any]) -> dict[str, Any]:
    """The envelope in its JSON (signed) form: a byte-string ``data`` (from a CBOR frame)
    becomes base64url text with ``data_enc``; any other envelope is returned as it is.

    Raises:
        BadRequest: a byte-string ``data`` beside a ``data_enc`` field.
    """
    data = obj.get("data")
    if type(data) is not bytes:
        return obj
    if "data_enc" in obj:
        raise BadRequest("a CBOR envelope with byte-string data carries no data_enc")
    return {**obj, "data": encode_bytes(data), "data_enc": DATA_ENC}


def stored_bytes(text: str) -> bytes:
    """The bytes of base64url text already checked canonical (a stored message's)."""
    encoded = text.encode()
    return binascii.a2b_base64(encoded.translate(_TO_STANDARD) + b"=="[: -len(encoded) % 4])


def cbor_envelope(body: dict[str, Any]) -> dict[str, Any]:
    """The envelope as a CBOR frame carries it: a bytes message's ``data`` as a byte
    string without ``data_enc``; any other envelope is returned as it is. ``body`` is a
    stored (verified) message's JSON form, so its text is canonical already."""
    if body.get("data_enc") != DATA_ENC:
        return body
    out = {k: v for k, v in body.items() if k != "data_enc"}
    out["data"] = stored_bytes(body["data"])
    return out


def payload_of(envelope: dict[str, Any]) -> Any:
    """An envelope's payload as the publisher gave it: bytes for a bytes message (in
    either form), else the JSON value.

    Raises:
        BadRequest: ``data_enc`` names another encoding, or the text is not base64url.
    """
    data = envelope.get("data")
    enc = envelope.get("data_enc")
    if enc is None:
        return data
    if enc != DATA_ENC:
        raise BadRequest(f'data_enc is "{DATA_ENC}" or absent')
    return data if isinstance(data, bytes) else decode_bytes(data)
