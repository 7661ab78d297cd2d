"""Invites and joining a community (spec §1.5). Pure apart from the HTTP call in
:func:`redeem_invite`.

An invite is ``{community, inviter, level, expires_ms, bootstrap: [urls], nonce}`` signed
by the inviter (an anchor or trusted member), carried as ``hn1:`` + base64url(JCS). The
joining node sends a *join request* to a bootstrap node, signed with its own key so the
invite cannot be redeemed for someone else's key. The admitting node checks both and signs
a ``member.added`` record that names the invite's nonce; the membership fold refuses a
second record with the same nonce, so an invite works once, mesh-wide.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from hearthnet.canonical import canonicalize, parse_json
from hearthnet.clock import now_ms
from hearthnet.community import CommunityStore, Level, MembershipRecord
from hearthnet.errors import (
    BadRequest,
    Expired,
    InvalidSignature,
    Revoked,
    Unauthorized,
    Unavailable,
    WireError,
    error_from_wire,
)
from hearthnet.identity import KeyPair, load_or_create_keys, verify_object
from hearthnet.ids import b64url_decode, b64url_encode, is_node_id
from hearthnet.membership import Membership, Source
from hearthnet.mesh.addresses import PeerBook, normalize_url

INVITE_PREFIX = "hn1:"
MAX_INVITE_CHARS = 4096
MAX_INVITE_RELAYS = 8
JOIN_WINDOW_MS = 60_000
EXPIRED_INVITE = (
    "the invite expired (print another with hearthnet community invite --ttl 24h on a"
    " member's node)"
)
# a join's refusals that no other bootstrap node or relay would answer otherwise (the
# invite was used, expired, or its inviter may not invite): said as they are
_REFUSALS = frozenset({"unauthorized", "expired", "revoked", "invalid_signature"})
RELAY_JOIN_PATH = "/mesh/v1/relay/join"  # spec §8: a relay carries a join to the inviter


@dataclass(frozen=True, slots=True)
class Invite:
    """A verified invite."""

    community: str
    inviter: str
    level: Level
    expires_ms: int
    bootstrap: tuple[str, ...]
    nonce: str
    sig: str
    relays: tuple[str, ...] = ()  # spec §8: relay URLs the new member attaches to

    @classmethod
    def issue(
        cls,
        inviter: KeyPair,
        *,
        community: str,
        level: Level,
        ttl_ms: int,
        now_ms: int,
        bootstrap: list[str],
        nonce: str,
        relays: list[str] | None = None,
    ) -> Invite:
        """Sign a new invite (``relays``: relay URLs for a member behind NAT, spec §8)."""
        body: dict[str, Any] = {
            "community": community,
            "inviter": inviter.node_id,
            "level": level.label,
            "expires_ms": now_ms + ttl_ms,
            "bootstrap": [normalize_url(u) for u in bootstrap],
            "nonce": nonce,
        }
        if relays:  # absent when empty: such an invite reads as before
            body["relays"] = [normalize_url(u) for u in relays]
        body["sig"] = inviter.sign_object(body)
        return cls.from_json(body)

    @classmethod
    def from_json(cls, obj: object) -> Invite:
        """Validate and verify."""
        if not isinstance(obj, dict) or set(obj) - {"relays"} != {
            "community",
            "inviter",
            "level",
            "expires_ms",
            "bootstrap",
            "nonce",
            "sig",
        }:
            raise BadRequest(
                "an invite has community, inviter, level, expires_ms, bootstrap, nonce, sig"
                " (and relays)"
            )
        if not (is_node_id(obj["community"]) and is_node_id(obj["inviter"])):
            raise BadRequest("invite community and inviter are NodeIDs")
        if (
            not isinstance(obj["expires_ms"], int)
            or not isinstance(obj["nonce"], str)
            or not 8 <= len(obj["nonce"]) <= 64
        ):
            raise BadRequest("invite expires_ms is an integer and nonce 8..64 characters")
        if not isinstance(obj["bootstrap"], list) or len(obj["bootstrap"]) > 16:
            raise BadRequest("invite bootstrap is a list of at most 16 URLs")
        bootstrap = tuple(normalize_url(u) for u in obj["bootstrap"])
        raw_relays = obj.get("relays", [])
        if not isinstance(raw_relays, list) or len(raw_relays) > MAX_INVITE_RELAYS:
            raise BadRequest(f"invite relays is a list of at most {MAX_INVITE_RELAYS} URLs")
        relays = tuple(normalize_url(u) for u in raw_relays)
        level = Level.parse(obj["level"])
        verify_object(obj["inviter"], obj, obj["sig"], "sig")
        return cls(
            obj["community"],
            obj["inviter"],
            level,
            obj["expires_ms"],
            bootstrap,
            obj["nonce"],
            obj["sig"],
            relays,
        )

    def to_json(self) -> dict[str, Any]:
        """Wire form."""
        return {
            "community": self.community,
            "inviter": self.inviter,
            "level": self.level.label,
            "expires_ms": self.expires_ms,
            "bootstrap": list(self.bootstrap),
            "nonce": self.nonce,
            "sig": self.sig,
            **({"relays": list(self.relays)} if self.relays else {}),
        }

    def encode(self) -> str:
        """``hn1:`` + base64url of the canonical JSON."""
        return INVITE_PREFIX + b64url_encode(canonicalize(self.to_json()))

    @classmethod
    def decode(cls, text: object) -> Invite:
        """Parse ``hn1:...``.

        Raises:
            InvalidSignature: malformed or forged.
        """
        if (
            not isinstance(text, str)
            or not text.startswith(INVITE_PREFIX)
            or len(text) > MAX_INVITE_CHARS
        ):
            raise InvalidSignature("an invite starts with 'hn1:'")
        try:
            return cls.from_json(parse_json(b64url_decode(text[len(INVITE_PREFIX) :])))
        except (ValueError, BadRequest) as exc:
            raise InvalidSignature(f"malformed invite: {exc}") from exc


def join_request(keys: KeyPair, invite: Invite, *, name: str, now_ms: int) -> dict[str, Any]:
    """The signed body a joining node sends to ``POST /mesh/v1/join``."""
    body: dict[str, Any] = {
        "invite": invite.encode(),
        "node": keys.node_id,
        "name": name[:128],
        "community": invite.community,
        "ts": now_ms,
    }
    body["sig"] = keys.sign_object(body)
    return body


def check_join_request(membership: Membership, request: object, now: int) -> Invite:
    """Check a join request as any member can (everything :func:`admit` checks but the
    admitting node's own right to add members); return its invite. A relay checks this
    much before it carries a not-yet-member's join to the inviter (spec §8).

    Raises: as :func:`admit`.
    """
    if not isinstance(request, dict) or set(request) != {
        "invite",
        "node",
        "name",
        "community",
        "ts",
        "sig",
    }:
        raise BadRequest("a join request has invite, node, name, community, ts, sig")
    invite = Invite.decode(request["invite"])
    node = request["node"]
    if (
        not is_node_id(node)
        or not isinstance(request["ts"], int)
        or not isinstance(request["name"], str)
    ):
        raise BadRequest("join request node is a NodeID, ts an integer, name a string")
    verify_object(node, request, request["sig"], "sig")
    if abs(now - request["ts"]) > JOIN_WINDOW_MS:
        raise Expired("join request timestamp outside the window")
    if invite.community != membership.community_id or request["community"] != invite.community:
        raise Unauthorized("the invite is for another community")
    if invite.expires_ms <= now:
        raise Expired(EXPIRED_INVITE)
    if membership.is_revoked(node) or membership.is_revoked(invite.inviter):
        raise Revoked("the joining node or the inviter is revoked")
    inviter_level = membership.level_of(invite.inviter)
    if inviter_level is None or inviter_level < Level.TRUSTED or invite.level > inviter_level:
        raise Unauthorized("the inviter may not invite at that level")
    if invite.nonce in membership.used_invites:
        raise Unauthorized(
            "this invite was already used (an invite admits one node: print another with"
            " hearthnet community invite on a member's node)"
        )
    if membership.level_of(node) is not None:
        raise BadRequest("that node is already a member")
    return invite


def admit(admitter: KeyPair, membership: Membership, request: object, now: int) -> MembershipRecord:
    """Check a join request and return the ``member.added`` record to apply.

    Raises:
        BadRequest: malformed request.
        InvalidSignature: the invite or the request does not verify.
        Expired: the invite expired, or the request's ``ts`` is outside the window.
        Unauthorized: wrong community, inviter not allowed to invite at that level, or this
            node may not add members.
        Revoked: the joining identity or the inviter was revoked.
    """
    invite = check_join_request(membership, request, now)
    assert isinstance(request, dict)
    node = request["node"]
    own = membership.level_of(admitter.node_id)
    if own is None or own < Level.TRUSTED or invite.level > own:
        raise Unauthorized(
            "this node may not add members; use a bootstrap node of an anchor or trusted member"
        )
    return membership.sign(
        admitter,
        "member.added",
        node,
        now_ms=now,
        level=invite.level,
        name=request["name"][:128] or None,
        invite=invite.nonce,
    )


def sign_join_answer(
    admitter: KeyPair, answer: dict[str, Any], added: MembershipRecord
) -> dict[str, Any]:
    """``answer`` signed by the admitting node for the join that ``added`` records: it
    names the admitter, the joining node and the invite's nonce, so it is good for that
    join only, and nobody who carries it (a relay) can add, drop or change a record."""
    signed = {**answer, "admitter": admitter.node_id, "node": added.subject, "invite": added.invite}
    signed["sig"] = admitter.sign_object(signed)
    return signed


def answer_source(answer: dict[str, Any], invite: Invite, node: str) -> Source:
    """How far a join answer is trusted (spec §1.5, §8): signed by the invite's inviter
    for this very join, as far as the inviter's own store (:attr:`Source.STORE`, legacy
    records included); otherwise as records from the network (:attr:`Source.JOIN`:
    chained records only, so whoever served the answer cannot add one).

    Raises:
        InvalidSignature: the answer names the inviter as its signer but does not
            verify, or was signed for another join.
    """
    if answer.get("admitter") != invite.inviter:
        return Source.JOIN
    verify_object(invite.inviter, answer, answer.get("sig"), "sig")
    if answer.get("node") != node or answer.get("invite") != invite.nonce:
        raise InvalidSignature("the join answer was signed for another join")
    return Source.STORE


def _answer_records(
    answer: Any, invite: Invite, node: str, *, relayed: bool
) -> tuple[list[MembershipRecord], Source]:
    """The verified records of a join answer and how far they are trusted.

    Raises:
        WireError: a malformed answer or record, or one a relay carried that the
            inviter did not sign (spec §8: only the inviter answers a relayed join).
    """
    if not isinstance(answer, dict):
        raise BadRequest("the join answer is not an object")
    source = answer_source(answer, invite, node)
    if relayed and source is not Source.STORE:
        raise InvalidSignature("the relay's answer is not signed by the inviter")
    raw = answer.get("records", [])
    if not isinstance(raw, list):
        raise BadRequest("the join answer's records are a list")
    return [MembershipRecord.parse(r) for r in raw], source


def _remember_addresses(data_dir: Path, invite: Invite, bootstrap: list[str]) -> None:
    """The bootstrap URLs (the invite's and the answer's) as peers, the invite's relays as
    relays (spec §8: attached to from now on, mesh/relaying.py)."""
    book = PeerBook(data_dir / "mesh" / "peers.json")
    book.load()
    for peer in {*invite.bootstrap, *bootstrap}:
        book.add(peer, source="bootstrap")
    for relay in invite.relays:
        entry = book.add(relay, source="relay")
        if entry is not None:
            entry.source = "relay"  # also when it is a bootstrap address too
    book.dirty = True
    book.save()


async def redeem_invite(data_dir: Path, token: str, *, name: str) -> bool:
    """``hearthnet node start --join TOKEN``: join the invite's community before starting.

    Asks the invite's bootstrap nodes in turn to admit this node, verifies the records it
    gets back (the community's whole signed membership log, in which this node must now be
    a member), stores them in place of the node's own community, and remembers the
    bootstrap URLs as peers and the relay URLs as relays (spec §8). Returns False when
    this node already belongs to it.

    Raises:
        InvalidSignature / Expired: a bad or expired invite.
        Unauthorized / Expired / Revoked: a node that got the request refused it (the
            invite was used already, expired, or its inviter may not invite), with its
            message, which says what to do.
        Unavailable: no bootstrap node could admit us (their last error is in the message).
    """
    keys = load_or_create_keys(data_dir)
    invite = Invite.decode(token)
    if invite.expires_ms <= now_ms():
        raise Expired(EXPIRED_INVITE)
    store = CommunityStore(data_dir)
    existing = store.load()
    if any(r.community == invite.community and r.subject == keys.node_id for r in existing):
        return False
    if not invite.bootstrap and not invite.relays:
        raise BadRequest("the invite names no bootstrap node or relay to join through")
    errors: list[str] = []  # each way's failure, all in the message when none admits us
    refused: WireError | None = None  # the inviter's refusal, the same on every way
    # spec §8: the bootstrap nodes first; then the invite's relays, which carry the join
    # to the inviter attached to them (an inviter behind NAT has no reachable URL)
    ways = [(url, url + "/mesh/v1/join", False) for url in invite.bootstrap]
    ways += [(url, url + RELAY_JOIN_PATH, True) for url in invite.relays]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=15)) as http:
        for url, endpoint, relayed in ways:
            body = join_request(keys, invite, name=name, now_ms=now_ms())
            if relayed:
                body = {"to": invite.inviter, "request": body}
            try:
                async with http.post(endpoint, json=body) as resp:
                    answer = await resp.json(content_type=None)
            except (aiohttp.ClientError, OSError, ValueError) as exc:
                errors.append(f"{url}: {str(exc) or type(exc).__name__}")
                continue
            if resp.status != 200:
                error = (
                    answer.get("error", resp.status) if isinstance(answer, dict) else resp.status
                )
                message = answer.get("message", "") if isinstance(answer, dict) else ""
                errors.append(f"{url}: {error} {message}")
                if error in _REFUSALS and isinstance(answer, dict):
                    refused = error_from_wire(answer)
                continue
            try:
                records, source = _answer_records(answer, invite, keys.node_id, relayed=relayed)
            except WireError as exc:
                errors.append(f"{url}: {exc.code} {exc.message}")
                continue
            view = Membership(invite.community)
            kept = view.add_all(records, source).accepted
            if view.level_of(keys.node_id) is None:
                errors.append(f"{url}: the answer does not make this node a member")
                continue
            store.replace(list(kept))
            _remember_addresses(data_dir, invite, answer.get("bootstrap", []))
            return True
    if refused is not None:  # said by a node that got the request, not a way that failed
        raise refused
    raise Unavailable(
        f"could not join: {'; '.join(errors) or 'no bootstrap node answered'} (a node named"
        " in the invite must be running and reachable from here: start it, or make the"
        " invite again with --bootstrap URL of a member this node can reach)"
    )
