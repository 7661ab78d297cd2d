"""RFC 8785 canonical JSON: the RFC's own examples, our committed vectors, properties."""

from __future__ import annotations

import datetime
import json
import math
import struct
from decimal import Decimal
from pathlib import Path
from typing import Any

import cbor2
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hearthnet.canonical import (
    MAX_DEPTH,
    MAX_SAFE_INTEGER,
    canonicalize,
    canonicalize_exact,
    check_representable,
    format_number,
    parse_json,
)
from hearthnet.errors import BadRequest, NotCanonical
from hearthnet.identity import KeyPair, verify_bytes
from hearthnet.ids import public_key_from_node_id, signature_from_str

VECTORS = Path(__file__).parent / "vectors"
RFC = json.loads((VECTORS / "jcs_rfc8785.json").read_text(encoding="utf-8"))
SIGNED = json.loads((VECTORS / "signatures.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", RFC["objects"], ids=["rfc-3.2.2", "rfc-3.2.3-sorting"])
def test_rfc8785_objects(case: dict[str, str]) -> None:
    """The RFC's example objects canonicalise to the RFC's bytes."""
    assert bytes.fromhex(case["canonical_hex"]) == canonicalize(json.loads(case["input_json"]))


@pytest.mark.parametrize(("bits", "expected"), RFC["numbers"])
def test_rfc8785_numbers(bits: str, expected: str) -> None:
    """IEEE-754 doubles format exactly as ECMAScript (RFC 8785 Appendix B)."""
    assert expected == format_number(struct.unpack(">d", bytes.fromhex(bits))[0])


@pytest.mark.parametrize("case", SIGNED["vectors"], ids=lambda c: c["canonical_hex"][:16])
def test_committed_signature_vectors(case: dict[str, Any]) -> None:
    """Our committed vectors: object -> canonical bytes -> deterministic ed25519 signature."""
    keys = KeyPair.from_seed(bytes.fromhex(case["seed_hex"]))
    canonical = canonicalize(case["object"])
    assert (case["node_id"], case["canonical_hex"], case["signature"]) == (
        keys.node_id,
        canonical.hex(),
        keys.sign_bytes(canonical),
    )
    verify_bytes(case["node_id"], canonical, case["signature"])


@pytest.mark.parametrize("case", RFC["ed25519_rfc8032"], ids=["rfc8032-1", "rfc8032-2"])
def test_rfc8032_ed25519(case: dict[str, str]) -> None:
    """Our key pairs reproduce RFC 8032's ed25519 test vectors."""
    keys = KeyPair.from_seed(bytes.fromhex(case["seed_hex"]))
    sig = keys.sign_bytes(bytes.fromhex(case["message_hex"]))
    assert (case["public_hex"], case["signature_hex"]) == (
        public_key_from_node_id(keys.node_id).hex(),
        signature_from_str(sig).hex(),
    )


def test_rejects_what_jcs_cannot_represent() -> None:
    """NaN, infinities, unsafe integers, lone surrogates and non-JSON types are refused."""
    for bad in (
        math.nan,
        math.inf,
        -math.inf,
        2**53 + 1,
        -(2**53) - 1,
        1e17,
        -(2.0**60),
        "\ud800",
        {1: 2},
        {b"x": 1},
        object(),
    ):
        with pytest.raises(BadRequest):
            canonicalize(bad)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-MAX_SAFE_INTEGER, max_value=MAX_SAFE_INTEGER)
    | st.floats(allow_nan=False, allow_infinity=False).filter(
        lambda f: not (f.is_integer() and 2**53 < abs(f) < 1e21)
    )
    | st.text(),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(), children, max_size=5)
    ),
    max_leaves=30,
)


@given(json_values)
def test_canonical_form_parses_back_to_an_equal_value(value: Any) -> None:
    """Canonical bytes are valid JSON that parses back to the same value (as IEEE doubles,
    which is how JCS reads every number)."""
    assert json.loads(canonicalize(value), parse_int=float) == json.loads(
        json.dumps(value), parse_int=float
    )


@given(json_values)
def test_canonicalisation_is_idempotent(value: Any) -> None:
    """Canonicalising the parsed canonical form gives the same bytes."""
    once = canonicalize(value)
    assert once == canonicalize(json.loads(once))


@given(json_values)
def test_fast_path_gives_the_reference_bytes(value: Any) -> None:
    """The orjson path and the reference serializer agree byte for byte on every value."""
    assert canonicalize_exact(value) == canonicalize(value)


plain_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53), max_value=2**53)
    | st.text(alphabet=st.characters(max_codepoint=0x10FFFF, exclude_categories=["Cs"])),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(st.text(st.characters(max_codepoint=127)), children, max_size=5)
    ),
    max_leaves=30,
)


@given(plain_values)
def test_fast_path_on_values_it_takes(value: Any) -> None:
    """Float-free values with ASCII keys (what the fast path encodes) match the reference."""
    assert canonicalize_exact(value) == canonicalize(value)


@given(st.dictionaries(st.text(), st.integers(0, 10), min_size=2, max_size=8))
def test_keys_sorted_by_utf16_code_units(obj: dict[str, int]) -> None:
    """Object members appear in UTF-16 code-unit order of their keys."""
    parsed = json.loads(canonicalize(obj), object_pairs_hook=lambda pairs: [k for k, _ in pairs])
    assert sorted(obj, key=lambda k: k.encode("utf-16-be")) == parsed


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_number_format_round_trips(x: float) -> None:
    """Every finite double's ECMAScript form parses back to the same double."""
    assert x == float(format_number(x)) or (x == 0 and float(format_number(x)) == 0)


# --- the edge check: parse_json and check_representable (spec §2.5) ----------------------

number_tokens = st.from_regex(
    r"-?(0|[1-9][0-9]{0,30})(\.[0-9]{1,25})?([eE][-+]?[0-9]{1,3})?", fullmatch=True
)
json_texts = st.recursive(
    number_tokens | st.sampled_from(["true", "false", "null"]) | st.text().map(json.dumps),
    lambda children: (
        st.lists(children, max_size=4).map(lambda items: "[" + ", ".join(items) + "]")
        | st.dictionaries(st.text(max_size=5), children, max_size=4).map(
            lambda members: "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in members.items()) + "}"
        )
    ),
    max_leaves=20,
)


def as_decimals(text: str | bytes) -> Any:
    """A JSON text's value with every number exactly as written."""
    return json.loads(text, parse_int=Decimal, parse_float=Decimal)


@given(json_texts)
def test_accepted_json_text_is_signed_as_written(text: str) -> None:
    """Whatever parse_json accepts canonicalizes, and the canonical bytes hold exactly the
    numbers the sender wrote (nothing rounded, nothing turned into a float)."""
    try:
        value = parse_json(text)
    except BadRequest:
        return
    assert as_decimals(text) == as_decimals(canonicalize(value))


@given(json_values)
def test_every_canonical_form_is_accepted_back(value: Any) -> None:
    """What canonicalize writes, parse_json reads back to an equal value (no false refusal)."""
    canonical = canonicalize(value)
    assert json.loads(canonical) == parse_json(canonical)


cbor_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text()
    | st.binary(max_size=4)
    | st.datetimes(timezones=st.just(datetime.UTC))
    | st.uuids()
    | st.decimals(allow_nan=False),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=4) | st.integers(), children, max_size=4)
    ),
    max_leaves=20,
)


@given(cbor_values)
def test_accepted_cbor_value_canonicalizes_and_round_trips(value: Any) -> None:
    """Whatever check_representable accepts from the CBOR decoder canonicalizes, and the
    canonical bytes read back to the same value."""
    decoded = cbor2.loads(cbor2.dumps(value))
    try:
        check_representable(decoded)
    except NotCanonical:
        return
    assert json.loads(json.dumps(decoded)) == json.loads(canonicalize(decoded))


def test_refuses_what_the_decoders_accept_but_jcs_cannot_sign() -> None:
    """JSON text and CBOR items from the hardening review are NotCanonical (bad_request)."""
    texts = [
        "9007199254740993",
        "-9007199254740993",
        "1e20",
        "100000000000000000000000000000",
        "18446744073709551615",
        "1e-400",
        "1E400",
        "0.10000000000000000001",
        "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
        "[" * 1100 + "]" * 1100,
    ]
    items = ["c11a5f000000", "d82550" + "00" * 16, "f97e00", "1bffffffffffffffff", "f7", "a10102"]
    refused = []
    for text in texts:
        with pytest.raises(NotCanonical) as exc:
            parse_json(text)
        refused.append(exc.value.code)
    for item in items:
        with pytest.raises(NotCanonical) as exc:
            check_representable(cbor2.loads(bytes.fromhex(item)))
        refused.append(exc.value.code)
    assert ["bad_request"] * (len(texts) + len(items)) == refused


def test_plain_objects_are_returned_as_read_and_the_rest_still_checked() -> None:
    """An object of strings, small integers and small flat members is returned as orjson
    reads it; a big integer, a float that does not round-trip or a long member in such an
    object still goes through the number checks and is refused."""
    plain = '{"type":"publish","data":{"n":-9007199254740992,"t":[true,null,"x"]},"k":1}'
    refused = []
    for text in (
        '{"a":"x","n":{"b":18446744073709551615}}',
        '{"a":["x",9007199254740993]}',
        '{"a":{"b":1e-400}}',
        '{"a":[' + ",".join(["1"] * 20) + ",1.00000000000000000001]}",
    ):
        with pytest.raises(NotCanonical) as exc:
            parse_json(text)
        refused.append(exc.value.code)
    assert (json.loads(plain), ["bad_request"] * 4) == (parse_json(plain), refused)


def test_nesting_up_to_the_limit_is_accepted() -> None:
    """64 levels pass both checks; bytes pass only as a carrier (peer-link frames)."""
    deep = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    value = parse_json(deep)
    check_representable(value)
    check_representable({"raw": b"{}"}, carrier_bytes=True)
    with pytest.raises(BadRequest) as malformed:
        parse_json("{not json")
    assert (deep.encode(), "malformed JSON") == (
        canonicalize(value),
        malformed.value.message[:14],
    )


def test_strings_that_cannot_be_encoded_are_refused_by_the_edge_check() -> None:
    """Lone surrogates (as json.loads yields them), in a value or a key, are NotCanonical;
    other text, astral characters included, passes."""
    refused = []
    for value in (json.loads('"\\ud800"'), {"k": ["a\udfff"]}, {json.loads('"\\udc00x"'): 1}):
        with pytest.raises(NotCanonical) as exc:
            check_representable(value)
        refused.append(exc.value.code)
    check_representable({"ключ": "\U0001f525 ok", "t": "plain"})
    assert ["bad_request"] * 3 == refused
