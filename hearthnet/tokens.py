"""Capability tokens for clients that are not nodes (spec §1.6).

A token is ``{iss, sub, community, scopes, exp_ms, jti, iat_ms?, sig}`` signed by ``iss`` over
the JCS form without ``sig``, carried as ``"hnt1:" + base64url(JCS of the whole object)``.
A scope is ``{"pub"|"sub"|"call": pattern}``; ``call`` patterns are capability names
with an optional version (``llm.chat@2``, ``echo``, ``llm.**``).

Parsing verifies the signature; expiry, membership of the issuer and revocation need
the clock and the community and are checked by :mod:`hearthnet.auth`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hearthnet.canonical import canonicalize, parse_json
from hearthnet.errors import BadRequest, InvalidSignature
from hearthnet.identity import KeyPair, verify_object
from hearthnet.ids import b64url_decode, b64url_encode, is_node_id, new_ulid
from hearthnet.pubsub.topics import TopicPattern, pattern_covers, patterns_overlap

TOKEN_PREFIX = "hnt1:"  # noqa: S105 - a format prefix, not a secret
MAX_TOKEN_CHARS = 8192
MAX_SCOPES = 64
# ``console`` (pattern ``node``): opens the web console's data (hearthnet.console.access)
SCOPE_KINDS = ("pub", "sub", "call", "console")


@dataclass(frozen=True, slots=True)
class Scope:
    """One grant: publish to, subscribe to, or call what ``pattern`` matches."""

    kind: str
    pattern: str

    @classmethod
    def parse(cls, text: str) -> Scope:
        """Parse the CLI form ``kind:pattern`` (``sub:chat.**``, ``call:llm.chat@2``)."""
        kind, sep, pattern = text.partition(":")
        if not sep:
            raise BadRequest(
                f"scope {text!r} must look like sub:PATTERN, pub:PATTERN or call:NAME[@MAJOR]"
            )
        return cls.from_json({kind: pattern})

    @classmethod
    def from_json(cls, obj: object) -> Scope:
        """Parse the wire form ``{"sub": "chat.**"}``."""
        if not isinstance(obj, dict) or len(obj) != 1:
            raise BadRequest("a scope is an object with one key: pub, sub, call or console")
        ((kind, pattern),) = obj.items()
        if kind not in SCOPE_KINDS or not isinstance(pattern, str):
            raise BadRequest(f"unknown scope kind {kind!r}: pub, sub, call or console")
        name, _, version = pattern.partition("@")
        TopicPattern.parse(name)
        if version and kind != "call":
            raise BadRequest("only call scopes carry a version")
        if (version and not all(p.isdigit() for p in version.split("."))) or version.count(".") > 1:
            raise BadRequest(f"scope version {version!r} must be MAJOR or MAJOR.MINOR")
        return cls(kind, pattern)

    def to_json(self) -> dict[str, str]:
        """Wire form."""
        return {self.kind: self.pattern}

    def allows_topic(self, kind: str, topic: str) -> bool:
        """Whether this scope grants ``kind`` (pub/sub) on the concrete ``topic``."""
        return self.kind == kind and TopicPattern.parse(self.pattern).matches(topic)

    def allows_subscription(self, pattern: str) -> bool:
        """Whether a subscription to ``pattern`` stays inside this sub scope.

        A wildcard subscription is allowed only when every topic it can match is
        matched by the scope (``chat.*`` is inside ``chat.**``; ``chat.**`` is not
        inside ``chat.*``).
        """
        if self.kind != "sub":
            return False
        return pattern_covers(self.pattern, pattern)

    def allows_call(self, name: str, version: str) -> bool:
        """Whether this scope grants calling capability ``name`` at ``version``."""
        if self.kind != "call":
            return False
        pattern, _, want = self.pattern.partition("@")
        if not TopicPattern.parse(pattern).matches(name):
            return False
        if not want:
            return True
        have = version.split(".")
        return want.split(".") == have[: len(want.split("."))]


@dataclass(frozen=True, slots=True)
class CapabilityToken:
    """A verified capability token."""

    iss: str
    sub: str
    community: str
    scopes: tuple[Scope, ...]
    exp_ms: int
    jti: str
    sig: str
    # when it was issued; a topic key rotation (``topic.rotated``) voids tokens issued at
    # or before it, and tokens without ``iat_ms`` (issued before it existed) always
    iat_ms: int | None = None

    @classmethod
    def issue(
        cls,
        issuer: KeyPair,
        *,
        community: str,
        scopes: list[Scope],
        ttl_ms: int,
        now_ms: int,
        sub: str | None = None,
    ) -> CapabilityToken:
        """Issue and sign a token valid for ``ttl_ms`` from ``now_ms``."""
        if not scopes:
            raise BadRequest("a token needs at least one scope")
        jti = new_ulid(now_ms)
        body: dict[str, Any] = {
            "iss": issuer.node_id,
            "sub": sub or f"client-{jti[-10:].lower()}",
            "community": community,
            "scopes": [s.to_json() for s in scopes],
            "exp_ms": now_ms + ttl_ms,
            "jti": jti,
            "iat_ms": now_ms,
        }
        body["sig"] = issuer.sign_object(body)
        return cls.from_json(body)

    @classmethod
    def from_json(cls, obj: object) -> CapabilityToken:
        """Validate and verify a decoded token object."""
        if not isinstance(obj, dict):
            raise BadRequest("a token is an object")
        if set(obj) - {"iat_ms"} != {"iss", "sub", "community", "scopes", "exp_ms", "jti", "sig"}:
            raise BadRequest(
                "a token has exactly iss, sub, community, scopes, exp_ms, jti, sig (and iat_ms)"
            )
        iat_ms = obj.get("iat_ms")
        if iat_ms is not None and (not isinstance(iat_ms, int) or isinstance(iat_ms, bool)):
            raise BadRequest("token iat_ms must be an integer")
        iss, sub, community, scopes, exp_ms, jti = (
            obj["iss"],
            obj["sub"],
            obj["community"],
            obj["scopes"],
            obj["exp_ms"],
            obj["jti"],
        )
        if not (is_node_id(iss) and is_node_id(community)):
            raise BadRequest("token iss and community must be NodeIDs")
        if not isinstance(sub, str) or not sub or len(sub) > 128:
            raise BadRequest("token sub must be a string of 1..128 characters")
        if not isinstance(jti, str) or not jti or len(jti) > 64:
            raise BadRequest("token jti must be a string of 1..64 characters")
        if not isinstance(exp_ms, int) or isinstance(exp_ms, bool):
            raise BadRequest("token exp_ms must be an integer")
        if not isinstance(scopes, list) or not 1 <= len(scopes) <= MAX_SCOPES:
            raise BadRequest(f"token scopes must be a list of 1..{MAX_SCOPES}")
        parsed = tuple(Scope.from_json(s) for s in scopes)
        verify_object(iss, obj, obj["sig"], "sig")
        return cls(iss, sub, community, parsed, exp_ms, jti, obj["sig"], iat_ms)

    @classmethod
    def decode(cls, text: object) -> CapabilityToken:
        """Parse ``hnt1:...`` and verify its signature.

        Raises:
            BadRequest: not a token string.
            InvalidSignature: it does not verify.
        """
        if not isinstance(text, str) or not text.startswith(TOKEN_PREFIX):
            raise InvalidSignature("a token starts with 'hnt1:'")
        if len(text) > MAX_TOKEN_CHARS:
            raise InvalidSignature("token too long")
        try:
            obj = parse_json(b64url_decode(text[len(TOKEN_PREFIX) :]))
            return cls.from_json(obj)
        except (ValueError, BadRequest) as exc:
            raise InvalidSignature(f"malformed token: {exc}") from exc

    def to_json(self) -> dict[str, Any]:
        """Wire form (with ``sig``)."""
        return {
            "iss": self.iss,
            "sub": self.sub,
            "community": self.community,
            "scopes": [s.to_json() for s in self.scopes],
            "exp_ms": self.exp_ms,
            "jti": self.jti,
            **({"iat_ms": self.iat_ms} if self.iat_ms is not None else {}),
            "sig": self.sig,
        }

    def encode(self) -> str:
        """``hnt1:`` + base64url of the canonical JSON."""
        return TOKEN_PREFIX + b64url_encode(canonicalize(self.to_json()))

    @property
    def identity(self) -> str:
        """The identity a token session acts as: ``token:<jti>``."""
        return f"token:{self.jti}"

    def allows_call(self, name: str, version: str) -> bool:
        """Whether some scope grants calling ``name@version``."""
        return any(s.allows_call(name, version) for s in self.scopes)

    def allows_topic(self, kind: str, topic: str) -> bool:
        """Whether some scope grants ``pub``/``sub`` on ``topic``."""
        return any(s.allows_topic(kind, topic) for s in self.scopes)

    def allows_subscription(self, pattern: str) -> bool:
        """Whether some sub scope covers every topic ``pattern`` can match."""
        return any(s.allows_subscription(pattern) for s in self.scopes)

    def voided_by_rotation(self, pattern: str, rotated_ms: int) -> bool:
        """Whether a key rotation of ``pattern`` at ``rotated_ms`` voids this token: it was
        issued at or before it (or carries no ``iat_ms``) and one of its pub/sub scopes
        reaches a topic that ``pattern`` matches."""
        if self.iat_ms is not None and self.iat_ms > rotated_ms:
            return False
        return any(
            s.kind in ("pub", "sub") and patterns_overlap(s.pattern, pattern) for s in self.scopes
        )
