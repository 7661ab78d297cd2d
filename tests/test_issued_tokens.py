"""The record of issued tokens (hearthnet.issued_tokens): what ``token list`` shows,
when ``token revoke`` doubts a jti, and the SQLite file two processes write."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

from hearthnet.commands.tokens import span
from hearthnet.identity import KeyPair
from hearthnet.issued_tokens import (
    KEEP_EXPIRED_MS,
    IssuedToken,
    IssuedTokens,
    listed,
    revocation_doubt,
)
from hearthnet.tokens import CapabilityToken, Scope

T0 = 1_780_000_000_000
HOUR = 3_600_000
KEYS = KeyPair.from_seed(bytes(range(32)))


def _token(now: int, ttl_ms: int = HOUR, sub: str | None = None) -> CapabilityToken:
    return CapabilityToken.issue(
        KEYS,
        community=KEYS.node_id,
        scopes=[Scope.parse("sub:chat.**"), Scope.parse("call:echo@1")],
        ttl_ms=ttl_ms,
        now_ms=now,
        sub=sub,
    )


def _row(jti: str, iat: int, exp: int, *, revoked: bool = False) -> IssuedToken:
    return IssuedToken(
        jti, KEYS.node_id, "s", KEYS.node_id, ("sub:a",), iat, exp, None, "cli", revoked
    )


def test_list_shows_live_tokens_newest_first_and_all_with_everything() -> None:
    """Live only by default (not expired, not revoked); ``--all`` every row; newest first."""
    rows = [
        _row("A", T0, T0 + HOUR),
        _row("B", T0 + 1, T0 + 10),
        _row("C", T0 + 2, T0 + HOUR, revoked=True),
        _row("D", T0 + 3, T0 + HOUR),
    ]
    now = T0 + 100
    assert (["D", "A"], ["D", "C", "B", "A"]) == (
        [t.jti for t in listed(rows, now, everything=False)],
        [t.jti for t in listed(rows, now, everything=True)],
    )


def test_a_revocation_from_elsewhere_marks_the_row_revoked() -> None:
    """A ``token.revoked`` record from an anchor (in the membership view) marks the row."""
    row = _row("A", T0, T0 + HOUR)
    marked = row.revoked_in({(KEYS.node_id, "A")})
    assert ("live", "revoked", None, row) == (
        row.state(T0),
        marked.state(T0),
        marked.revoked_ms,
        row.revoked_in({("ed25519:other", "A")}),
    )


def test_revoke_doubts_an_unknown_jti_and_trusts_a_recorded_one() -> None:
    """A recorded jti is no doubt; an unknown one is, naming token list and --force; a
    jti that is not even a ULID says so; another issuer's cannot be checked here."""
    own = KEYS.node_id
    known = _row("01JDZQ8XK6W3S1V5Z4Q2R7T9AB", T0, T0 + HOUR)
    typo = revocation_doubt("01JDZQ8XK6W3S1V5Z4Q2R7T9AC", own, own, None)
    not_ulid = revocation_doubt("oops", own, own, None)
    foreign = revocation_doubt("01JDZQ8XK6W3S1V5Z4Q2R7T9AC", "ed25519:x", own, None)
    assert (None, True, True, False, True, True) == (
        revocation_doubt(known.jti, own, own, known),
        typo is not None and "hearthnet token list --all" in typo and "--force" in typo,
        not_ulid is not None and "26-character ULID" in not_ulid,
        typo is not None and "ULID" in typo,
        foreign is not None and "whole token" in foreign,
        foreign is not None and "--force" in foreign,
    )


def test_span_reads_as_people_say_it() -> None:
    """Relative times: seconds, minutes, hours, days, before and after now."""
    assert ["in 59m", "3h ago", "in 2d", "5s ago"] == [
        span(T0 + 59 * 60_000 + 30_000, T0),
        span(T0 - 3 * HOUR - 5, T0),
        span(T0 + 49 * HOUR, T0),
        span(T0 - 5_000, T0),
    ]


def test_record_keeps_what_the_token_says_and_never_the_token(tmp_path: Path) -> None:
    """The row holds jti, sub, scopes, times; the file holds no signature and no token."""
    store = IssuedTokens(tmp_path)
    token = _token(T0, sub="kitchen")
    store.record(token, "cli", T0)
    raw = b"".join(p.read_bytes() for p in store.path.parent.iterdir())  # with -wal, if any
    assert (
        IssuedToken(
            token.jti,
            KEYS.node_id,
            "kitchen",
            KEYS.node_id,
            ("sub:chat.**", "call:echo@1"),
            T0,
            T0 + HOUR,
            None,
            "cli",
        ),
        False,
        False,
    ) == (store.get(token.jti), token.sig.encode() in raw, token.encode().encode() in raw)


def test_a_console_session_extends_its_row(tmp_path: Path) -> None:
    """Recording the same jti again (a refreshed console token) keeps one row, with the
    later expiry and the first issue time."""
    store = IssuedTokens(tmp_path)
    login = _token(T0)
    store.record(login, "console", T0)
    body = {**login.to_json(), "exp_ms": T0 + 5 * HOUR, "iat_ms": T0 + HOUR}
    del body["sig"]
    body["sig"] = KEYS.sign_object(body)
    store.record(CapabilityToken.from_json(body), "console", T0 + HOUR)
    rows = store.all(T0 + HOUR)
    assert [(login.jti, T0, T0 + 5 * HOUR)] == [(r.jti, r.iat_ms, r.exp_ms) for r in rows]


def test_revoked_rows_are_marked_and_expired_ones_pruned(tmp_path: Path) -> None:
    """mark_revoked stamps the row; a token expired longer than the keep time is gone at
    the next write or list."""
    store = IssuedTokens(tmp_path)
    old, live = _token(T0, ttl_ms=1000), _token(T0 + 1)
    store.record(old, "cli", T0)
    store.record(live, "cli", T0 + 1)
    store.mark_revoked(live.jti, T0 + 5)
    later = T0 + 1000 + KEEP_EXPIRED_MS + 1
    kept = store.all(later)
    with sqlite3.connect(store.path) as db:
        count = db.execute("SELECT count(*) FROM issued").fetchone()[0]
    assert ([(live.jti, T0 + 5, "revoked")], 1) == (
        [(r.jti, r.revoked_ms, r.state(later)) for r in kept],
        count,
    )


def test_no_file_is_no_rows_and_is_not_created_by_reading(tmp_path: Path) -> None:
    """A data dir that never issued a token lists none, and listing creates nothing."""
    store = IssuedTokens(tmp_path)
    assert ([], None, False) == (store.all(T0), store.get("X"), store.path.exists())


def _issue_many(data_dir: str, n: int) -> None:
    store = IssuedTokens(Path(data_dir))
    for i in range(n):
        store.record(_token(T0 + i), "cli", T0 + i)


def test_two_processes_record_at_once_and_lose_nothing(tmp_path: Path) -> None:
    """The CLI and the node write the same file: WAL and the busy timeout serialise
    them, every row arrives."""
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_issue_many, args=(str(tmp_path), 40)) for _ in range(2)]
    for p in procs:
        p.start()
    _issue_many(str(tmp_path), 40)
    for p in procs:
        p.join(60)
    store = IssuedTokens(tmp_path)
    with sqlite3.connect(store.path) as db:
        mode = db.execute("PRAGMA journal_mode").fetchone()[0]
    assert ([0, 0], 120, "wal") == ([p.exitcode for p in procs], len(store.all(T0)), mode)
