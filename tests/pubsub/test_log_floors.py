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
from hearthnet.pubsub.logindex import OriginHead

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


def start_of(heads: list[OriginHead], origin: KeyPair) -> tuple[int, ...]:
    """``(floor, head, *above)`` of one origin in ``origin_heads``."""
    ((floor, head, above),) = [
        (s.floor, s.head, s.above) for s in heads if s.origin == origin.node_id
    ]
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


def done_of(heads: list[OriginHead], origin: KeyPair) -> list[tuple[int, int]]:
    """The removed runs above the head of one origin in ``origin_heads``."""
    (done,) = [s.done for s in heads if s.origin == origin.node_id]
    return done


@pytest.mark.parametrize("prefix", [True, False])
async def test_retention_around_a_hole_does_not_make_it_a_floor(
    tmp_path: Path, prefix: bool
) -> None:
    """The log holds an origin's 1..4 and 6..10 (5 never came) and retention removes
    1..8 (as a prefix, or message by message): reopened, the floor is 5 and the head 4
    (9..10 above, 6..8 removed above it), not floor 9 head 10 (a peer that missed 5
    would skip it though another holds it). Once 5 comes, the head is 10."""
    async with opened(tmp_path / "log.db") as log:
        seqs = await ingest(log, PEER, [1, 2, 3, 4, 6, 7, 8, 9, 10])
        if prefix:
            assert 7 == await log.delete(before_seq=seqs[7])
        else:
            assert 7 == await log.delete(seqs[:7])
    async with opened(tmp_path / "log.db") as log:
        heads = await log.reader.origin_heads()
        reopened = (start_of(heads, PEER), done_of(heads, PEER))
        await ingest(log, PEER, [5])
    async with opened(tmp_path / "log.db") as log:
        filled = start_of(await log.reader.origin_heads(), PEER)
    assert (((5, 4, 9, 10), [(6, 8)]), (5, 10)) == (reopened, filled)


async def test_a_hole_below_a_scattered_removal_stays_a_hole(tmp_path: Path) -> None:
    """The log misses 5 of 1..10 and retention removes 7 alone: reopened, the head is 4
    (5 is asked for, 7 is not), not 10."""
    async with opened(tmp_path / "log.db") as log:
        seqs = await ingest(log, PEER, [1, 2, 3, 4, 6, 7, 8, 9, 10])
        assert 1 == await log.delete([seqs[5]])
    async with opened(tmp_path / "log.db") as log:
        heads = await log.reader.origin_heads()
    assert ((1, 4, 8, 9, 10), [(6, 7)]) == (start_of(heads, PEER), done_of(heads, PEER))


async def test_a_hole_filled_then_removed_is_no_longer_a_hole(tmp_path: Path) -> None:
    """5 came after retention removed 1..8 around it, and was removed in turn: reopened,
    the floor is 9 and the head 10. A skip on a peer's floor clears holes too."""
    async with opened(tmp_path / "log.db") as log:
        seqs = await ingest(log, PEER, [1, 2, 3, 4, 6, 7, 8, 9, 10])
        await ingest(log, OTHER, [1, 2, 4])
        await log.delete(before_seq=seqs[7])
        (five,) = await ingest(log, PEER, [5])
        await log.delete([five])
        await log.delete(elsewhere={OTHER.node_id: 3})
    async with opened(tmp_path / "log.db") as log:
        heads = await log.reader.origin_heads()
    assert [(9, 10), (1, 4)] == [start_of(heads, PEER), start_of(heads, OTHER)]


async def test_a_table_from_before_the_holes_gets_their_column(tmp_path: Path) -> None:
    """A log whose ``origin_floors`` has no ``holes`` column keeps its bounds, and the
    holes retention finds from then on are kept."""
    async with opened(tmp_path / "log.db") as log:
        seqs = await ingest(log, PEER, [1, 2, 3, 4, 6, 7, 8, 9, 10])
        await log.delete(seqs[:2])
    with contextlib.closing(sqlite3.connect(tmp_path / "log.db")) as conn:
        conn.execute("DROP TABLE origin_floors")
        conn.execute(
            "CREATE TABLE origin_floors (origin TEXT PRIMARY KEY, removed INTEGER NOT NULL)"
        )
        conn.execute("INSERT INTO origin_floors VALUES (?, 2)", (PEER.node_id,))
        conn.commit()
    async with opened(tmp_path / "log.db") as log:
        upgraded = start_of(await log.reader.origin_heads(), PEER)
        await log.delete(seqs[2:7])
    async with opened(tmp_path / "log.db") as log:
        again = start_of(await log.reader.origin_heads(), PEER)
    assert ((3, 4, 6, 7, 8, 9, 10), (5, 4, 9, 10)) == (upgraded, again)
