"""Federation agreements and their revocations (spec §8, community federation). Pure.

An agreement lets two communities share named topics and capabilities::

    {"kind": "federation.agreement", "id": ULID, "created_ms": int, "expires_ms": int,
     "community_a": CommunityID, "community_b": CommunityID,
     "a_grants_b": {"topics": [patterns], "capabilities": [names]},
     "b_grants_a": {"topics": [...], "capabilities": [...]},
     "signer_a": NodeID, "sig_a": "ed25519:...",
     "signer_b": NodeID, "sig_b": "ed25519:...",
     "bridges_a": [NodeID], "bridges_b": [NodeID]}

``bridges_a`` / ``bridges_b`` (optional, absent when empty) name the nodes of A (of B)
that act as its bridges: the only nodes of that community the other one takes on a
relay's peer link or in a relayed session (spec §8; :mod:`hearthnet.mesh.relay_federated`).
HTTP requests and calls from the other community's members do not depend on them.

The *terms* are every field but ``signer_*`` and ``sig_*``. Each side's anchor signs the
JCS form (spec §1.3) of the terms plus ``{"signer": <its NodeID>}``, so both sign the same
terms and neither signature depends on the other. A *proposal* is an agreement with only
``signer_a``/``sig_a``; the other community's anchor counter-signs it
(:meth:`Agreement.countersign`).

``a_grants_b.topics``: messages that members of A publish on these topics flow to B;
``a_grants_b.capabilities``: members of B may call these capabilities on A's nodes.
A capability name is ``name``, ``name@MAJOR`` or ``name@MAJOR.MINOR`` (the grammar of a
token's ``call`` scope, :class:`hearthnet.tokens.Scope`).

A revocation ``{"kind": "federation.revoked", "agreement": id, "by": NodeID, "ts": int,
"sig"}`` is signed by an anchor of either community. Whether signers are anchors needs
each community's membership view; that check is :mod:`hearthnet.federation.view`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hearthnet.canonical import canonicalize
from hearthnet.errors import BadRequest, PayloadTooLarge
from hearthnet.identity import KeyPair, verify_object
from hearthnet.ids import is_node_id, is_ulid
from hearthnet.pubsub.topics import TopicPattern, patterns_overlap
from hearthnet.tokens import Scope

AGREEMENT_KIND = "federation.agreement"
REVOCATION_KIND = "federation.revoked"
MAX_GRANT_ITEMS = 32  # topic patterns, and capability names, per direction
MAX_BRIDGES = 16  # bridge nodes named per community
MAX_RECORD_BYTES = 16 * 1024  # one agreement or revocation, canonical JSON
MAX_COUNT = 2**53 - 1  # canonical JSON integers (spec §1.3)
RESERVED_TOPICS = ("mesh.**", "node.*.inbox")

_TERMS = (
    "kind",
    "id",
    "created_ms",
    "expires_ms",
    "community_a",
    "community_b",
    "a_grants_b",
    "b_grants_a",
)


@dataclass(frozen=True, slots=True)
class Grant:
    """What one community grants the other: topics that flow to it, capabilities it may
    call."""

    topics: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()

    @classmethod
    def parse(cls, obj: object) -> Grant:
        """Validate ``{"topics": [...], "capabilities": [...]}``.

        Raises:
            BadRequest: not that shape, a bad pattern or name, or over
                :data:`MAX_GRANT_ITEMS`.
        """
        if not isinstance(obj, dict) or set(obj) != {"topics", "capabilities"}:
            raise BadRequest("a grant is {topics: [patterns], capabilities: [names]}")
        topics, caps = obj["topics"], obj["capabilities"]
        for items in (topics, caps):
            if not isinstance(items, list) or len(items) > MAX_GRANT_ITEMS:
                raise BadRequest(f"grant topics and capabilities are lists of {MAX_GRANT_ITEMS}")
        for pattern in topics:
            TopicPattern.parse(pattern)
            # spec §6.1: mesh.* (beacons, membership, agreements) and node inboxes stay
            # inside a community, whatever an agreement says
            if any(patterns_overlap(pattern, reserved) for reserved in RESERVED_TOPICS):
                raise BadRequest(
                    f"grant pattern {pattern!r} reaches {' or '.join(RESERVED_TOPICS)},"
                    " which are not federated"
                )
        for name in caps:
            if not isinstance(name, str):
                raise BadRequest("a granted capability is a name")
            Scope.from_json({"call": name})
        return cls(tuple(topics), tuple(caps))

    def to_json(self) -> dict[str, list[str]]:
        """Wire form."""
        return {"topics": list(self.topics), "capabilities": list(self.capabilities)}

    def covers_topic(self, topic: str) -> bool:
        """Whether a message on the concrete ``topic`` may flow under this grant."""
        return any(TopicPattern.parse(p).matches(topic) for p in self.topics)

    def covers_call(self, name: str, version: str) -> bool:
        """Whether calling ``name@version`` is granted."""
        return any(Scope("call", c).allows_call(name, version) for c in self.capabilities)

    def scopes(self) -> tuple[Scope, ...]:
        """The grant as token scopes: ``sub`` per topic pattern, ``call`` per capability
        (how a federated caller is checked by pub/sub access rules and the bus)."""
        return tuple(Scope("sub", p) for p in self.topics) + tuple(
            Scope("call", c) for c in self.capabilities
        )


def _count(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT:
        raise BadRequest(f"{name} is a non-negative integer")
    return value


def _bridges(value: object, name: str) -> tuple[str, ...]:
    if (
        not isinstance(value, list)
        or len(value) > MAX_BRIDGES
        or not all(is_node_id(n) for n in value)
        or len(set(value)) != len(value)
    ):
        raise BadRequest(f"{name} is a list of at most {MAX_BRIDGES} distinct NodeIDs")
    return tuple(value)


def _check_size(obj: dict[str, Any], what: str) -> None:
    if len(canonicalize(obj)) > MAX_RECORD_BYTES:
        raise PayloadTooLarge(f"a {what} is at most {MAX_RECORD_BYTES} bytes")


@dataclass(frozen=True, slots=True)
class Agreement:
    """A federation agreement (or a proposal: ``signer_b`` and ``sig_b`` None) whose
    signatures verify. Whether the signers are anchors is checked against membership
    views by :class:`hearthnet.federation.view.FederationView`."""

    id: str
    created_ms: int
    expires_ms: int
    community_a: str
    community_b: str
    a_grants_b: Grant
    b_grants_a: Grant
    signer_a: str
    sig_a: str
    signer_b: str | None = None
    sig_b: str | None = None
    bridges_a: tuple[str, ...] = ()  # community_a's nodes that bridge through relays
    bridges_b: tuple[str, ...] = ()

    @classmethod
    def propose(
        cls,
        anchor: KeyPair,
        *,
        agreement_id: str,
        community_a: str,
        community_b: str,
        a_grants_b: Grant,
        b_grants_a: Grant,
        now_ms: int,
        expires_ms: int,
        bridges_a: tuple[str, ...] = (),
        bridges_b: tuple[str, ...] = (),
    ) -> Agreement:
        """Sign a proposal as ``anchor`` of ``community_a`` (``bridges_*``: the nodes of
        each side that bridge through relays)."""
        if community_a == community_b:
            raise BadRequest("a community does not federate with itself")
        if expires_ms <= now_ms:
            raise BadRequest("an agreement expires after it is made")
        unsigned = cls(
            agreement_id,
            now_ms,
            expires_ms,
            community_a,
            community_b,
            a_grants_b,
            b_grants_a,
            anchor.node_id,
            "",
            bridges_a=_bridges(list(bridges_a), "bridges_a"),
            bridges_b=_bridges(list(bridges_b), "bridges_b"),
        )
        sig = anchor.sign_object({**unsigned.terms(), "signer": anchor.node_id})
        return cls.parse({**unsigned.to_json(), "sig_a": sig})

    def countersign(self, anchor: KeyPair) -> Agreement:
        """The agreement signed by ``anchor`` of ``community_b`` too."""
        sig = anchor.sign_object({**self.terms(), "signer": anchor.node_id})
        return replace(self, signer_b=anchor.node_id, sig_b=sig)

    @classmethod
    def parse(cls, obj: object) -> Agreement:
        """Validate and verify the signatures present.

        Raises:
            BadRequest: malformed. PayloadTooLarge: over :data:`MAX_RECORD_BYTES`.
            InvalidSignature: a signature does not verify.
        """
        if not isinstance(obj, dict) or obj.get("kind") != AGREEMENT_KIND:
            raise BadRequest(f"an agreement is an object of kind {AGREEMENT_KIND}")
        required = {*_TERMS, "signer_a", "sig_a"}
        optional = {"signer_b", "sig_b", "bridges_a", "bridges_b"}
        if not required <= set(obj) or set(obj) - required - optional:
            raise BadRequest(
                "an agreement has "
                + ", ".join(sorted(required))
                + " (and signer_b, sig_b, bridges_a, bridges_b)"
            )
        if ("signer_b" in obj) != ("sig_b" in obj):
            raise BadRequest("signer_b and sig_b come together")
        _check_size(obj, "federation agreement")
        if not is_ulid(obj["id"]):
            raise BadRequest("an agreement id is a ULID")
        for key in (
            "community_a",
            "community_b",
            "signer_a",
            *(["signer_b"] * ("signer_b" in obj)),
        ):
            if not is_node_id(obj[key]):
                raise BadRequest(f"agreement {key} is a NodeID")
        if obj["community_a"] == obj["community_b"]:
            raise BadRequest("a community does not federate with itself")
        agreement = cls(
            obj["id"],
            _count(obj["created_ms"], "created_ms"),
            _count(obj["expires_ms"], "expires_ms"),
            obj["community_a"],
            obj["community_b"],
            Grant.parse(obj["a_grants_b"]),
            Grant.parse(obj["b_grants_a"]),
            obj["signer_a"],
            obj["sig_a"],
            obj.get("signer_b"),
            obj.get("sig_b"),
            _bridges(obj.get("bridges_a", []), "bridges_a"),
            _bridges(obj.get("bridges_b", []), "bridges_b"),
        )
        terms = agreement.terms()
        verify_object(agreement.signer_a, {**terms, "signer": agreement.signer_a}, obj["sig_a"])
        if agreement.signer_b is not None:
            verify_object(agreement.signer_b, {**terms, "signer": agreement.signer_b}, obj["sig_b"])
        return agreement

    def terms(self) -> dict[str, Any]:
        """What both anchors sign (with their own ``signer``); ``bridges_*`` only when
        named (so agreements made before them verify unchanged)."""
        terms: dict[str, Any] = {
            "kind": AGREEMENT_KIND,
            "id": self.id,
            "created_ms": self.created_ms,
            "expires_ms": self.expires_ms,
            "community_a": self.community_a,
            "community_b": self.community_b,
            "a_grants_b": self.a_grants_b.to_json(),
            "b_grants_a": self.b_grants_a.to_json(),
        }
        if self.bridges_a:
            terms["bridges_a"] = list(self.bridges_a)
        if self.bridges_b:
            terms["bridges_b"] = list(self.bridges_b)
        return terms

    def to_json(self) -> dict[str, Any]:
        """Wire form."""
        out = {**self.terms(), "signer_a": self.signer_a, "sig_a": self.sig_a}
        if self.signer_b is not None:
            out["signer_b"] = self.signer_b
            out["sig_b"] = self.sig_b
        return out

    @property
    def complete(self) -> bool:
        """Signed by both sides (a proposal is not)."""
        return self.sig_b is not None

    @property
    def communities(self) -> tuple[str, str]:
        """``(community_a, community_b)``."""
        return (self.community_a, self.community_b)

    def other(self, community: str) -> str:
        """The party that is not ``community``."""
        return self.community_b if community == self.community_a else self.community_a

    def grant(self, from_community: str, to_community: str) -> Grant | None:
        """What ``from_community`` grants ``to_community`` here (None: not its parties)."""
        if (from_community, to_community) == (self.community_a, self.community_b):
            return self.a_grants_b
        if (from_community, to_community) == (self.community_b, self.community_a):
            return self.b_grants_a
        return None

    def bridges_of(self, community: str) -> tuple[str, ...]:
        """The nodes named as ``community``'s bridges (none for a non-party)."""
        if community == self.community_a:
            return self.bridges_a
        return self.bridges_b if community == self.community_b else ()

    def signer_of(self, community: str) -> str | None:
        """The anchor that signed for ``community``."""
        if community == self.community_a:
            return self.signer_a
        return self.signer_b if community == self.community_b else None


@dataclass(frozen=True, slots=True)
class Revocation:
    """A verified revocation of an agreement, signed by ``by``."""

    agreement: str
    by: str
    ts: int
    sig: str

    @classmethod
    def create(cls, anchor: KeyPair, agreement: str, now_ms: int) -> Revocation:
        """Sign a revocation of ``agreement`` as ``anchor``."""
        body: dict[str, Any] = {
            "kind": REVOCATION_KIND,
            "agreement": agreement,
            "by": anchor.node_id,
            "ts": now_ms,
        }
        return cls.parse({**body, "sig": anchor.sign_object(body)})

    @classmethod
    def parse(cls, obj: object) -> Revocation:
        """Validate and verify.

        Raises:
            BadRequest: malformed. InvalidSignature: the signature does not verify.
        """
        if not isinstance(obj, dict) or set(obj) != {"kind", "agreement", "by", "ts", "sig"}:
            raise BadRequest("a revocation is {kind, agreement, by, ts, sig}")
        if obj["kind"] != REVOCATION_KIND or not is_ulid(obj["agreement"]):
            raise BadRequest(f"a revocation is of kind {REVOCATION_KIND} and names a ULID")
        if not is_node_id(obj["by"]):
            raise BadRequest("a revocation's by is a NodeID")
        ts = _count(obj["ts"], "ts")
        verify_object(obj["by"], obj, obj["sig"], "sig")
        return cls(obj["agreement"], obj["by"], ts, obj["sig"])

    def to_json(self) -> dict[str, Any]:
        """Wire form."""
        return {
            "kind": REVOCATION_KIND,
            "agreement": self.agreement,
            "by": self.by,
            "ts": self.ts,
            "sig": self.sig,
        }
