"""Authentication of calls, requests and sessions (spec §1.4, §1.6, §2.2).

Pure: the caller passes the time; state is the membership view and the replay cache.
Every refusal is reported to ``on_failure(reason)`` (the node counts them in
``hearthnet_signature_failures_total{reason}``) and raised as a :class:`WireError`.

Order of checks for a signed object, cheapest refusal first:
membership of ``from`` (unauthorized/revoked) → community → clock window (expired) →
signature (invalid_signature) → replay cache (replayed). The replay cache is only
written after the signature verified, so unsigned junk cannot poison it. A request that
names another community is a federated member's (spec §8): its membership and the
agreement in force are checked first, by :meth:`Authenticator.caller_for_federated`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hearthnet.bus.envelope import CallEnvelope, VerifiedCall, request_envelope
from hearthnet.caller import Caller
from hearthnet.community import Level
from hearthnet.errors import (
    BadRequest,
    Expired,
    InvalidSignature,
    Replayed,
    Revoked,
    Unauthorized,
    WireError,
)
from hearthnet.identity import verify_object
from hearthnet.ids import is_node_id, is_ulid
from hearthnet.membership import Membership
from hearthnet.replay import ReplayCache
from hearthnet.tokens import CapabilityToken
from hearthnet.transport.headers import SignedHeaders

if TYPE_CHECKING:
    from hearthnet.bus.signatures import SignatureWorker
    from hearthnet.federation.view import FederationView


VERIFIED_TOKENS = 1024  # verified tokens remembered by their text (oldest forgotten first)


class Authenticator:
    """Turns credentials into a :class:`Caller`, or refuses with the right wire code."""

    def __init__(
        self,
        *,
        node_id: str,
        membership: Membership,
        replay: ReplayCache,
        clock_window_ms: int = 60_000,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self.membership = membership
        self.replay = replay
        self.clock_window_ms = clock_window_ms
        self._on_failure = on_failure or (lambda reason: None)
        # spec §8: members of federated communities, for what the agreements grant (the
        # node sets it; None: nobody from another community is accepted)
        self.federation: FederationView | None = None
        # Tokens whose signature verified, by their text, with the caller made last: the
        # many sessions of one application's token share one decoded token and one Caller
        # (an idle pub/sub session holds its caller, spec §11). Every check but the
        # signature still runs on each use.
        self._tokens: dict[str, Caller] = {}
        # The caller made last for each member key (a signed call makes one per call):
        # reused while its kind and level are what membership says, checked on each call.
        self._members: dict[str, Caller] = {}

    @property
    def community_id(self) -> str:
        """The community this node belongs to."""
        return self.membership.community_id

    def _refuse(self, reason: str, error: WireError) -> WireError:
        self._on_failure(reason)
        return error

    def caller_for_identity(self, identity: str) -> Caller:
        """The caller for a member key (node or device), checking membership."""
        if self.membership.is_revoked(identity):
            raise self._refuse("revoked", Revoked("identity revoked"))
        level = self.membership.level_of(identity)
        if level is None:
            raise self._refuse("not_member", Unauthorized("not a member of this community"))
        info = self.membership.members[identity]
        kind = "device" if info.role == "device" else "node"
        known = self._members.get(identity)
        if known is not None and known.level == level and known.kind == kind:
            return known  # the checks above ran; only the (immutable) result is reused
        caller = Caller(identity, kind, level, None, identity == self.node_id)
        if known is None and len(self._members) >= VERIFIED_TOKENS:
            del self._members[next(iter(self._members))]  # the oldest
        self._members[identity] = caller
        return caller

    def caller_for_token(self, text: object, now_ms: int) -> Caller:
        """The caller for a capability token; checks signature, community, expiry, issuer."""
        known = self._tokens.get(text) if isinstance(text, str) else None
        if known is not None:
            assert known.token is not None
            token = known.token
        else:
            try:
                token = CapabilityToken.decode(text)
            except InvalidSignature as exc:
                raise self._refuse("bad_token", exc) from None
        if token.community != self.community_id:
            raise self._refuse("wrong_community", Unauthorized("token is for another community"))
        if token.exp_ms <= now_ms:
            raise self._refuse("token_expired", Expired("token expired"))
        if self.membership.is_revoked(token.iss):
            raise self._refuse("revoked", Revoked("token issuer revoked"))
        if self.membership.is_token_revoked(token.iss, token.jti):
            raise self._refuse("revoked", Revoked("token revoked"))
        rotated = self.membership.rotation_voiding(token)
        if rotated is not None:
            raise self._refuse(
                "revoked", Revoked(f"token voided by a key rotation of {rotated}; get a fresh one")
            )
        level = self.membership.level_of(token.iss)
        if level is None:
            raise self._refuse("not_member", Unauthorized("token issuer is not a member"))
        if known is not None and known.level == level:
            return known
        caller = Caller(token.identity, "token", level, token, False)
        if known is None and len(self._tokens) >= VERIFIED_TOKENS:
            del self._tokens[next(iter(self._tokens))]  # the oldest
        assert isinstance(text, str)
        self._tokens[text] = caller
        return caller

    def caller_for_federated(self, identity: str, community: str, now_ms: int) -> Caller:
        """The caller for a member of a federated community (spec §8): a token-like caller
        whose scopes are what our community grants its community (``sub`` for the granted
        topics, ``call`` for the granted capabilities), issued in effect by the anchor of
        ours that signed the newest agreement in force; its ``jti`` is that agreement's
        id, so revoking the agreement ends its sessions.

        Raises:
            Unauthorized / Revoked / Forbidden: see
                :meth:`~hearthnet.federation.view.FederationView.federated_caller`.
        """
        assert self.federation is not None
        try:
            peer = self.federation.federated_caller(identity, community, now_ms)
        except WireError as exc:
            raise self._refuse("federation", exc) from None
        newest = peer.agreements[0]
        grant = CapabilityToken(
            iss=newest.signer_of(self.community_id) or self.community_id,
            sub=identity,
            community=self.community_id,
            scopes=peer.grant.scopes(),
            exp_ms=min(a.expires_ms for a in peer.agreements),
            jti=newest.id,
            sig=newest.sig_a,
        )
        return Caller(identity, "federated", Level.MEMBER, grant, False)

    def _admit_signed(self, sender: str, community: str, ts: int, now_ms: int) -> Caller:
        """The checks before the signature: membership, community, clock window."""
        if community != self.community_id and self.federation is not None:
            caller = self.caller_for_federated(sender, community, now_ms)
        else:
            caller = self.caller_for_identity(sender)
        if community != self.community_id and caller.kind != "federated":
            raise self._refuse("wrong_community", Unauthorized("request is for another community"))
        if abs(now_ms - ts) > self.clock_window_ms:
            raise self._refuse(
                "expired", Expired(f"timestamp is {abs(now_ms - ts)} ms from this node's clock")
            )
        return caller

    def _record(self, sender: str, request_id: str, now_ms: int) -> None:
        """The check after the signature: the replay cache (written only for signatures
        that verified, so unsigned junk cannot fill it)."""
        try:
            self.replay.check_and_add(sender, request_id, now_ms)
        except Replayed as exc:
            raise self._refuse("replayed", exc) from None

    def _check_signed(
        self,
        obj: dict[str, Any],
        *,
        sender: str,
        community: str,
        ts: int,
        request_id: str,
        signature: object,
        now_ms: int,
    ) -> Caller:
        caller = self._admit_signed(sender, community, ts, now_ms)
        try:
            verify_object(sender, obj, signature)
        except InvalidSignature as exc:
            raise self._refuse("bad_signature", exc) from None
        self._record(sender, request_id, now_ms)
        return caller

    def authenticate_call(
        self,
        envelope_obj: object,
        *,
        signature: object,
        token: object,
        now_ms: int,
        target: str | None = None,
        deadline_ms: int | None = None,
    ) -> VerifiedCall:
        """Verify a call envelope signed by ``from``, or carried by a token.

        Raises:
            BadRequest: malformed envelope or both/neither credential.
            WireError: the code of spec §2.4 for the refusal.
        """
        envelope, by_token = self._open_call(envelope_obj, signature, token, now_ms)
        if by_token is not None:
            return VerifiedCall(envelope, by_token, None, str(token), target, deadline_ms)
        assert envelope.sender is not None  # checked by _open_call
        assert isinstance(envelope_obj, dict)  # checked by from_json
        caller = self._check_signed(
            envelope_obj,
            sender=envelope.sender,
            community=envelope.community,
            ts=envelope.ts,
            request_id=envelope.request_id,
            signature=signature,
            now_ms=now_ms,
        )
        return VerifiedCall(envelope, caller, str(signature), None, target, deadline_ms)

    def _open_call(
        self, envelope_obj: object, signature: object, token: object, now_ms: int
    ) -> tuple[CallEnvelope, Caller | None]:
        """The envelope, and the caller when a token carries the call (None: signed)."""
        envelope = CallEnvelope.from_json(envelope_obj)
        if (signature is None) == (token is None):
            raise BadRequest("a call carries exactly one of signature and token")
        if token is not None:
            caller = self.caller_for_token(token, now_ms)
            if envelope.community != self.community_id:
                raise self._refuse("wrong_community", Unauthorized("call is for another community"))
            return envelope, caller
        if envelope.sender is None:
            raise BadRequest("a signed call names its sender in from")
        return envelope, None

    async def authenticate_call_on(
        self,
        checks: SignatureWorker,
        envelope_obj: object,
        *,
        signature: object,
        token: object,
        now_ms: int,
        target: str | None = None,
        deadline_ms: int | None = None,
    ) -> VerifiedCall:
        """:meth:`authenticate_call` with the signature checked on ``checks``' worker
        thread: the same checks in the same order, with the same refusals.

        Raises:
            BadRequest: malformed envelope or both/neither credential.
            WireError: the code of spec §2.4 for the refusal.
        """
        envelope, by_token = self._open_call(envelope_obj, signature, token, now_ms)
        if by_token is not None:
            return VerifiedCall(envelope, by_token, None, str(token), target, deadline_ms)
        sender = envelope.sender
        assert sender is not None  # checked by _open_call
        caller = self._admit_signed(sender, envelope.community, envelope.ts, now_ms)
        assert isinstance(envelope_obj, dict)  # checked by from_json
        try:
            await checks.check(sender, envelope_obj, signature)
        except InvalidSignature as exc:
            raise self._refuse("bad_signature", exc) from None
        self._record(sender, envelope.request_id, now_ms)
        return VerifiedCall(envelope, caller, str(signature), None, target, deadline_ms)

    def authenticate_headers(
        self, *, method: str, path: str, body: Any, signed: SignedHeaders, now_ms: int
    ) -> Caller:
        """:meth:`authenticate_request` with the credentials read from the headers."""
        return self.authenticate_request(
            method=method,
            path=path,
            body=body,
            request_id=signed.request_id,
            sender=signed.sender,
            community=signed.community,
            ts=signed.ts,
            signature=signed.signature,
            token=signed.token,
            now_ms=now_ms,
        )

    def authenticate_request(
        self,
        *,
        method: str,
        path: str,
        body: Any,
        request_id: object,
        sender: object,
        community: object,
        ts: object,
        signature: object,
        token: object,
        now_ms: int,
    ) -> Caller:
        """Verify a signed non-call HTTP request (request envelope of spec §2.2) or a token."""
        if token is not None:
            return self.caller_for_token(token, now_ms)
        if signature is None:
            raise self._refuse(
                "missing",
                Unauthorized(
                    "signed headers or a token are required"
                    " (X-HearthNet-Token, or Authorization: Bearer hnt1:...)"
                ),
            )
        if not is_node_id(sender) or not is_node_id(community):
            raise BadRequest("X-HearthNet-From and X-HearthNet-Community must be NodeIDs")
        if not is_ulid(request_id):
            raise BadRequest("X-HearthNet-Request-Id must be a ULID")
        if not isinstance(ts, int):
            raise BadRequest("X-HearthNet-Timestamp must be integer Unix milliseconds")
        assert isinstance(sender, str)
        assert isinstance(community, str)
        assert isinstance(request_id, str)
        envelope = request_envelope(
            method=method,
            path=path,
            body=body,
            request_id=request_id,
            sender=sender,
            community=community,
            ts=ts,
        )
        return self._check_signed(
            envelope,
            sender=sender,
            community=community,
            ts=ts,
            request_id=request_id,
            signature=signature,
            now_ms=now_ms,
        )

    def _session_community(self, identity: str) -> str:
        """The community an identity proof speaks for. The proof names this node, not a
        community: ours for our members (and for strangers, who are refused as such), the
        federated community whose member ``identity`` is otherwise (spec §8), so that a
        federated member's session gets its grant as its signed requests do."""
        membership = self.membership
        if (
            self.federation is None
            or membership.level_of(identity) is not None
            or membership.is_revoked(identity)
        ):
            return self.community_id
        return self.federation.community_of(identity) or self.community_id

    def authenticate_session(self, frame: dict[str, Any], now_ms: int) -> Caller:
        """Verify a WebSocket ``auth`` frame (spec §2.2): a token, or an identity proof.

        The identity proof signs ``{identity, ts, nonce, node: <this node>}``;
        ``nonce_seen`` reports (and records) whether the nonce was used before.
        """
        if "token" in frame:
            return self.caller_for_token(frame["token"], now_ms)
        identity, ts, nonce, sig = (frame.get(k) for k in ("identity", "ts", "nonce", "sig"))
        if (
            not is_node_id(identity)
            or not isinstance(ts, int)
            or not isinstance(nonce, str)
            or not 8 <= len(nonce) <= 128
        ):
            raise BadRequest("auth needs token, or identity, ts, nonce (8..128 chars) and sig")
        assert isinstance(identity, str)
        proof = {"identity": identity, "ts": ts, "nonce": nonce, "node": self.node_id}
        return self._check_signed(
            proof,
            sender=identity,
            community=self._session_community(identity),
            ts=ts,
            request_id="auth:" + nonce,
            signature=sig,
            now_ms=now_ms,
        )
