"""One publish in flight (spec §6.2-§6.4, §11's durable 1→1): ``logrun.write_one``
commits it as the general commit job does, byte for byte, and one JCS cannot sign is
refused alone with nothing written."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

from hearthnet.errors import HearthNetError
from hearthnet.pubsub.envelope import StoredMessage, unsigned_fields
from hearthnet.pubsub.log import MessageLog
from hearthnet.pubsub.logcommit import Group, Outcome, Pending, write_batch
from tests.pubsub.test_log import KEYS, opened
from tests.pubsub.test_log_batches import verified

SENDER = {"kind": "token", "id": "t1"}


async def commit_alone(log: MessageLog, body: dict[str, Any]) -> list[Outcome]:
    """``body`` committed as the only entry of a batch, in the writer thread."""
    entry = Pending(None, bodies=[body], group=Group(1))
    log.sequencer.origin_seq = log.origin_seq = body["origin_seq"]
    assert log._writer is not None
    outcomes, _ = await log._writer.run(
        lambda conn: write_batch(conn, KEYS, [entry], sequencer=log.sequencer, consumers=[])
    )
    return outcomes


def rows(path: Path) -> list[tuple[Any, ...]]:
    """Every ``batches`` row, whole."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return conn.execute("SELECT * FROM batches ORDER BY seq").fetchall()


async def test_a_lone_publish_is_stored_as_the_general_job_stores_it(tmp_path: Path) -> None:
    """The same body committed by write_one and (its id given already, which sends it
    the general way) by sign_local and _write_lone: the same row and the same message,
    which verifies; the queued body is left without ``sig`` (a commit tried again signs
    it afresh)."""
    made, raws = [], []
    given = ""
    for name in ("one", "general"):
        body = unsigned_fields(KEYS.node_id, "chat.a", "m", {"i": 1}, 1, 1000, None, SENDER, "")
        body["id"] = given
        path = tmp_path / f"{name}.db"
        async with opened(path) as log:
            outcomes = await commit_alone(log, body)
        assert "sig" not in body
        given = body["id"]
        (stored,) = outcomes
        assert isinstance(stored, StoredMessage)
        made.append(rows(path))
        raws.append(stored.message.raw)
    assert made[0] == made[1]
    assert raws[0] == raws[1]
    message = verified(raws[0])
    assert (message.id, message.origin_seq, message.data) == (given, 1, {"i": 1})
    async with opened(tmp_path / "one.db") as log:
        (back,) = await log.reader.messages([1])
    assert back.message.raw == raws[0]


async def test_a_lone_publish_jcs_cannot_sign_is_refused_alone(tmp_path: Path) -> None:
    """Data beyond ±2^53 the edge let through: write_one gives the id, writes nothing,
    and the general job refuses it; the next lone publish takes seq 1."""
    path = tmp_path / "log.db"
    async with opened(path) as log:
        bad = unsigned_fields(KEYS.node_id, "chat.a", "m", 2**53 + 1, 1, 1000, None, SENDER, "")
        (refused,) = await commit_alone(log, bad)
        assert isinstance(refused, HearthNetError)
        assert bad["id"]
        good = unsigned_fields(KEYS.node_id, "chat.a", "m", {"i": 2}, 2, 1000, None, SENDER, "")
        (stored,) = await commit_alone(log, good)
        assert isinstance(stored, StoredMessage)
        assert stored.seq == 1
    assert [row[0] for row in rows(path)] == [1]
