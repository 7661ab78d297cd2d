"""Communities and the signed membership log (spec §1.5).

A community is identified by its founder's NodeID. Its membership is a set of signed
records; every node folds the same records in the same order (``ts``, then ``id``)
and so reaches the same view, offline, with no coordinator:

- ``community.created``  by the founder about itself: the founder is an ``anchor``;
- ``member.added``       by an anchor or trusted member, at a level no higher than its own;
- ``member.level_changed`` by an anchor;
- ``member.revoked``     by an anchor (the founder cannot be revoked);
- ``token.revoked``      by the token's issuer or an anchor (``subject`` is the ``jti``);
- ``pubsub.rules``       by an anchor: the community's pub/sub access rules (spec §6.9), so
  every node enforces the same ones; the last in fold order wins, an empty list hands the
  rules back to each node's own configuration.

A record whose signer does not hold the needed level *at that point of the fold* is
ignored, so revoking a member also voids what it signed later.

:class:`MembershipRecord` verifies its signature when parsed. :class:`Membership` is the
pure fold; :class:`CommunityStore` keeps records in ``<data_dir>/community/records.jsonl``.
"""

from __future__ import annotations

import enum
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from hearthnet.errors import BadRequest, HearthNetError, PayloadTooLarge, StorageError
from hearthnet.identity import KeyPair, verify_object
from hearthnet.ids import is_node_id, is_ulid, new_ulid
from hearthnet.pubsub.topics import TopicPattern


class Level(enum.IntEnum):
    """Membership levels, ordered: a higher level may do all a lower one may."""

    MEMBER = 1
    TRUSTED = 2
    ANCHOR = 3

    @classmethod
    def parse(cls, text: object) -> Level:
        """``"member"``, ``"trusted"`` or ``"anchor"``; :class:`BadRequest` otherwise."""
        if isinstance(text, str):
            try:
                return cls[text.upper()]
            except KeyError:
                pass
        raise BadRequest(f"unknown level {text!r}: member, trusted or anchor")

    @property
    def label(self) -> str:
        """Lower-case wire name."""
        return self.name.lower()


RECORD_KINDS = frozenset(
    {
        "community.created",
        "member.added",
        "member.level_changed",
        "member.revoked",
        "token.revoked",
        "pubsub.rules",
    }
)
MAX_RECORD_BYTES = 8 * 1024
# Pub/sub access rules (spec §6.9): who may subscribe to and publish on a pattern.
RULE_LEVELS = ("self", "anchor", "trusted", "member", "token", "any")
MAX_RULES = 64
Rule = tuple[str, str, str]  # (pattern, subscribe level, publish level)


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
    ) -> MembershipRecord:
        """Make and sign a record as ``signer``."""
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
        for opt in (rec.name, rec.role, rec.iss, rec.invite):
            if opt is not None and not isinstance(opt, str):
                raise BadRequest("membership record fields must be strings")
        verify_object(rec.by, rec.to_json(), rec.sig, "sig")
        return rec

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
        out["sig"] = self.sig
        return out

    @property
    def order_key(self) -> tuple[int, str]:
        """Records are applied in (ts, id) order on every node."""
        return (self.ts, self.id)


def _rules_json(rules: tuple[Rule, ...]) -> list[dict[str, str]]:
    return [{"pattern": p, "subscribe": sub, "publish": pub} for p, sub, pub in rules]


@dataclass(slots=True)
class MemberInfo:
    """What the fold knows about one member."""

    level: Level
    role: str = "node"
    name: str | None = None
    added_ms: int = 0


@dataclass(slots=True)
class Membership:
    """The pure fold of a community's membership records."""

    community_id: str
    name: str = ""
    members: dict[str, MemberInfo] = field(default_factory=dict)
    revoked: set[str] = field(default_factory=set)
    revoked_tokens: set[tuple[str, str]] = field(default_factory=set)
    records: dict[str, MembershipRecord] = field(default_factory=dict)
    used_invites: set[str] = field(default_factory=set)
    # The community's pub/sub rules: None while no anchor has set any (or after a clear).
    pubsub_rules: tuple[Rule, ...] | None = None
    version: int = 0

    def level_of(self, identity: str) -> Level | None:
        """The identity's level, or None when it is not a (live) member."""
        info = self.members.get(identity)
        return info.level if info is not None else None

    def is_revoked(self, identity: str) -> bool:
        """True when the identity was a member and was revoked."""
        return identity in self.revoked

    def is_token_revoked(self, iss: str, jti: str) -> bool:
        """True when the token ``(iss, jti)`` was revoked individually."""
        return (iss, jti) in self.revoked_tokens

    def add(self, record: MembershipRecord) -> bool:
        """Add a verified record and refold; False when it was already known or foreign."""
        if record.community != self.community_id or record.id in self.records:
            return False
        self.records[record.id] = record
        self._refold()
        return True

    def _refold(self) -> None:
        # Records can arrive in any order over gossip; folding from scratch in the one
        # agreed order keeps every node's view identical. The log is small (people).
        self.members.clear()
        self.revoked.clear()
        self.revoked_tokens.clear()
        self.used_invites.clear()
        self.pubsub_rules = None
        for rec in sorted(self.records.values(), key=lambda r: r.order_key):
            self._apply(rec)
        self.version += 1

    def _apply(self, rec: MembershipRecord) -> None:
        signer = self.level_of(rec.by)
        if rec.kind == "community.created":
            if rec.by == rec.subject == self.community_id and not self.members:
                self.members[rec.by] = MemberInfo(
                    Level.ANCHOR, rec.role or "node", rec.name, rec.ts
                )
                self.name = rec.name or self.name
            return
        if signer is None:
            return
        if rec.kind == "member.added":
            level = Level.parse(rec.level) if rec.level else Level.MEMBER
            if (
                signer >= Level.TRUSTED
                and level <= signer
                and rec.subject not in self.revoked
                and rec.subject not in self.members
                and is_node_id(rec.subject)
                and (rec.invite is None or rec.invite not in self.used_invites)
            ):
                self.members[rec.subject] = MemberInfo(level, rec.role or "node", rec.name, rec.ts)
                if rec.invite is not None:
                    self.used_invites.add(rec.invite)
        elif rec.kind == "member.level_changed":
            info = self.members.get(rec.subject)
            if (
                signer == Level.ANCHOR
                and info is not None
                and rec.level is not None
                and rec.subject != self.community_id
            ):
                info.level = Level.parse(rec.level)
        elif rec.kind == "member.revoked":
            if signer == Level.ANCHOR and rec.subject != self.community_id:
                self.members.pop(rec.subject, None)
                self.revoked.add(rec.subject)
        elif (
            rec.kind == "token.revoked"
            and rec.iss is not None
            and (signer == Level.ANCHOR or rec.by == rec.iss)
        ):
            self.revoked_tokens.add((rec.iss, rec.subject))
        elif rec.kind == "pubsub.rules" and signer == Level.ANCHOR and rec.rules is not None:
            self.pubsub_rules = rec.rules or None


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
        self.dir.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record.to_json(), separators=(",", ":"), ensure_ascii=False) + "\n"
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())


def open_membership(store: CommunityStore, keys: KeyPair, *, name: str, now_ms: int) -> Membership:
    """Load the node's community, creating a single-node community on first start.

    A node started without a community founds one of its own (spec §1.5), so
    ``hearthnet node start`` works with no arguments.
    """
    records = store.load()
    if not records:
        genesis = MembershipRecord.create(
            keys, "community.created", keys.node_id, keys.node_id, now_ms=now_ms, name=name
        )
        store.append(genesis)
        records = [genesis]
    created = [r for r in records if r.kind == "community.created"]
    if not created:
        raise StorageError(f"{store.path}: no community.created record")
    membership = Membership(community_id=created[0].community)
    for rec in records:
        membership.records[rec.id] = rec
    membership._refold()
    return membership
