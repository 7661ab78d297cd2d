"""Communities and the signed membership log (spec §1.5).

A community is identified by its founder's NodeID. Its membership is a set of signed
records; every node computes the same view from the same set, offline, with no
coordinator (:mod:`hearthnet.membership_fold`):

- ``community.created``  by the founder about itself: the founder is an ``anchor``;
- ``member.added``       by an anchor or trusted member, at a level no higher than its own;
- ``member.level_changed`` by an anchor, with ``keep_upto``;
- ``member.revoked``     by an anchor (the founder cannot be revoked), with ``keep_upto``:
  the revoked key's records past it are void, whenever they arrive;
- ``token.revoked``      by the token's issuer or an anchor (``subject`` is the ``jti``);
- ``pubsub.rules``       by an anchor: the community's pub/sub access rules (spec §6.9), so
  every node enforces the same ones; the last in fold order wins, an empty list hands the
  rules back to each node's own configuration;
- ``topic.rotated``      by an anchor (``subject`` is a topic pattern): voids every token
  for topics the pattern matches that was issued at or before the record's ``ts``.

Each signer's records form a chain (``signer_seq`` 1, 2, 3... and ``prev``, the digest of
its previous record), so the order of one signer's records cannot be forged.

:class:`MembershipRecord` verifies its signature when parsed. :class:`Membership` holds the
records and their fold and decides what a batch of new records may add
(:func:`admit_records`); :class:`CommunityStore` keeps records in
``<data_dir>/community/records.jsonl``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson

from hearthnet.canonical import canonicalize
from hearthnet.errors import (
    BadRequest,
    HearthNetError,
    PayloadTooLarge,
    StorageError,
)
from hearthnet.identity import KeyPair, verify_object
from hearthnet.ids import b64url_encode, is_node_id, is_ulid, new_ulid
from hearthnet.membership_fold import Level, MemberInfo, Rule
from hearthnet.pubsub.topics import TopicPattern

__all__ = ["CommunityStore", "Level", "MemberInfo", "MembershipRecord", "Rule"]


RECORD_KINDS = frozenset(
    {
        "community.created",
        "member.added",
        "member.level_changed",
        "member.revoked",
        "token.revoked",
        "pubsub.rules",
        "topic.rotated",
    }
)
MAX_RECORD_BYTES = 8 * 1024
MAX_SEQ = 2**53 - 1  # canonical JSON integers (spec §1.3)
DIGEST_PREFIX = "sha256:"
# Pub/sub access rules (spec §6.9): who may subscribe to and publish on a pattern.
RULE_LEVELS = ("self", "anchor", "trusted", "member", "token", "any")
MAX_RULES = 64


def check_rule(pattern: object, subscribe: object, publish: object) -> Rule:
    """Validate one access rule; ``{self}`` stands for one segment (a member's short id).

    Raises:
        BadRequest: a level that is not one of :data:`RULE_LEVELS`, or a bad pattern.
    """
    if not (isinstance(pattern, str) and isinstance(subscribe, str) and isinstance(publish, str)):
        raise BadRequest("a rule's pattern, subscribe and publish are strings")
    for level in (subscribe, publish):
        if level not in RULE_LEVELS:
            raise BadRequest(f"rule {pattern!r}: level {level!r} is not one of {RULE_LEVELS}")
    try:
        TopicPattern.parse(pattern.replace("{self}", "x"))
    except BadRequest as exc:
        raise BadRequest(f"rule pattern {pattern!r} is not a topic pattern") from exc
    return (pattern, subscribe, publish)


def _parse_rules(value: object) -> tuple[Rule, ...]:
    if not isinstance(value, list) or len(value) > MAX_RULES:
        raise BadRequest(f"pubsub.rules carries a list of at most {MAX_RULES} rules")
    rules = []
    for item in value:
        if not isinstance(item, dict) or set(item) != {"pattern", "subscribe", "publish"}:
            raise BadRequest("a rule is {pattern, subscribe, publish}")
        rules.append(check_rule(item["pattern"], item["subscribe"], item["publish"]))
    return tuple(rules)


@dataclass(frozen=True, slots=True)
class MembershipRecord:
    """One signed membership record; an instance always carries a verified signature."""

    id: str
    kind: str
    community: str
    subject: str
    by: str
    ts: int
    sig: str
    level: str | None = None
    name: str | None = None
    role: str | None = None
    iss: str | None = None
    invite: str | None = None  # member.added: the nonce of the invite it redeems
    rules: tuple[Rule, ...] | None = None  # pubsub.rules
    # spec §1.5 chains: the signer's own sequence number and the digest of its previous
    # record; None on records written before chains (legacy, see membership_fold).
    signer_seq: int | None = None
    prev: str | None = None
    # member.revoked / member.level_changed: the subject's last record (signer_seq) that
    # keeps the subject's old standing.
    keep_upto: int | None = None
    # sha256 of the record's canonical bytes, signature included: what ``prev`` names.
    digest: str = field(default="", compare=False, repr=False)

    @classmethod
    def create(
        cls,
        signer: KeyPair,
        kind: str,
        community: str,
        subject: str,
        *,
        now_ms: int,
        level: Level | None = None,
        name: str | None = None,
        role: str | None = None,
        iss: str | None = None,
        invite: str | None = None,
        rules: tuple[Rule, ...] | None = None,
        signer_seq: int | None,
        prev: str | None,
        keep_upto: int | None = None,
    ) -> MembershipRecord:
        """Make and sign a record as ``signer``, at ``signer_seq`` of its chain after the
        record whose digest is ``prev``. :meth:`Membership.sign` fills in the chain."""
        body: dict[str, Any] = {
            "id": new_ulid(now_ms),
            "kind": kind,
            "community": community,
            "subject": subject,
            "by": signer.node_id,
            "ts": now_ms,
        }
        if level is not None:
            body["level"] = level.label
        if name is not None:
            body["name"] = name
        if role is not None:
            body["role"] = role
        if iss is not None:
            body["iss"] = iss
        if invite is not None:
            body["invite"] = invite
        if rules is not None:
            body["rules"] = _rules_json(rules)
        if signer_seq is not None:
            body["signer_seq"] = signer_seq
        if prev is not None:
            body["prev"] = prev
        if keep_upto is not None:
            body["keep_upto"] = keep_upto
        body["sig"] = signer.sign_object(body)
        return cls.parse(body)

    @classmethod
    def parse(cls, obj: object) -> MembershipRecord:
        """Validate shape and verify the signature.

        Raises:
            BadRequest: malformed record.
            InvalidSignature: the signature does not verify.
        """
        if not isinstance(obj, dict):
            raise BadRequest("a membership record is an object")
        try:
            rec = cls(
                id=obj["id"],
                kind=obj["kind"],
                community=obj["community"],
                subject=obj["subject"],
                by=obj["by"],
                ts=obj["ts"],
                sig=obj["sig"],
                level=obj.get("level"),
                name=obj.get("name"),
                role=obj.get("role"),
                iss=obj.get("iss"),
                invite=obj.get("invite"),
                rules=_parse_rules(obj["rules"]) if "rules" in obj else None,
                signer_seq=obj.get("signer_seq"),
                prev=obj.get("prev"),
                keep_upto=obj.get("keep_upto"),
            )
        except KeyError as exc:
            raise BadRequest(f"membership record lacks {exc.args[0]!r}") from exc
        if set(obj) - {
            "id",
            "kind",
            "community",
            "subject",
            "by",
            "ts",
            "sig",
            "level",
            "name",
            "role",
            "iss",
            "invite",
            "rules",
            "signer_seq",
            "prev",
            "keep_upto",
        }:
            raise BadRequest("membership record has unknown fields")
        if (rec.kind == "pubsub.rules") != (rec.rules is not None):
            raise BadRequest("rules belong to (and only to) a pubsub.rules record")
        if len(orjson.dumps(obj)) > MAX_RECORD_BYTES:
            raise PayloadTooLarge(f"a membership record is at most {MAX_RECORD_BYTES} bytes")
        if not is_ulid(rec.id) or rec.kind not in RECORD_KINDS:
            raise BadRequest("membership record id or kind is invalid")
        if not (is_node_id(rec.community) and is_node_id(rec.by)):
            raise BadRequest("membership record community/by must be NodeIDs")
        if not isinstance(rec.ts, int) or isinstance(rec.ts, bool):
            raise BadRequest("membership record ts must be an integer")
        if not isinstance(rec.subject, str) or not rec.subject:
            raise BadRequest("membership record subject must be a string")
        if rec.level is not None:
            Level.parse(rec.level)
        if rec.kind == "topic.rotated":
            TopicPattern.parse(rec.subject)
        for opt in (rec.name, rec.role, rec.iss, rec.invite):
            if opt is not None and not isinstance(opt, str):
                raise BadRequest("membership record fields must be strings")
        _check_chain_fields(rec)
        body = rec.to_json()
        verify_object(rec.by, body, rec.sig, "sig")
        return replace(rec, digest=record_digest(body))

    def to_json(self) -> dict[str, Any]:
        """The wire/storage form."""
        out: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind,
            "community": self.community,
            "subject": self.subject,
            "by": self.by,
            "ts": self.ts,
        }
        for key in ("level", "name", "role", "iss", "invite"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        if self.rules is not None:
            out["rules"] = _rules_json(self.rules)
        for key in ("signer_seq", "prev", "keep_upto"):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        out["sig"] = self.sig
        return out

    @property
    def is_legacy(self) -> bool:
        """True for a record written before chains (no ``signer_seq``)."""
        return self.signer_seq is None

    @property
    def order_key(self) -> tuple[int, str]:
        """Records are applied in (ts, id) order on every node."""
        return (self.ts, self.id)


def record_digest(body: dict[str, Any]) -> str:
    """``sha256:`` + base64url of the SHA-256 of a record's canonical bytes (sig included)."""
    return DIGEST_PREFIX + b64url_encode(hashlib.sha256(canonicalize(body)).digest())


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_SEQ


def _check_chain_fields(rec: MembershipRecord) -> None:
    """spec §1.5: ``signer_seq`` 1, 2, 3...; ``prev`` from 2 on; ``keep_upto`` on revocations
    and level changes of chained records."""
    if rec.signer_seq is None:
        if rec.prev is not None or rec.keep_upto is not None:
            raise BadRequest("prev and keep_upto come with signer_seq")
        return
    if not _is_count(rec.signer_seq) or rec.signer_seq < 1:
        raise BadRequest("signer_seq is an integer from 1")
    if (rec.signer_seq == 1) != (rec.prev is None):
        raise BadRequest("prev names the signer's previous record, from signer_seq 2 on")
    if rec.prev is not None and not (
        isinstance(rec.prev, str)
        and rec.prev.startswith(DIGEST_PREFIX)
        and len(rec.prev) == len(DIGEST_PREFIX) + 43
    ):
        raise BadRequest("prev is 'sha256:' + 43 base64url characters")
    limited = rec.kind in ("member.revoked", "member.level_changed")
    if limited != (rec.keep_upto is not None):
        raise BadRequest("keep_upto belongs to (and only to) revocations and level changes")
    if rec.keep_upto is not None and not _is_count(rec.keep_upto):
        raise BadRequest("keep_upto is a non-negative integer")


def _rules_json(rules: tuple[Rule, ...]) -> list[dict[str, str]]:
    return [{"pattern": p, "subscribe": sub, "publish": pub} for p, sub, pub in rules]


class CommunityStore:
    """Membership records on disk: ``<data_dir>/community/records.jsonl``, append-only."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = data_dir / "community"
        self.path = self.dir / "records.jsonl"

    def load(self) -> list[MembershipRecord]:
        """Every stored record, verified; a corrupt line is a :class:`StorageError`."""
        if not self.path.exists():
            return []
        records = []
        with self.path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    records.append(MembershipRecord.parse(json.loads(line)))
                except (ValueError, HearthNetError) as exc:
                    raise StorageError(
                        f"{self.path}:{lineno}: bad membership record: {exc}"
                    ) from exc
        return records

    def replace(self, records: list[MembershipRecord]) -> None:
        """Replace every record (joining another community), atomically."""
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            for record in records:
                f.write(
                    json.dumps(record.to_json(), separators=(",", ":"), ensure_ascii=False) + "\n"
                )
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def append(self, record: MembershipRecord) -> None:
        """Append one record durably (fsync: membership must survive a crash)."""
        self.extend([record])

    def extend(self, records: Iterable[MembershipRecord]) -> None:
        """Append records durably, with one fsync."""
        lines = [
            json.dumps(r.to_json(), separators=(",", ":"), ensure_ascii=False) + "\n"
            for r in records
        ]
        if not lines:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as f:
            f.write("".join(lines))
            f.flush()
            os.fsync(f.fileno())
