"""NodeIDs, short ids, signature strings and ULIDs (spec §1.1)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hearthnet.errors import BadRequest
from hearthnet.identity import KeyPair
from hearthnet.ids import (
    UlidGenerator,
    b64url_decode,
    b64url_encode,
    encode_ulid,
    is_node_id,
    is_ulid,
    public_key_from_node_id,
    short_id,
    ulid_time_ms,
)


def test_node_id_format() -> None:
    """A NodeID is 'ed25519:' plus 43 base64url characters of the public key."""
    keys = KeyPair.from_seed(bytes(32))
    assert (8 + 43, True) == (len(keys.node_id), keys.node_id.startswith("ed25519:"))
    assert 32 == len(public_key_from_node_id(keys.node_id))


def test_short_id_is_grouped_base32_of_ten_bytes() -> None:
    """The short id is XXXX-XXXX-XXXX-XXXX from the first 10 key bytes."""
    sid = short_id(KeyPair.from_seed(bytes(32)).node_id)
    groups = sid.split("-")
    assert ([4, 4, 4, 4], True) == ([len(g) for g in groups], sid.replace("-", "").isalnum())


@pytest.mark.parametrize(
    "bad", ["", "ed25519:", "ed25519:abc", "rsa:" + "A" * 43, "ed25519:" + "!" * 43, 42]
)
def test_malformed_node_ids_refused(bad: object) -> None:
    """Anything but a well-formed NodeID is refused."""
    assert not is_node_id(bad)
    if isinstance(bad, str):
        with pytest.raises(BadRequest):
            public_key_from_node_id(bad)


@given(st.binary(max_size=100))
def test_b64url_round_trip(raw: bytes) -> None:
    """base64url without padding round-trips."""
    assert raw == b64url_decode(b64url_encode(raw))


def test_ulids_are_monotonic_within_a_millisecond() -> None:
    """ULIDs made in the same millisecond still sort in creation order."""
    gen = UlidGenerator()
    ids = [gen.new(1_763_800_000_000) for _ in range(1000)]
    assert (ids, True, 1_763_800_000_000) == (
        sorted(ids),
        all(is_ulid(i) for i in ids),
        ulid_time_ms(ids[0]),
    )


def test_ulids_made_at_once_are_those_made_one_by_one() -> None:
    """``many`` gives one ULID per time, each of its time (or the last one's when the
    clock went back), in order, and ids made after them sort after them."""
    gen = UlidGenerator()
    times = [1_763_800_000_005, 1_763_800_000_005, 1_763_800_000_004, 1_763_800_000_007]
    ids = [gen.new(1_763_800_000_001), *gen.many(times), gen.new(1_763_800_000_007)]
    assert (ids, 6, [5, 5, 5, 7]) == (
        sorted(ids),
        len(set(ids)),
        [ulid_time_ms(i) - 1_763_800_000_000 for i in ids[1:5]],
    )


def test_ulids_of_one_millisecond_made_at_once_count_up_by_one() -> None:
    """``many`` of one millisecond continues the last id's random part and counts up by
    one across prefix changes (every 1,024 ids), as ids made one by one do."""
    gen = UlidGenerator()
    first = gen.new(1_000)
    ids = [*gen.many([1_000] * 2_500), *gen.many([999] * 3), gen.new(1_000)]
    bits = [random_bits(i) for i in ids]
    assert (list(range(random_bits(first) + 1, random_bits(first) + 2_505)), {1_000}) == (
        bits,
        {ulid_time_ms(i) for i in ids},
    )


@given(st.integers(0, 2**48 - 1), st.integers(0, 2**80 - 1))
def test_ulid_encoding_is_crockford_base32_of_the_130_bits(ms: int, rand: int) -> None:
    """Each of the 26 characters is 5 bits of ``ms << 80 | rand``, most significant first,
    in Crockford's alphabet."""
    value = (ms << 80) | rand
    expected = "".join(
        "0123456789ABCDEFGHJKMNPQRSTVWXYZ"[(value >> (5 * i)) & 31] for i in range(25, -1, -1)
    )
    assert (expected, ms) == (encode_ulid(ms, rand), ulid_time_ms(encode_ulid(ms, rand)))


def test_ulid_encoding_of_known_values() -> None:
    """Edges: all zero, all ones, and the ULID spec's encodeTime example (1469918176385)."""
    assert ["0" * 26, "7" + "Z" * 25, "01ARYZ6S41" + "0" * 16] == [
        encode_ulid(0, 0),
        encode_ulid(2**48 - 1, 2**80 - 1),
        encode_ulid(1469918176385, 0),
    ]


def test_ulids_sort_by_time() -> None:
    """A later millisecond gives a larger ULID."""
    gen = UlidGenerator()
    assert gen.new(1000) < gen.new(1001) < gen.new(5000)


def test_ulids_keep_the_right_time_across_milliseconds_and_a_clock_going_back() -> None:
    """Each id carries the millisecond it was made in; a clock that goes back keeps the last
    millisecond; within one millisecond the random part counts up by one."""
    gen = UlidGenerator()
    ids = [gen.new(ms) for ms in (1000, 1000, 999, 1001, 1001)]
    first, later = random_bits(ids[0]), random_bits(ids[3])
    assert [
        encode_ulid(1000, first + 1),
        encode_ulid(1000, first + 2),
        encode_ulid(1001, later + 1),
    ] == [ids[1], ids[2], ids[4]]
    assert [1000, 1000, 1000, 1001, 1001] == [ulid_time_ms(i) for i in ids]


def random_bits(ulid: str) -> int:
    """The 80 random bits of a ULID."""
    value = 0
    for ch in ulid[10:]:
        value = (value << 5) | "0123456789ABCDEFGHJKMNPQRSTVWXYZ".index(ch)
    return value


def test_ulids_of_one_millisecond_are_encoded_exactly_across_carries() -> None:
    """Ids counting up past low-bit carries equal encode_ulid of the same time and bits."""
    gen = UlidGenerator()
    gen.new(9)
    gen._last_rand = (1 << 20) - 3  # two carries within the next ids
    got = [(gen.new(9), gen._last_rand) for _ in range(2000)]
    assert [encode_ulid(9, rand) for _, rand in got] == [ulid for ulid, _ in got]
