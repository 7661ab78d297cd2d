"""Federation state in SQLite survives a restart (spec §8)."""

from __future__ import annotations

from pathlib import Path

from hearthnet.community import Level
from hearthnet.federation.agreement import Revocation
from hearthnet.federation.store import FederationStore
from hearthnet.federation.view import FederationView
from tests.federation.test_agreement import (
    A2,
    B_MEMBER,
    NOW,
    A,
    B,
    agreement,
    community,
)


def test_agreements_records_revocations_and_cursors_survive_a_restart(tmp_path: Path) -> None:
    """What one store wrote, a new store on the same data dir loads into a fresh view."""
    store = FederationStore(tmp_path)
    signed = agreement(signer_a=A2)
    b_records = list(community(B, (B_MEMBER, Level.MEMBER)).records.values())
    revocation = Revocation.create(B, signed.id, NOW)
    store.put_agreement(signed)
    store.put_records(B.node_id, b_records)
    store.put_revocation(revocation)
    store.put_cursor("http://127.0.0.1:1", "epoch1", 42)
    store.close()

    reopened = FederationStore(tmp_path)
    view = FederationView(community(A, (A2, Level.ANCHOR)))
    reopened.load(view)
    assert (
        {signed.id: signed},
        {signed.id: revocation},
        Level.MEMBER,
        {"http://127.0.0.1:1": ("epoch1", 42)},
    ) == (
        view.agreements,
        view.revocations,
        view.foreign[B.node_id].level_of(B_MEMBER.node_id),
        reopened.cursors(),
    )
    reopened.close()


def test_a_tampered_row_is_dropped_on_load(tmp_path: Path) -> None:
    """A stored agreement whose signature no longer verifies is not loaded."""
    store = FederationStore(tmp_path)
    store.put_agreement(agreement())
    store._db.execute("UPDATE items SET body = replace(body, '86400000', '86400001')")
    store._db.commit()
    view = FederationView(community(A))
    store.load(view)
    store.close()
    assert {} == view.agreements
