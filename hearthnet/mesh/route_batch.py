"""Route batches: many binary ``route`` frames in one WebSocket message (spec §8, §11;
peer links of ``hearthnet-peer.v4``). Pure.

A relay's cost per forwarded frame is mostly what it pays per WebSocket message: the
read's wake-up, splitting and unmasking the message, handing it to the relay, framing
it again for the write. On a v4 link a sender's writer puts the route frames queued since
its last wake-up into one message (:func:`pack_routes`), the relay reads the headers of
the frames in it as runs of frames between the same two nodes (:func:`batch_runs`),
decides each frame as it would alone (a run at once where it can), and writes what goes
to one link as one message again (:func:`passed_on_runs`), so the cost per message is
paid once for many frames. Layout::

    offset  size  field
    0       1     0x48 ("H"): a binary peer-link frame
    1       1     layout version: 1
    2       1     kind: 2 = route batch
    3       1     flags: 0
    4       ...   route frames back to back, each a whole binary route frame
                  (:mod:`hearthnet.mesh.route_header`: its 81-byte header, whose length
                  field says where the frame ends, then its end-to-end frame)

A batch holds at least one frame and ends exactly where its last frame ends. The frames
are the ones a sender would have sent alone, byte for byte (a relay lowers each one's
``ttl_hops``): nothing in the batch is signed or sealed as a whole, and a relay cannot
make a receiver accept any frame it could not already make it accept alone.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import NamedTuple

from hearthnet.errors import BadRequest, PayloadTooLarge
from hearthnet.mesh.frame_fields import MAX_FRAME_BYTES, MAX_ID, MAX_INNER_BYTES
from hearthnet.mesh.relay_frames import MAX_TTL_HOPS
from hearthnet.mesh.route_header import (
    FLAG_CONTROL,
    HEADER,
    HEADER_BYTES,
    KIND_ROUTE,
    LAYOUT,
    NODE_IDS,
    PREFIX,
    TAG,
    TTL_AT,
    RouteHeader,
    node_of,
)

KIND_BATCH = 2
BATCH_PREFIX = bytes((TAG, LAYOUT, KIND_BATCH, 0))
BATCH_HEADER_BYTES = len(BATCH_PREFIX)
# What a sender puts in one batch (the writer's own write is about as large); a receiver
# takes any batch within the peer-link message limit (MAX_FRAME_BYTES).
MAX_BATCH_BYTES = 256 * 1024

Span = tuple[RouteHeader, int, int]  # a frame's header, where it starts and where it ends
# HEADER with the prefix, flags and ttl_hops read as one field, and ``to`` and ``from``
# as another: a run of frames is told by two comparisons per frame (batch_runs)
_RUN_HEADER = struct.Struct(">5sQ64sI")
assert _RUN_HEADER.size == HEADER.size


class RouteRun(NamedTuple):
    """Consecutive frames of a route batch with the same ``to``, ``from``, ``control`` and
    ``ttl_hops`` (spec §11): a relay decides them together. The frames lie back to back
    from ``starts[0]`` to ``end``, each ending where the next starts."""

    to: str
    from_: str
    control: bool
    ttl_hops: int
    ids: list[int]  # each frame's id, in order
    starts: list[int]  # where each frame starts in the batch
    end: int  # where the last frame ends
    size: int  # bytes of ``inner`` of all the frames
    last: int  # bytes of ``inner`` of the last frame

    def spans(self) -> list[Span]:
        """Each frame's header and span, as :func:`batch_frames` gives them."""
        to, from_, control, ttl, starts = (
            self.to,
            self.from_,
            self.control,
            self.ttl_hops,
            self.starts,
        )
        ends = [*starts[1:], self.end]
        return [
            (RouteHeader(to, from_, ttl, id_, control, end - start - HEADER_BYTES), start, end)
            for id_, start, end in zip(self.ids, starts, ends, strict=True)
        ]


def is_batch(data: bytes) -> bool:
    """Whether ``data`` (one peer-link message) is a route batch."""
    return data[:4] == BATCH_PREFIX


def encode_batch(frames: Sequence[bytes]) -> bytes:
    """The route batch of binary route ``frames`` (at least one), in order."""
    if not frames:
        raise ValueError("a route batch holds at least one frame")
    return BATCH_PREFIX + b"".join(frames)


def _batch_length(data: bytes) -> int:
    """The length of route batch ``data``, once its size and prefix are checked."""
    total = len(data)
    if total > MAX_FRAME_BYTES:
        raise PayloadTooLarge(f"route batch over {MAX_FRAME_BYTES} bytes")
    if data[:4] != BATCH_PREFIX:
        raise BadRequest("not a route batch of layout 1")
    if total < BATCH_HEADER_BYTES + HEADER_BYTES:
        raise BadRequest("a route batch holds at least one route frame")
    return total


def batch_frames(data: bytes) -> list[Span]:
    """Each frame of route batch ``data``: its header and its span ``(start, end)``.

    Raises:
        PayloadTooLarge: over the peer-link message limit.
        BadRequest: not a route batch, no frame in it, or a frame that is not a binary
            route frame of layout 1 with every field in range (the whole batch is
            refused: nothing of it is taken).
    """
    total = _batch_length(data)
    spans: list[Span] = []
    append = spans.append
    unpack = HEADER.unpack_from
    nodes = NODE_IDS
    start = BATCH_HEADER_BYTES
    while start < total:
        if total - start < HEADER_BYTES:
            raise BadRequest("a route batch ends inside a route frame's header")
        prefix, flags, ttl, id_, to, from_, size = unpack(data, start)
        end = start + HEADER_BYTES + size
        if (
            prefix != PREFIX
            or flags & ~FLAG_CONTROL
            or ttl > MAX_TTL_HOPS
            or id_ > MAX_ID
            or size > MAX_INNER_BYTES
            or end > total
        ):
            raise BadRequest(f"frame {len(spans)} of a route batch is not a valid route frame")
        to_node = nodes.get(to) or node_of(to)
        from_node = nodes.get(from_) or node_of(from_)
        append((RouteHeader(to_node, from_node, ttl, id_, flags == FLAG_CONTROL, size), start, end))
        start = end
    return spans


def batch_runs(data: bytes) -> list[RouteRun]:
    """The frames of route batch ``data`` as runs (:class:`RouteRun`), in order: what
    :func:`batch_frames` reads, with one header unpack per frame and the NodeIDs, the
    lists and the run's sizes built once per run.

    Raises:
        BadRequest / PayloadTooLarge: as :func:`batch_frames` (the whole batch refused).
    """
    total = _batch_length(data)
    runs: list[RouteRun] = []
    unpack = _RUN_HEADER.unpack_from
    start = BATCH_HEADER_BYTES
    lead, pair = b"", b""  # the run's first 5 bytes and its two keys
    ids: list[int] = []
    starts: list[int] = []
    try:
        while start < total:
            h, id_, p, n = unpack(data, start)
            if h == lead and p == pair:  # prefix, flags and ttl_hops checked with the first
                ids.append(id_)
                starts.append(start)
            else:
                if h[:3] != PREFIX or h[3] & ~FLAG_CONTROL or h[4] > MAX_TTL_HOPS:
                    raise BadRequest("a frame of a route batch is not a valid route frame")
                if ids:
                    runs.append(_run(lead, pair, ids, starts, start))
                lead, pair = h, p
                ids, starts = [id_], [start]
            if n > MAX_INNER_BYTES:
                raise BadRequest("a frame of a route batch is not a valid route frame")
            start += HEADER_BYTES + n
    except struct.error as exc:  # fewer bytes left than a header
        raise BadRequest("a route batch ends inside a route frame's header") from exc
    if start != total:
        raise BadRequest("a route batch ends inside a route frame")
    runs.append(_run(lead, pair, ids, starts, total))
    if max(max(run.ids) for run in runs) > MAX_ID:
        raise BadRequest("a frame of a route batch is not a valid route frame")
    return runs


def _run(lead: bytes, pair: bytes, ids: list[int], starts: list[int], end: int) -> RouteRun:
    """The run of frames ``ids`` at ``starts``, ending at ``end``, from its first frame's
    leading 5 bytes and keys."""
    nodes = NODE_IDS
    to, from_ = pair[:32], pair[32:]
    return RouteRun(
        nodes.get(to) or node_of(to),
        nodes.get(from_) or node_of(from_),
        lead[3] == FLAG_CONTROL,
        lead[4],
        ids,
        starts,
        end,
        end - starts[0] - HEADER_BYTES * len(ids),
        end - starts[-1] - HEADER_BYTES,
    )


class Joined(NamedTuple):
    """Route messages of one socket read joined into one route batch (:func:`join_routes`)."""

    data: bytes  # the route batch
    messages: int  # the WebSocket messages it holds the frames of
    # where each message but the first starts in ``data``: a frame must start there for
    # the batch to split into the messages' frames (checked by :func:`joined_runs`)
    cuts: list[int]
    singles: bool  # every message a single route frame: the frames start exactly at cuts


def join_routes(messages: Sequence[bytes], limit: int = MAX_BATCH_BYTES) -> list[Joined] | None:
    """Route ``messages`` (binary route frames and route batches) that one socket read
    held, as route batches of at most ``limit`` bytes of frames each, in order (spec
    §11: a relay decides what one read brought as few batches); a message larger than
    ``limit`` goes alone. None when one of them is neither a route batch nor a route
    frame of layout 1. Each frame's fields, and that every message ends where a frame
    ends, are checked by :func:`joined_runs`, so a message refused alone is never read
    as part of its neighbours."""
    out: list[Joined] = []
    parts: list[bytes | memoryview] = [BATCH_PREFIX]
    cuts: list[int] = []
    size = 0  # bytes of frames in parts
    singles = True
    for data in messages:
        n = len(data)
        if data.startswith(PREFIX):
            part: bytes | memoryview = data
        elif data.startswith(BATCH_PREFIX):
            part = memoryview(data)[BATCH_HEADER_BYTES:]
            n -= BATCH_HEADER_BYTES
        else:
            return None
        if size and size + n > limit:
            out.append(_joined(parts, cuts, singles))
            parts, cuts, size, singles = [BATCH_PREFIX], [], 0, True
        singles = singles and type(part) is bytes
        if size:
            cuts.append(BATCH_HEADER_BYTES + size)
        parts.append(part)
        size += n
    out.append(_joined(parts, cuts, singles))
    return out


def _joined(parts: list[bytes | memoryview], cuts: list[int], singles: bool) -> Joined:
    if len(parts) == 2 and not singles:  # one route batch alone: as it came
        batch = parts[1]
        assert isinstance(batch, memoryview)
        return Joined(bytes(batch.obj), 1, cuts, False)
    return Joined(b"".join(parts), len(parts) - 1, cuts, singles)


def joined_runs(joined: Joined) -> list[RouteRun]:
    """The runs of a :class:`Joined` batch, as :func:`batch_runs` reads them.

    Raises:
        BadRequest / PayloadTooLarge: a frame invalid, or a message joined not ending
            where a frame ends (the whole read is then taken message by message, each
            refused or taken alone).
    """
    runs = batch_runs(joined.data)
    cuts = joined.cuts
    if cuts:
        starts = runs[0].starts if len(runs) == 1 else [s for run in runs for s in run.starts]
        if not (starts[1:] == cuts if joined.singles else set(starts).issuperset(cuts)):
            raise BadRequest("a route message joined does not end where a frame ends")
    return runs


def single_runs(
    messages: Sequence[bytes], limit: int = MAX_BATCH_BYTES
) -> tuple[bytes, list[RouteRun]] | None:
    """Route ``messages`` of one read that are each one whole route frame, as one route
    batch and its runs: what :func:`join_routes` and :func:`joined_runs` give for them,
    read from each message's header alone (spec §11: single frames from a member that
    does not batch, or whose writes were not merged, are most of a relay's reads; each
    header is unpacked once, and the batch is built once, with no second pass over it).

    None, and nothing decided, when a message is not a route frame whose length field
    is its own length, a field is out of range, or the frames come to more than
    ``limit`` bytes: :func:`join_routes` then takes the read as it takes any other.
    """
    unpack = _RUN_HEADER.unpack_from
    runs: list[RouteRun] = []
    lead, pair = b"", b""  # the run's first 5 bytes and its two keys
    ids: list[int] = []
    starts: list[int] = []
    start = BATCH_HEADER_BYTES
    top = 0  # the largest id
    for data in messages:
        n = len(data) - HEADER_BYTES
        if n < 0:
            return None
        h, id_, p, size = unpack(data)
        if size != n or n > MAX_INNER_BYTES:
            return None
        if h != lead or p != pair:
            if h[:3] != PREFIX or h[3] & ~FLAG_CONTROL or h[4] > MAX_TTL_HOPS:
                return None
            if ids:
                runs.append(_run(lead, pair, ids, starts, start))
            lead, pair = h, p
            ids, starts = [], []
        ids.append(id_)
        starts.append(start)
        top = id_ if id_ > top else top
        start += len(data)
    if not ids or top > MAX_ID or start - BATCH_HEADER_BYTES > limit:
        return None
    runs.append(_run(lead, pair, ids, starts, start))
    return b"".join((BATCH_PREFIX, *messages)), runs


def split_batch(data: bytes) -> list[bytes]:
    """The route frames of route batch ``data``, each as its own bytes.

    Raises:
        BadRequest / PayloadTooLarge: see :func:`batch_frames`.
    """
    return [data[start:end] for _, start, end in batch_frames(data)]


def is_route_message(data: bytes) -> bool:
    """Whether ``data`` is a binary route frame or a route batch (what :func:`pack_routes`
    merges)."""
    return len(data) > 2 and data[0] == TAG and data[1] == LAYOUT and data[2] in _ROUTE_KINDS


_ROUTE_KINDS = (KIND_ROUTE, KIND_BATCH)


def pack_routes(messages: list[bytes], limit: int = MAX_BATCH_BYTES) -> tuple[list[bytes], int]:
    """``messages`` (one write's, in order) with each run of consecutive route frames and
    route batches merged into one route batch of at most ``limit`` bytes of frames (a
    frame larger than that goes alone); everything else as it is, in its place. Also
    returns how many messages were saved.

    What a writer of a ``hearthnet-peer.v4`` link sends (spec §11): the route frames
    queued in one loop turn cost the receiver one message.
    """
    out: list[bytes] = []
    run: list[bytes] = []
    size = 0
    saved = 0
    for data in messages:
        if not (len(data) > 2 and data[0] == TAG and data[1] == LAYOUT and data[2] in _ROUTE_KINDS):
            if run:
                saved += _flush(run, out)
                run, size = [], 0
            out.append(data)
            continue
        body = len(data) - (BATCH_HEADER_BYTES if data[2] == KIND_BATCH else 0)
        if run and size + body > limit:
            saved += _flush(run, out)
            run, size = [], 0
        run.append(data)
        size += body
    if run:
        saved += _flush(run, out)
    return out, saved


def _flush(run: list[bytes], out: list[bytes]) -> int:
    if len(run) == 1:
        out.append(run[0])
        return 0
    parts: list[bytes | memoryview] = [BATCH_PREFIX]
    for data in run:
        parts.append(memoryview(data)[BATCH_HEADER_BYTES:] if data[2] == KIND_BATCH else data)
    out.append(b"".join(parts))
    return len(run) - 1


Picks = Sequence[tuple[RouteRun, Sequence[int] | None]]  # runs, each whole (None) or some frames


def passed_on_runs(data: bytes, picks: Picks, *, whole: bool = False) -> bytes:
    """What a relay writes on for the frames ``picks`` of route batch ``data`` (each run
    whole, or the frames at the given indices of it; each frame passed on, so with
    ``ttl_hops`` at least 1): one route frame alone, else a route batch of them in order,
    each with ``ttl_hops`` one less. ``whole``: ``picks`` are every frame of ``data``."""
    if whole:
        out = bytearray(data)  # one copy, patched in place
        for run, _ in picks:
            ttl = run.ttl_hops - 1
            for start in run.starts:
                out[start + TTL_AT] = ttl
        return bytes(out)
    view = memoryview(data)
    out = bytearray(BATCH_PREFIX)
    count = 0
    for run, chosen in picks:
        ttl, starts = run.ttl_hops - 1, run.starts
        if chosen is None:
            shift = len(out) - starts[0]
            out += view[starts[0] : run.end]
            for start in starts:
                out[shift + start + TTL_AT] = ttl
            count += len(starts)
            continue
        for i in chosen:
            start = starts[i]
            shift = len(out) - start
            out += view[start : starts[i + 1] if i + 1 < len(starts) else run.end]
            out[shift + start + TTL_AT] = ttl
            count += 1
    if count == 1:
        return bytes(out[BATCH_HEADER_BYTES:])
    return bytes(out)
