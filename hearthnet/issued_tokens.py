"""The tokens this node issued (spec §1.6), for ``hearthnet token list`` and a
``token revoke`` that notices a mistyped ``jti``: ``<data_dir>/tokens/issued.sqlite3``.

A row is what a token says about itself, never the token: ``jti``, ``iss``, ``sub``,
``community``, ``scopes``, ``iat_ms``, ``exp_ms``, ``revoked_ms`` (when a revocation of it
went through this data dir's node) and ``via`` (``cli``: ``hearthnet token issue``;
``console``: a console login, whose session keeps its ``jti`` and extends ``exp_ms``).
Without its ``sig`` nothing here can be used as a token.

Tokens are issued in two processes, one place: the CLI signs ``token issue`` and console
logins with the seed file (the node need not run, spec §1.6 verifies tokens offline),
and the running node extends console sessions. Both write this file; SQLite in WAL mode
with a busy timeout serialises them, so a CLI write never corrupts or blocks the node for
long. Each call opens the file and closes it (writes are rare: one per issued token).

Bounded: a row goes :data:`KEEP_EXPIRED_MS` after its token expired (a revocation of an
expired token changes nothing), and at most :data:`MAX_ROWS` are kept (those expiring
first go). The revocation itself is a membership record (``token.revoked``), gossiped to
every node; this file only remembers that it happened here.

:func:`revocation_doubt` and :func:`listed` are pure.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from hearthnet.errors import StorageError
from hearthnet.ids import is_ulid
from hearthnet.tokens import CapabilityToken

KEEP_EXPIRED_MS = 7 * 86_400_000  # rows of expired tokens are kept this long (token list --all)
MAX_ROWS = 100_000
BUSY_TIMEOUT_S = 5.0  # how long a writer waits for the other process's transaction

_SCHEMA = """
CREATE TABLE IF NOT EXISTS issued (
    jti TEXT PRIMARY KEY, iss TEXT NOT NULL, sub TEXT NOT NULL, community TEXT NOT NULL,
    scopes TEXT NOT NULL, iat_ms INTEGER NOT NULL, exp_ms INTEGER NOT NULL,
    revoked_ms INTEGER, via TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS issued_exp ON issued (exp_ms);
"""
_COLUMNS = "jti, iss, sub, community, scopes, iat_ms, exp_ms, revoked_ms, via"


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """What is recorded of one issued token (never the token or its signature)."""

    jti: str
    iss: str
    sub: str
    community: str
    scopes: tuple[str, ...]  # ``kind:pattern``, as ``token issue --scope`` takes them
    iat_ms: int
    exp_ms: int
    revoked_ms: int | None  # when a revocation went through this data dir's node
    via: str
    # revoked: here (``revoked_ms``) or by a ``token.revoked`` record from elsewhere (an
    # anchor's), as this data dir's membership view holds it
    revoked: bool = False

    @classmethod
    def of(cls, token: CapabilityToken, via: str, now_ms: int) -> IssuedToken:
        """The record of ``token``, issued ``via`` the CLI or the console at ``now_ms``."""
        return cls(
            token.jti,
            token.iss,
            token.sub,
            token.community,
            tuple(f"{s.kind}:{s.pattern}" for s in token.scopes),
            token.iat_ms if token.iat_ms is not None else now_ms,
            token.exp_ms,
            None,
            via,
        )

    def revoked_in(self, revoked: set[tuple[str, str]]) -> IssuedToken:
        """This row, marked revoked when ``(iss, jti)`` is among the community's revoked
        tokens (``Membership.revoked_tokens``)."""
        if self.revoked or (self.iss, self.jti) not in revoked:
            return self
        return dataclasses.replace(self, revoked=True)

    def state(self, now_ms: int) -> str:
        """``revoked``, ``expired`` or ``live``."""
        if self.revoked:
            return "revoked"
        return "expired" if self.exp_ms <= now_ms else "live"

    def to_json(self, now_ms: int) -> dict[str, object]:
        """``token list --json``: the fields, and ``state``."""
        return {
            "jti": self.jti,
            "iss": self.iss,
            "sub": self.sub,
            "community": self.community,
            "scopes": list(self.scopes),
            "iat_ms": self.iat_ms,
            "exp_ms": self.exp_ms,
            "revoked": self.revoked,
            "revoked_ms": self.revoked_ms,
            "via": self.via,
            "state": self.state(now_ms),
        }


def listed(tokens: Sequence[IssuedToken], now_ms: int, *, everything: bool) -> list[IssuedToken]:
    """What ``token list`` shows: the live tokens (``everything``: every row kept),
    newest first."""
    shown = [t for t in tokens if everything or t.state(now_ms) == "live"]
    return sorted(shown, key=lambda t: (t.iat_ms, t.jti), reverse=True)


def revocation_doubt(jti: str, iss: str, own_node: str, known: IssuedToken | None) -> str | None:
    """Why revoking ``jti`` of issuer ``iss`` is probably a mistake, or None when it is one
    this node recorded issuing. A revocation of an id nobody issued changes nothing and
    says nothing, so a typo would pass for a revocation."""
    if known is not None:
        return None
    if iss != own_node:
        return (
            f"token {jti} was issued by {iss}, not this node, which cannot check that it"
            " exists: pass the whole token (hnt1:...) instead, or check the jti and add --force"
        )
    why = f"this node issued no token with jti {jti} that it still records"
    if not is_ulid(jti):
        why += " (the jti of a token this node issues is a 26-character ULID)"
    return (
        f"{why}: hearthnet token list --all shows those it issued (an expired one is kept"
        " 7 days). A token issued before this node recorded them is revoked with --force"
    )


class IssuedTokens:
    """``<data_dir>/tokens/issued.sqlite3``; every method opens and closes the file."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / "tokens" / "issued.sqlite3"

    @contextlib.contextmanager
    def _open(self, *, create: bool) -> Iterator[sqlite3.Connection | None]:
        """A connection in WAL mode (None: no file and not ``create``)."""
        if not create and not self.path.exists():
            yield None
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except (OSError, sqlite3.Error) as exc:
            raise StorageError(f"cannot open {self.path}: {exc}") from exc
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            yield db
        except sqlite3.Error as exc:
            raise StorageError(f"cannot use {self.path}: {exc}") from exc
        finally:
            db.close()

    def record(self, token: CapabilityToken, via: str, now_ms: int) -> None:
        """Remember ``token`` as issued here; a token already recorded (a console session
        extended under its ``jti``) keeps its row, with the later expiry. Prunes."""
        row = IssuedToken.of(token, via, now_ms)
        with self._open(create=True) as db:
            assert db is not None
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                f"INSERT INTO issued ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?)"  # noqa: S608 - constant
                " ON CONFLICT (jti) DO UPDATE SET exp_ms = max(exp_ms, excluded.exp_ms)",
                (
                    row.jti,
                    row.iss,
                    row.sub,
                    row.community,
                    json.dumps(list(row.scopes)),
                    row.iat_ms,
                    row.exp_ms,
                    row.via,
                ),
            )
            _prune(db, now_ms)
            db.execute("COMMIT")

    def mark_revoked(self, jti: str, now_ms: int) -> None:
        """Note that the node applied a revocation of ``jti`` (a row it has, if any)."""
        with self._open(create=False) as db:
            if db is not None:
                db.execute(
                    "UPDATE issued SET revoked_ms = ? WHERE jti = ? AND revoked_ms IS NULL",
                    (now_ms, jti),
                )

    def get(self, jti: str) -> IssuedToken | None:
        """The row of ``jti``, if this node recorded issuing it."""
        with self._open(create=False) as db:
            if db is None:
                return None
            found = db.execute(
                f"SELECT {_COLUMNS} FROM issued WHERE jti = ?",  # noqa: S608 - constant
                (jti,),
            ).fetchone()
        return None if found is None else _row(found)

    def all(self, now_ms: int) -> list[IssuedToken]:
        """Every row kept (pruned first: what expired long ago is not shown)."""
        with self._open(create=False) as db:
            if db is None:
                return []
            db.execute("BEGIN IMMEDIATE")
            _prune(db, now_ms)
            rows = db.execute(f"SELECT {_COLUMNS} FROM issued").fetchall()  # noqa: S608
            db.execute("COMMIT")
        return [_row(r) for r in rows]


def _prune(db: sqlite3.Connection, now_ms: int) -> None:
    """Drop rows of tokens expired :data:`KEEP_EXPIRED_MS` ago, and beyond
    :data:`MAX_ROWS` those expiring first (inside the caller's transaction)."""
    db.execute("DELETE FROM issued WHERE exp_ms < ?", (now_ms - KEEP_EXPIRED_MS,))
    db.execute(
        "DELETE FROM issued WHERE jti IN (SELECT jti FROM issued ORDER BY exp_ms DESC"
        " LIMIT -1 OFFSET ?)",
        (MAX_ROWS,),
    )


def _row(r: tuple[object, ...]) -> IssuedToken:
    jti, iss, sub, community, scopes, iat_ms, exp_ms, revoked_ms, via = r
    parsed = json.loads(str(scopes))
    return IssuedToken(
        str(jti),
        str(iss),
        str(sub),
        str(community),
        tuple(str(s) for s in parsed) if isinstance(parsed, list) else (),
        int(iat_ms),  # type: ignore[call-overload]
        int(exp_ms),  # type: ignore[call-overload]
        None if revoked_ms is None else int(revoked_ms),  # type: ignore[call-overload]
        str(via),
        revoked_ms is not None,
    )
