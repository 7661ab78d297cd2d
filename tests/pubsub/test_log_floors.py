"""Each origin's gossip floor across restarts, on real SQLite: "nothing below it to be
had here" must mean retention removed it, not that it never came (spec §7.3)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from hearthnet.identity import KeyPair
from hearthnet.pubsub.envelope import Message
from hearthnet.pubsub.log import MessageLog

from .test_log import PEER, opened

OTHER = KeyPair.from_seed(b"\x52" * 32)


async def ingest(log: MessageLog, origin: KeyPair, seqs: list[int]) -> list[int]:
    """Ingest ``origin``'s messages with these origin_seqs, one commit each; their seqs."""
    out = []
    for n in seqs:
        msg = Message.create(origin, topic="chat.a", msg_type="m", data=n, origin_seq=n, ts=n)
        stored = await log.ingest(msg, source=origin.node_id)
        assert stored is not None
        out.append(stored.seq)
    return out


def start_of(heads: list[tuple[str, int, int, list[int]]], origin: KeyPair) -> tuple[int, ...]:
    """``(floor, head, *above)`` of one origin in ``origin_heads``."""
    ((floor, head, above),) = [(f, h, a) for o, f, h, a in heads if o == origin.node_id]
    return (floor, head, *above)


async def test_a_hole_never_filled_is_not_a_floor_after_a_restart(tmp_path: Path) -> None:
    """The log holds an origin's 2..5 (1 never came): reopened, the floor is 1 and the head
    0 (2..5 above it), not floor 2 head 5, which a peer that missed 1 would skip it on."""
    async with opened(tmp_path / "log.db") as log:
        await ingest(log, PEER, [2, 3, 4, 5])
        live = start_of(await log.reader.origin_heads(), PEER)
    async with opened(tmp_path / "log.db") as log:
        again = start_of(await log.reader.origin_heads(), PEER)
    assert ((1, 0, 2, 3, 4, 5), (1, 0, 2, 3, 4, 5)) == (live, again)


@pytest.mark.parametrize("prefix", [True, False])
async def test_the_floor_retention_set_survives_a_reopen(tmp_path: Path, prefix: bool) -> None:
    """Retention removes 1..3 of an origin's 1..5 (as a prefix of the log, or message by
    message): the floor is 4 at once and after reopening; another origin's 2..3, nothing
    removed, stays at floor 1."""
    async with opened(tmp_path / "log.db") as log:
        seqs = await ingest(log, PEER, [1, 2, 3])
        await ingest(log, PEER, [4, 5])
        await ingest(log, OTHER, [2, 3])
        if prefix:
            assert 3 == await log.delete(before_seq=seqs[-1] + 1)
        else:
            assert 3 == await log.delete(seqs)
        live = await log.reader.origin_heads()
    async with opened(tmp_path / "log.db") as log:
        again = await log.reader.origin_heads()
    assert [(4, 5), (1, 0, 2, 3)] * 2 == [
        start_of(live, PEER),
        start_of(live, OTHER),
        start_of(again, PEER),
        start_of(again, OTHER),
    ]


async def test_an_origin_removed_whole_starts_past_it_after_a_reopen(tmp_path: Path) -> None:
    """Retention removed all of an origin's 1..3: reopened, the node starts at head 3
    (it does not ask its peers for them again), floor 4."""
    async with opened(tmp_path / "log.db") as log:
        seqs = await ingest(log, PEER, [1, 2, 3])
        await log.publish(topic="chat.a", msg_type="m", data=0)
        assert 3 == await log.delete(seqs)
    async with opened(tmp_path / "log.db") as log:
        assert (4, 3) == start_of(await log.reader.origin_heads(), PEER)


async def test_a_log_from_before_the_floors_keeps_its_floors(tmp_path: Path) -> None:
    """A log written before ``origin_floors`` existed opens with each origin's lowest
    held as its floor (what it meant then), once: a message below it that comes later
    is held and lowers the floor, and stays down after another reopen."""
    async with opened(tmp_path / "log.db") as log:
        await ingest(log, PEER, [3, 4, 5])
    with contextlib.closing(sqlite3.connect(tmp_path / "log.db")) as conn:
        conn.execute("DROP TABLE origin_floors")
        conn.execute("DELETE FROM meta WHERE key = 'origin_floors'")
        conn.commit()
    async with opened(tmp_path / "log.db") as log:
        migrated = start_of(await log.reader.origin_heads(), PEER)
        await ingest(log, PEER, [1])
    async with opened(tmp_path / "log.db") as log:
        again = start_of(await log.reader.origin_heads(), PEER)
    assert ((3, 5), (1, 5)) == (migrated, again)


async def test_a_hole_skipped_on_a_peers_floor_stays_skipped_after_a_reopen(
    tmp_path: Path,
) -> None:
    """Gossip skipped an origin's 1..49 on a peer's floor 50 (retention removed them on the
    mesh) and the log holds 50..52: reopened, it starts at floor 50, head 52, not at head
    0 with everything it holds above a hole."""
    async with opened(tmp_path / "log.db") as log:
        await ingest(log, PEER, [50, 51, 52])
        assert 0 == await log.delete(elsewhere={PEER.node_id: 49})
    async with opened(tmp_path / "log.db") as log:
        assert (50, 52) == start_of(await log.reader.origin_heads(), PEER)
