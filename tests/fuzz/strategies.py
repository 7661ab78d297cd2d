"""Hypothesis strategies for hostile input: random bytes and text, and structure-aware
values that sit on the edges the spec names (§2.5: integers beyond ±2^53, non-finite
floats, nesting deeper than 64, CBOR tags; §6.1 topics; odd unicode everywhere)."""

from __future__ import annotations

import functools
import math
import re
from typing import Any

import cbor2
from hypothesis import strategies as st

from hearthnet.canonical import canonicalize
from hearthnet.errors import BadRequest

# Text that breaks naive code: controls, the BOM, bidi overrides, noncharacters, astral
# characters (UTF-16 surrogate pairs matter for JCS key order), combining marks.
ODD_CHARS = (
    "\x00\x01\x1f\x7f\u0085\u00a0\u200b\u200e\u202e\u2028\u2029"
    "\ufeff\ufffe\uffff\U0001f600\U0010ffff\u0301"
)
odd_text = st.text(
    alphabet=st.one_of(st.sampled_from(ODD_CHARS), st.characters(codec="utf-8")), max_size=40
)
# A lone surrogate cannot be encoded as UTF-8; JSON can still carry it as an escape.
surrogate_text = st.builds(lambda a, b: a + "\ud800" + b, odd_text, odd_text)

# Integers: safe ones, the ±2^53 boundary, 64-bit edges, 30-digit giants.
EDGE_INTS = [
    0,
    -1,
    2**53 - 1,
    2**53,
    2**53 + 1,
    -(2**53) - 1,
    2**63 - 1,
    2**63,
    2**64 - 1,
    2**64,
    -(2**63) - 1,
    10**30,
    -(10**30),
    123456789012345678901234567890,
]
safe_ints = st.integers(min_value=-(2**53), max_value=2**53)
edge_ints = st.sampled_from(EDGE_INTS)
EDGE_FLOATS = [0.0, -0.0, 1e20, 1e21, 1e-7, 5e-324, 1.7976931348623157e308, 0.1, 2.0**53 + 2]
finite_floats = st.floats(allow_nan=False, allow_infinity=False)


# Strategies are immutable, and building a recursive one (and hypothesis validating it on
# its first draw) costs more than most inputs take to run: the builders below that tests
# call per input make each strategy once.


@functools.cache
def json_values(
    leaves: st.SearchStrategy[Any] | None = None, max_leaves: int = 12
) -> st.SearchStrategy[Any]:
    """Nested JSON values (objects, arrays) over ``leaves``."""
    if leaves is None:
        leaves = st.one_of(st.none(), st.booleans(), safe_ints, finite_floats, odd_text, edge_ints)
    return st.recursive(
        leaves,
        lambda children: st.one_of(
            st.lists(children, max_size=4), st.dictionaries(odd_text, children, max_size=4)
        ),
        max_leaves=max_leaves,
    )


def nested(depth: int, leaf: Any = 1) -> Any:
    """A value nested ``depth`` deep, alternating lists and objects."""
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"d": value}
    return value


deep_values = st.builds(nested, st.integers(min_value=100, max_value=5000))


def representable(value: Any) -> bool:
    """True when JCS (spec §1.3) can sign the value exactly."""
    try:
        canonicalize(value)
    except (BadRequest, RecursionError):
        return False
    return True


def json_text(value: Any) -> bytes:
    """The value as JSON text, even where JSON has no form (NaN, Infinity, giant ints):
    what a hostile or broken client would send. Iterative, so values nested thousands
    deep (see :func:`nested`) encode too."""
    out: list[str] = []
    # a stack of values to encode and of literal text (brackets, commas) to emit
    todo: list[tuple[bool, Any]] = [(False, value)]
    while todo:
        literal, v = todo.pop()
        if literal:
            out.append(v)
        elif isinstance(v, list):
            todo.append((True, "]"))
            for i, x in enumerate(reversed(v)):
                todo.append((False, x))
                if i < len(v) - 1:
                    todo.append((True, ","))
            out.append("[")
        elif isinstance(v, dict):
            todo.append((True, "}"))
            items = list(v.items())
            for i, (k, x) in enumerate(reversed(items)):
                todo.append((False, x))
                todo.append((True, _json_scalar(str(k)) + ":"))
                if i < len(items) - 1:
                    todo.append((True, ","))
            out.append("{")
        else:
            out.append(_json_scalar(v))
    return "".join(out).encode("utf-8", "surrogatepass")


def _json_scalar(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return {True: "true", False: "false", None: "null"}[v]
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "Infinity" if v > 0 else "-Infinity"
        return repr(v)
    if isinstance(v, str):
        out = ['"']
        for ch in v:
            code = ord(ch)
            if ch in '"\\' or code < 0x20 or 0xD800 <= code <= 0xDFFF:
                out.append(f"\\u{code:04x}")
            else:
                out.append(ch)
        out.append('"')
        return "".join(out)
    raise TypeError(type(v))


def json_shaped(value: Any) -> bool:
    """True when the value has a JSON form as it is: string keys, JSON scalars (no bytes,
    tags or non-string keys, which exist only in CBOR)."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, list):
            todo.extend(v)
        elif isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                return False
            todo.extend(v.values())
        elif not (v is None or isinstance(v, bool | int | float | str)):
            return False
    return True


# --- topics (spec §6.1) -----------------------------------------------------------------

TOPIC_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")


def publishable(topic: str) -> bool:
    """A topic spec §6.1 allows a member to publish to: dot-separated segments of
    ``[A-Za-z0-9_-]+``, at most 16 and 255 bytes, outside the nodes' ``mesh.`` prefix."""
    parts = topic.split(".")
    return (
        len(parts) <= 16
        and len(topic.encode()) <= 255
        and all(TOPIC_SEGMENT.fullmatch(p) for p in parts)
        and parts[0] != "mesh"
    )


segment = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)
good_topics = st.lists(segment, min_size=1, max_size=5).map(".".join)
bad_topics = st.one_of(
    odd_text,
    st.just(""),
    st.just("a..b"),
    st.just("a.*"),
    st.just("**"),
    st.just("." * 300),
    st.lists(segment, min_size=17, max_size=20).map(".".join),
    st.just("x" * 300),
    st.just("mesh.beacon"),
    st.just("%2e%2e"),
    st.just("a/b"),
)
topics = st.one_of(good_topics, bad_topics)
patterns = st.one_of(
    good_topics,
    good_topics.map(lambda t: t + ".*"),
    good_topics.map(lambda t: t + ".**"),
    st.just("**"),
    bad_topics,
)

# --- CBOR (spec §3.8) ------------------------------------------------------------------

cbor_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),  # NaN and infinities included
    odd_text,
    st.binary(max_size=16),
    st.builds(cbor2.CBORTag, st.sampled_from([0, 1, 2, 3, 4, 24, 32, 37, 55799, 99999]), odd_text),
    st.builds(cbor2.CBORSimpleValue, st.sampled_from([0, 16, 19, 32, 255])),
    st.builds(cbor2.CBORTag, st.just(2), st.binary(min_size=9, max_size=20)),
)


@functools.cache
def cbor_values(max_leaves: int = 10) -> st.SearchStrategy[Any]:
    """CBOR data: maps with non-string keys, tags, bytes, big ints, NaN."""
    keys = st.one_of(odd_text, st.integers(), st.binary(max_size=4), st.booleans())
    return st.recursive(
        cbor_leaves,
        lambda children: st.one_of(
            st.lists(children, max_size=4),
            st.dictionaries(keys, children, max_size=4),
        ),
        max_leaves=max_leaves,
    )


def cbor_bytes(value: Any) -> bytes:
    """Encode with cbor2, falling back to an indefinite-length map for what it cannot."""
    try:
        return cbor2.dumps(value)
    except (cbor2.CBOREncodeError, TypeError, ValueError):
        return b"\xbf\xff"


def indefinite_map(fields: dict[str, bytes]) -> bytes:
    """An indefinite-length CBOR map (0xbf ... 0xff) of text keys to encoded values."""
    out = bytearray(b"\xbf")
    for key, value in fields.items():
        out += cbor2.dumps(key) + value
    out += b"\xff"
    return bytes(out)


def indefinite_text(text: str) -> bytes:
    """A text string in indefinite-length chunks (0x7f ... 0xff)."""
    out = bytearray(b"\x7f")
    for i in range(0, len(text), 3):
        out += cbor2.dumps(text[i : i + 3])
    return bytes(out + b"\xff")


# --- HTTP ------------------------------------------------------------------------------

header_names = st.sampled_from(
    [
        "X-HearthNet-Capability",
        "X-HearthNet-Capability-Version",
        "X-HearthNet-Request-Id",
        "X-HearthNet-From",
        "X-HearthNet-Community",
        "X-HearthNet-Timestamp",
        "X-HearthNet-Signature",
        "X-HearthNet-Token",
        "X-HearthNet-Target",
        "X-HearthNet-Deadline-Ms",
        "Accept",
        "Content-Type",
        "Content-Encoding",
        "Last-Event-ID",
        "Sec-WebSocket-Protocol",
    ]
)
# Header values an HTTP client can send (visible ASCII and spaces); lone controls are
# refused by the client library, raw-socket tests cover those.
header_values = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60),
    st.sampled_from(
        [
            "",
            "-1",
            "99999999999999999999",
            "1e3",
            "ed25519:",
            "ed25519:" + "A" * 86,
            "ed25519:" + "A" * 43,
            "9999999999999999",
            "hnt1:",
            "hnt1:e30",
            "echo",
            "1.0",
            "9999.9999",
            "text/event-stream",
            "gzip",
        ]
    ),
)
query_values = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=30),
    st.sampled_from(
        ["", "0", "-1", "1" * 30, "1e3", "\u00b2", "--5", "0x10", "NaN", "500", "501", "٣"]
    ),
    st.integers().map(str),
)
