"""RFC 8785 JSON Canonicalization Scheme (JCS): the bytes that get signed (spec §1.3).

Rules implemented:
- object keys sorted by their UTF-16 code units;
- no insignificant whitespace;
- strings escaped as ECMAScript ``JSON.stringify`` does: ``\\"``, ``\\\\``, the short
  escapes ``\\b \\f \\n \\r \\t``, other controls as lower-case ``\\u00xx``, everything
  else as raw UTF-8;
- numbers formatted as ECMAScript ``Number.prototype.toString``.

Inputs that JCS cannot represent faithfully are refused with :class:`BadRequest`:
NaN and infinities, integers beyond ±2^53 and integral floats between 2^53 and 10^21
(JCS reads every number as an IEEE-754 double, and these would re-read as integers that
no double holds exactly), lone surrogates, non-string keys, and non-JSON types.

Input is held to the same rules where it is parsed (spec §2.5): :func:`parse_json` and
:func:`check_representable` refuse, with :class:`NotCanonical`, what :func:`canonicalize`
would refuse or change, so a value that reached the node can always be signed.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

import orjson

from hearthnet.errors import BadRequest, NotCanonical

if TYPE_CHECKING:
    from decimal import Decimal

MAX_SAFE_INTEGER = 2**53 - 1
# 2^53 itself is exact; 2^53 + 1 is not, so it cannot be confused with a neighbour.
MAX_EXACT_INTEGER = 2**53

# spec §2.5: deeper nesting is refused at the edge (and never reaches a recursive walk).
MAX_DEPTH = 64

# The C-accelerated string escaper behind json.dumps(ensure_ascii=False). It escapes
# exactly what JCS requires and leaves the rest raw, with lower-case \u00xx escapes.
_encode_string = json.encoder.encode_basestring


def _utf16_key(key: str) -> bytes:
    return key.encode("utf-16-be", "surrogatepass")


def format_number(value: float) -> str:
    """ECMAScript ``Number::toString`` for a finite double (RFC 8785 §3.2.2.3)."""
    if math.isnan(value) or math.isinf(value):
        raise BadRequest("NaN and Infinity have no JSON form")
    if value == 0:
        return "0"  # covers -0.0 as well
    sign = "-" if value < 0 else ""
    # repr() yields the shortest digits that round-trip, as ECMAScript requires.
    text = repr(abs(value))
    if "e" in text:
        mantissa, exp_text = text.split("e")
        exponent = int(exp_text)
    else:
        mantissa, exponent = text, 0
    if "." in mantissa:
        int_part, frac_part = mantissa.split(".")
    else:
        int_part, frac_part = mantissa, ""
    if frac_part == "0":
        frac_part = ""
    digits = (int_part + frac_part).lstrip("0")
    # n: position of the decimal point relative to the first significant digit
    leading_zeros = len(int_part + frac_part) - len((int_part + frac_part).lstrip("0"))
    n = len(int_part) + exponent - leading_zeros
    digits = digits.rstrip("0")
    k = len(digits)
    if k <= n <= 21:
        return sign + digits + "0" * (n - k)
    if 0 < n <= 21:
        return sign + digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * (-n) + digits
    e = n - 1
    exp_str = ("+" if e >= 0 else "-") + str(abs(e))
    if k == 1:
        return sign + digits + "e" + exp_str
    return sign + digits[0] + "." + digits[1:] + "e" + exp_str


def _check_string(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest("strings must be valid Unicode (lone surrogate)") from exc


def _serialize(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        _check_string(value)
        out.append(_encode_string(value))
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif value is None:
        out.append("null")
    elif isinstance(value, int):
        if not -MAX_EXACT_INTEGER <= value <= MAX_EXACT_INTEGER:
            raise BadRequest("integers in signed objects must be within ±2^53")
        out.append(str(value))
    elif isinstance(value, float):
        if value.is_integer() and MAX_EXACT_INTEGER < abs(value) < 1e21:
            raise BadRequest(
                "integral floats between 2^53 and 1e21 do not round-trip; use a string"
            )
        out.append(format_number(value))
    elif isinstance(value, dict):
        out.append("{")
        keys = list(value)
        for key in keys:
            if not isinstance(key, str):
                raise BadRequest("object keys must be strings")
        # Sorting by UTF-16 code units differs from code-point order only when a key
        # holds characters above U+FFFF; take the cheap path when none does.
        if any(ch > "\uffff" for key in keys for ch in key):
            keys.sort(key=_utf16_key)
        else:
            keys.sort()
        first = True
        for key in keys:
            if not first:
                out.append(",")
            first = False
            _check_string(key)
            out.append(_encode_string(key))
            out.append(":")
            _serialize(value[key], out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _serialize(item, out)
        out.append("]")
    else:
        raise BadRequest(f"{type(value).__name__} has no JSON form")


def _orjson_safe(value: Any) -> bool:
    """True when orjson's sorted output is already the JCS form: no floats (number
    formatting differs), integers within ±2^53, ASCII keys (byte order = UTF-16 order),
    plain dict/list/tuple/str/bool/None. orjson escapes strings exactly as JCS does."""
    t = type(value)
    if t is str or t is bool or value is None:
        return True
    if t is int:
        return bool(-MAX_EXACT_INTEGER <= value <= MAX_EXACT_INTEGER)
    if t is dict:
        for key, item in value.items():
            if type(key) is not str or not key.isascii() or not _orjson_safe(item):
                return False
        return True
    if t is list or t is tuple:
        return all(_orjson_safe(item) for item in value)
    return False


def orjson_is_canonical(value: Any) -> bool:
    """True when orjson's sorted output of ``value`` is its JCS form (see
    :func:`canonicalize`); callers that know the rest of an object use it on a part."""
    return _orjson_safe(value)


def canonicalize(value: Any) -> bytes:
    """The RFC 8785 canonical UTF-8 bytes of a JSON value.

    Common values (no floats, ASCII keys) are encoded by orjson, about four times
    faster; the rest by :func:`canonicalize_exact`. Both give the same bytes.

    Raises:
        BadRequest: the value cannot be represented canonically (see module doc).
    """
    if _orjson_safe(value):
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:
            pass  # a lone surrogate or deep nesting: the exact path says which
    return canonicalize_exact(value)


def canonicalize_exact(value: Any) -> bytes:
    """RFC 8785 by the rules of the module doc, for any value (the reference path).

    Raises:
        BadRequest: the value cannot be represented canonically (see module doc).
    """
    out: list[str] = []
    _serialize(value, out)
    return "".join(out).encode("utf-8")


def canonicalize_without(obj: dict[str, Any], *omit: str) -> bytes:
    """Canonical bytes of ``obj`` with the named fields (``sig``, ``signature``) left out."""
    return canonicalize({k: v for k, v in obj.items() if k not in omit})


# --- the edge check (spec §2.5) ----------------------------------------------------------

# The fast path looks at JSON text through this table: digits and dots become "0", the
# exponent letters "e", and "{" becomes "[" (one count for both brackets). A number token
# with no exponent and fewer than 16 digits and dots has at most 15 significant digits:
# as a double it reads back as written, and as an integer it is within ±2^53. Text holding
# "0e" (a digit then an exponent letter) or a run of 16 "0"s may hold another number (or
# just a string like "1e4a"): only then are the numbers read again from their text.
_NUMBER_VIEW = bytes.maketrans(b"0123456789.eE{", b"00000000000ee[")
_LONG_NUMBER = b"0" * 16


def _exact_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as exc:  # more digits than int() reads
        raise NotCanonical("integers must be within ±2^53") from exc
    if not -MAX_EXACT_INTEGER <= value <= MAX_EXACT_INTEGER:
        raise NotCanonical("integers must be within ±2^53; send a larger one as a string")
    return value


# decimal (~0.5 MiB with its C module) is imported by the first float parsed, not at
# start: a node that never reads a fractional number never needs it (spec §11: idle RSS)
_decimal: type[Decimal] | None = None


def _exact_float(text: str) -> float:
    global _decimal  # noqa: PLW0603 - set once, by the first float
    value = float(text)
    _check_float(value)
    if _decimal is None:
        from decimal import Decimal  # noqa: PLC0415

        _decimal = Decimal
    # The number the sender wrote must be the number that gets signed: JCS writes the
    # shortest digits that read back as this double, which repr() gives.
    if _decimal(text) != _decimal(repr(value)):
        raise NotCanonical(f"the number {text[:40]} does not round-trip through a double")
    return value


def _refuse_constant(text: str) -> Any:
    raise NotCanonical(f"{text} has no JSON form")


def _check_float(value: float) -> None:
    if math.isnan(value) or math.isinf(value):
        raise NotCanonical("NaN and Infinity have no JSON form")
    if value.is_integer() and MAX_EXACT_INTEGER < abs(value) < 1e21:
        raise NotCanonical("integral floats between 2^53 and 1e21 do not round-trip; use a string")


def parse_json(data: bytes | bytearray | str) -> Any:
    """Parse JSON text into a value :func:`canonicalize` represents exactly (spec §2.5).

    The fast path is orjson and a look at the value: an object of strings, small integers
    and small flat members (:func:`_plain`: most client frames) is returned as it is.
    Anything else gets a few passes over its bytes in C; only text that may hold a long or
    exponent number has its numbers read again, and only text with more than
    :data:`MAX_DEPTH` brackets has its containers walked for depth.

    Raises:
        BadRequest: malformed JSON.
        NotCanonical: an integer beyond ±2^53 (also one too long for a double), a number
            that would not read back as written, or nesting deeper than :data:`MAX_DEPTH`.
    """
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "depth" in exc.msg:
            raise NotCanonical(f"nesting deeper than {MAX_DEPTH}") from exc
        if "infinity" in exc.msg:
            raise NotCanonical("a number too large for a double") from exc
        raise BadRequest(f"malformed JSON: {exc.msg}") from exc
    if _plain(value):
        return value
    raw = data.encode() if isinstance(data, str) else data
    # Every frame of a session (acks included) comes through here, so the passes are the
    # cheapest CPython has: a text needs MAX_DEPTH + 1 brackets to nest too deep and 16
    # bytes to hold a long number, and bytes.find is several times faster than `in`.
    view = raw.translate(_NUMBER_VIEW)
    if len(view) > MAX_DEPTH and view.count(b"[") > MAX_DEPTH:
        _check_depth(value)  # before the recursive stdlib parser below sees it
    if view.find(b"0e") < 0 and (len(view) < len(_LONG_NUMBER) or view.find(_LONG_NUMBER) < 0):
        return value
    # orjson turns integers beyond 64 bits into floats and reads 1e-400 as 0.0: read the
    # numbers again from their text (the stdlib scanner hands each token to a hook).
    return json.loads(
        raw,
        parse_int=_exact_int,
        parse_float=_exact_float,
        parse_constant=_refuse_constant,
    )


# A member of a plain object may itself be an object or array of at most this many scalars.
_PLAIN_INNER = 16


def _plain(value: Any) -> bool:
    """True when ``value`` (orjson's reading of a text) is an object whose members are
    strings, booleans, nulls, integers within ±2^53, or objects and arrays of at most
    :data:`_PLAIN_INNER` such scalars: most client frames (a publish of text or of a small
    object). Such a value holds no number orjson may have read other than as written (an
    integer it returns is exact; a float is not looked at here) and nests two levels, so
    the passes over its text can be skipped."""
    if type(value) is not dict:
        return False
    for item in value.values():
        kind = type(item)
        if kind is str or kind is bool or item is None:
            continue
        if kind is int:
            if -MAX_EXACT_INTEGER <= item <= MAX_EXACT_INTEGER:
                continue
            return False
        if kind is dict or kind is list:
            if len(item) > _PLAIN_INNER:
                return False
            for inner in item.values() if kind is dict else item:
                inner_kind = type(inner)
                if inner_kind is str or inner_kind is bool or inner is None:
                    continue
                if inner_kind is int and -MAX_EXACT_INTEGER <= inner <= MAX_EXACT_INTEGER:
                    continue
                return False
            continue
        return False
    return True


def _check_depth(value: Any) -> None:
    """Refuse nesting deeper than :data:`MAX_DEPTH` (containers only, without recursion)."""
    if type(value) is not dict and type(value) is not list:
        return  # the brackets were inside a string
    stack = [(value, 1)]
    while stack:
        container, depth = stack.pop()
        items = container.values() if type(container) is dict else container
        for item in items:
            if type(item) is dict or type(item) is list:
                if depth == MAX_DEPTH:
                    raise NotCanonical(f"nesting deeper than {MAX_DEPTH}")
                stack.append((item, depth + 1))


def check_representable(value: Any, *, carrier_bytes: bool = False) -> None:
    """Refuse a decoded value (CBOR, or JSON parsed elsewhere) that :func:`canonicalize`
    cannot represent exactly (spec §1.3, §2.5). Types are matched exactly: a CBOR tag
    decoded into a ``datetime``, ``UUID``, ``Decimal``, ``set`` or ``CBORTag`` is refused.

    Args:
        carrier_bytes: allow byte strings (peer-link frames carry signed JSON as bytes;
            spec §3.8: never inside a signed object).

    Raises:
        NotCanonical: the first offending value found.
    """
    _check(value, MAX_DEPTH, carrier_bytes)


def _check_text(text: str) -> None:
    # orjson and cbor2 refuse text that is not UTF-8, but json.loads and Python callers
    # hand over lone surrogates ("\ud800"), which JCS cannot encode. (Callers skip
    # ASCII text, the common case, without the call.)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise NotCanonical("strings must be valid Unicode (no lone surrogates)") from exc


def _check(value: Any, depth: int, carrier_bytes: bool) -> None:
    t = type(value)
    if t is str:
        if not value.isascii():
            _check_text(value)
        return
    if t is bool or value is None:
        return
    if t is int:
        if not -MAX_EXACT_INTEGER <= value <= MAX_EXACT_INTEGER:
            raise NotCanonical("integers must be within ±2^53; send a larger one as a string")
        return
    if t is float:
        _check_float(value)
        return
    if t is dict or t is list:
        if depth == 0:
            raise NotCanonical(f"nesting deeper than {MAX_DEPTH}")
        if t is dict:
            for key, item in value.items():
                if type(key) is not str:
                    raise NotCanonical("object keys must be strings")
                if not key.isascii():
                    _check_text(key)
                _check(item, depth - 1, carrier_bytes)
        else:
            for item in value:
                _check(item, depth - 1, carrier_bytes)
        return
    if t is bytes and carrier_bytes:
        return
    raise NotCanonical(f"{t.__name__} has no JSON form (a CBOR tag, bytes or undefined?)")
