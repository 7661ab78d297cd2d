"""Route batches (spec §8, §11; mesh/route_batch.py): many route frames in one message,
split by their headers alone, merged by a link's writer, passed on by a relay."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hearthnet.errors import BadRequest
from hearthnet.identity import KeyPair
from hearthnet.mesh.relay_frames import Route
from hearthnet.mesh.route_batch import (
    BATCH_HEADER_BYTES,
    batch_frames,
    batch_runs,
    encode_batch,
    is_batch,
    is_route_message,
    join_routes,
    joined_runs,
    pack_routes,
    passed_on_runs,
    single_runs,
    split_batch,
)
from hearthnet.mesh.route_header import encode_route, read_header

NODES = [KeyPair.from_seed(bytes([i]) * 32).node_id for i in range(1, 4)]

routes = st.builds(
    Route,
    to=st.sampled_from(NODES),
    from_=st.sampled_from(NODES),
    ttl_hops=st.integers(1, 16),
    id=st.integers(0, 2**53 - 1),
    inner=st.binary(max_size=300),
    control=st.booleans(),
)
frames = routes.map(encode_route)
# what a link's writer drains: route frames, route batches, and CBOR frames (a map's
# first byte is 0xa0..0xbf), in any order
messages = st.one_of(
    frames,
    st.lists(frames, min_size=1, max_size=4).map(encode_batch),
    st.binary(min_size=1, max_size=40).map(lambda b: b"\xa1" + b),
)


def flat(items: list[bytes]) -> list[bytes]:
    """Each route batch replaced by its frames, everything else as it is."""
    out: list[bytes] = []
    for data in items:
        out += split_batch(data) if is_batch(data) else [data]
    return out


@settings(max_examples=30, deadline=None)
@given(st.lists(frames, min_size=1, max_size=12))
def test_a_batch_splits_into_its_frames_with_their_headers(batch: list[bytes]) -> None:
    """Split by headers alone, a batch gives back each frame byte for byte, and each
    header is what the frame alone reads as."""
    data = encode_batch(batch)
    spans = batch_frames(data)
    assert (batch, [read_header(f) for f in batch]) == (
        split_batch(data),
        [head for head, _, _ in spans],
    )


@settings(max_examples=30, deadline=None)
@given(st.lists(messages, max_size=16), st.integers(100, 2000))
def test_packing_keeps_every_frame_once_in_order(items: list[bytes], limit: int) -> None:
    """The writer's packing merges runs of route messages into batches under the limit
    (a larger frame alone) and keeps every frame, once, in order, CBOR frames in place."""
    packed, saved = pack_routes(items, limit)
    oversized = [  # a merged batch over the limit (one message over it goes as it came)
        p for p in packed if len(p) - BATCH_HEADER_BYTES > limit and p not in items
    ]
    adjacent = [
        i for i in range(len(packed) - 1) if all(is_route_message(p) for p in packed[i : i + 2])
    ]
    merged_small = [i for i in adjacent if len(packed[i]) + len(packed[i + 1]) <= limit]
    assert (flat(items), len(items) - len(packed), [], []) == (
        flat(packed),
        saved,
        oversized,
        merged_small,
    )


# what one socket read of a relay holds: route frames and route batches
route_messages = st.one_of(frames, st.lists(frames, min_size=1, max_size=6).map(encode_batch))


@settings(max_examples=60, deadline=None)
@given(st.lists(route_messages, min_size=1, max_size=24), st.integers(400, 4000))
def test_route_messages_joined_split_into_the_same_frames(items: list[bytes], limit: int) -> None:
    """Route frames and batches of one read joined into batches of at most ``limit`` bytes
    of frames (a larger message alone) split into exactly their frames, in order, and
    count the messages joined."""
    joined = join_routes(items, limit)
    assert joined is not None
    expected = [f for item in items for f in (split_batch(item) if is_batch(item) else [item])]
    assert all(joined_runs(j) for j in joined)  # each reads as the relay's reader reads it
    split = [frame for j in joined for frame in split_batch(j.data)]
    over = [j for j in joined if len(j.data) - BATCH_HEADER_BYTES > limit and j.messages > 1]
    assert (expected, len(items), []) == (split, sum(j.messages for j in joined), over)


def test_messages_that_would_not_split_back_are_not_taken_together() -> None:
    """A message that is not a route frame or batch is not joined; joined messages that
    would not split back into their own frames (a length field that is not the frame's
    length, two frames in one single message, a batch whose last frame runs into the next
    message, a message cut short) are refused together (each is then taken alone)."""
    good = encode_route(Route(NODES[0], NODES[1], 4, 1, b"x" * 10))
    short_length = good[:77] + (9).to_bytes(4, "big") + good[81:]
    # the batch's frame holds no inner but claims the next message as its inner: joined,
    # every frame would be well formed
    spilling = encode_batch([good])[:-10]
    spilling = spilling[:81] + len(good).to_bytes(4, "big") + spilling[85:]
    cases = [
        [good, b"H\x01\x07\x00" + good[4:]],
        [good, short_length],
        [good, good + encode_route(Route(NODES[0], NODES[1], 4, 2, b""))],
        [spilling, good, good],
        [good, good[:40]],
    ]
    outcomes = []
    for case in cases:
        joined = join_routes(case)
        if joined is None:
            outcomes.append("not joined")
            continue
        with pytest.raises(BadRequest):
            joined_runs(joined[0])  # one batch: each case is far under the limit
        outcomes.append("refused")
    assert ["not joined"] + ["refused"] * 4 == outcomes


@settings(max_examples=60, deadline=None)
@given(st.lists(frames, min_size=1, max_size=24), st.integers(400, 8000))
def test_single_frames_of_a_read_read_at_once_as_joined_and_read_by_runs(
    items: list[bytes], limit: int
) -> None:
    """Route frames of one read, each its own message, read at once (``single_runs``) give
    the batch and runs that joining them and reading the joined batch gives; over
    ``limit`` bytes of frames they are left to the join."""
    joined = join_routes(items, limit)
    assert joined is not None
    fast = single_runs(items, limit)
    if len(joined) > 1:
        assert fast is None
    else:
        assert fast == (joined[0].data, joined_runs(joined[0]))


def test_single_frames_that_do_not_read_alone_are_left_to_the_join() -> None:
    """A message that is not one whole route frame (a batch, a length field that is not
    its own length, a frame cut short, two frames in one message, a field out of range,
    a CBOR frame) is not read by ``single_runs``: the read goes the way of any other,
    where each such message is refused or taken alone."""
    good = encode_route(Route(NODES[0], NODES[1], 4, 1, b"x" * 10))
    other = encode_route(Route(NODES[1], NODES[0], 4, 2, b"y" * 3))
    short_length = good[:77] + (9).to_bytes(4, "big") + good[81:]
    cases = [
        [good, encode_batch([other])],
        [good, short_length],
        [good, good[:40]],
        [good, good + other],
        [good, other[:4] + bytes([17]) + other[5:]],  # ttl_hops over the limit
        [good, other[:3] + bytes([2]) + other[4:]],  # unknown flags
        [good, b"\xa1" + good[1:]],
    ]
    assert [None] * len(cases) == [single_runs(case) for case in cases]
    assert single_runs([good, other]) is not None


def test_a_malformed_batch_is_refused_whole() -> None:
    """A batch with no frame, cut inside a frame, holding a batch, or a frame out of range
    is refused: nothing of it is taken."""
    good = encode_route(Route(NODES[0], NODES[1], 4, 1, b"x" * 10))
    bad_ttl = good[:4] + bytes([17]) + good[5:]
    cases = [
        encode_batch([good])[:BATCH_HEADER_BYTES],
        encode_batch([good, good])[:-1],
        encode_batch([good]) + good[:40],
        encode_batch([good, encode_batch([good])]),
        encode_batch([good, bad_ttl]),
    ]
    refused = []
    for case in cases:
        for read in (batch_frames, batch_runs):
            with pytest.raises(BadRequest):
                read(case)
            refused.append(True)
    assert [True] * 2 * len(cases) == refused


# frames mostly between the same two nodes with the same ttl, so runs form
run_routes = st.builds(
    Route,
    to=st.sampled_from(NODES[:2]),
    from_=st.just(NODES[2]),
    ttl_hops=st.sampled_from([1, 4]),
    id=st.integers(0, 2**53 - 1),
    inner=st.binary(max_size=300),
    control=st.sampled_from([False, False, True]),
).map(encode_route)


@settings(max_examples=40, deadline=None)
@given(st.lists(run_routes, min_size=1, max_size=16))
def test_runs_hold_the_frames_batch_frames_reads_grouped_by_pair_and_ttl(
    batch: list[bytes],
) -> None:
    """A batch's runs give back its frames with their headers and spans, in order; each
    run is the longest stretch of frames with the same to, from, control and ttl_hops."""
    data = encode_batch(batch)
    runs = batch_runs(data)
    keys = [(r.to, r.from_, r.control, r.ttl_hops) for r in runs]
    merged = [i for i in range(len(keys) - 1) if keys[i] == keys[i + 1]]
    sizes = [(r.size, r.last) for r in runs]
    spans = [r.spans() for r in runs]
    expected_sizes = [(sum(h.size for h, _, _ in group), group[-1][0].size) for group in spans]
    assert (batch_frames(data), [], expected_sizes) == (
        [span for group in spans for span in group],
        merged,
        sizes,
    )


@settings(max_examples=40, deadline=None)
@given(st.lists(run_routes, min_size=1, max_size=12), st.data())
def test_a_relay_passes_on_runs_and_frames_of_runs_with_each_ttl_one_less(
    batch: list[bytes], data: st.DataObject
) -> None:
    """What a relay writes for whole runs and some frames of others is those frames in
    order, each with ttl_hops one less and every other byte as received."""
    raw = encode_batch(batch)
    runs = batch_runs(raw)
    picks: list[tuple[object, list[int] | None]] = []
    for run in runs:
        how = data.draw(st.sampled_from(["whole", "some", "none"]))
        if how == "whole":
            picks.append((run, None))
        elif how == "some":
            keep = data.draw(st.lists(st.booleans(), min_size=len(run.ids), max_size=len(run.ids)))
            chosen = [i for i, k in enumerate(keep) if k]
            if chosen:
                picks.append((run, chosen))
    if not picks:
        picks = [(runs[0], None)]
    whole = len(picks) == len(runs) and all(c is None for _, c in picks)
    out = passed_on_runs(raw, picks, whole=whole)  # type: ignore[arg-type]
    expected = [
        raw[start : start + 4] + bytes([head.ttl_hops - 1]) + raw[start + 5 : end]
        for run, chosen in picks
        for i, (head, start, end) in enumerate(run.spans())  # type: ignore[attr-defined]
        if chosen is None or i in chosen
    ]
    assert expected == (split_batch(out) if is_batch(out) else [out])
