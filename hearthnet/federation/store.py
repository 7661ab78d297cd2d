"""Federation state on disk: ``<data_dir>/federation/federation.sqlite3`` (spec §8).

Three tables: ``items`` (agreements and revocations, as signed JSON), ``records`` (the
other communities' membership records) and ``cursors`` (where this node's bridge pull
from each remote node stands: the remote log's epoch and seq). Everything stored is
verified again when loaded, so a hand-edited row is dropped, not trusted.

Writes are rare (an agreement, a revocation, a membership change) and small; the node
runs them in a thread (:func:`asyncio.to_thread`).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from pathlib import Path
from typing import Any

from hearthnet.community import MembershipRecord
from hearthnet.errors import HearthNetError, StorageError
from hearthnet.federation.agreement import Agreement, Revocation
from hearthnet.federation.view import FederationView

log = logging.getLogger("hearthnet.federation")

# one transaction: on a new data directory, one journal and one round of fsyncs, not three
_SCHEMA = """
BEGIN;
CREATE TABLE IF NOT EXISTS items (id TEXT NOT NULL, kind TEXT NOT NULL, body TEXT NOT NULL,
                                  PRIMARY KEY (id, kind));
CREATE TABLE IF NOT EXISTS records (community TEXT NOT NULL, id TEXT NOT NULL,
                                    body TEXT NOT NULL, PRIMARY KEY (community, id));
CREATE TABLE IF NOT EXISTS cursors (url TEXT PRIMARY KEY, epoch TEXT NOT NULL,
                                    seq INTEGER NOT NULL);
COMMIT;
"""


class FederationStore:
    """The SQLite file behind a :class:`FederationView`."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "federation" / "federation.sqlite3"
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._db = sqlite3.connect(self.path, check_same_thread=False)
            self._db.executescript(_SCHEMA)
            self._db.commit()
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open {self.path}: {exc}") from exc

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            self._db.close()

    def _write(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        with self._lock:
            try:
                self._db.executemany(sql, rows)
                self._db.commit()
            except sqlite3.Error as exc:
                raise StorageError(f"cannot write {self.path}: {exc}") from exc

    def put_agreement(self, agreement: Agreement) -> None:
        """Store an agreement."""
        self._write(
            "INSERT OR REPLACE INTO items VALUES (?, 'agreement', ?)",
            [(agreement.id, json.dumps(agreement.to_json()))],
        )

    def put_revocation(self, revocation: Revocation) -> None:
        """Store a revocation."""
        self._write(
            "INSERT OR REPLACE INTO items VALUES (?, 'revocation', ?)",
            [(revocation.agreement, json.dumps(revocation.to_json()))],
        )

    def put_records(self, community: str, records: list[MembershipRecord]) -> None:
        """Store another community's membership records."""
        self._write(
            "INSERT OR IGNORE INTO records VALUES (?, ?, ?)",
            [(community, r.id, json.dumps(r.to_json())) for r in records],
        )

    def put_cursor(self, url: str, epoch: str, seq: int) -> None:
        """Remember how far the pull from ``url`` got."""
        self._write("INSERT OR REPLACE INTO cursors VALUES (?, ?, ?)", [(url, epoch, seq)])

    def cursors(self) -> dict[str, tuple[str, int]]:
        """Every pull cursor, by remote URL."""
        with self._lock:
            rows = self._db.execute("SELECT url, epoch, seq FROM cursors").fetchall()
        return {url: (epoch, seq) for url, epoch, seq in rows}

    def load(self, view: FederationView) -> None:
        """Fill ``view`` with what is stored: agreements, then the other communities'
        records, then revocations (whose signers are checked against those records)."""
        with self._lock:
            items = self._db.execute("SELECT kind, body FROM items").fetchall()
            records = self._db.execute("SELECT community, body FROM records").fetchall()
        for kind, body in items:
            if kind == "agreement":
                self._apply(lambda b=body: view.add_agreement(Agreement.parse(json.loads(b))))
        by_community: dict[str, list[MembershipRecord]] = {}
        for community, body in records:
            try:
                by_community.setdefault(community, []).append(
                    MembershipRecord.parse(json.loads(body))
                )
            except (HearthNetError, ValueError) as exc:
                log.warning("dropped a stored federation record: %s", exc)
        for community, recs in by_community.items():
            self._apply(lambda c=community, r=recs: view.add_foreign_records(c, r))
        for kind, body in items:
            if kind == "revocation":
                self._apply(lambda b=body: view.add_revocation(Revocation.parse(json.loads(b))))

    @staticmethod
    def _apply(step: Any) -> None:
        try:
            step()
        except (HearthNetError, ValueError) as exc:
            log.warning("dropped a stored federation item: %s", exc)
