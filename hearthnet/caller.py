"""Who is on the other end of a call, request or session, once authenticated."""

from __future__ import annotations

from dataclasses import dataclass, field

from hearthnet.community import Level
from hearthnet.tokens import CapabilityToken


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling, as established by authentication."""

    identity: str
    kind: str  # "node" | "device" | "token"
    level: Level
    token: CapabilityToken | None = None
    is_self: bool = False
    # Who owns durable consumers and presence: the identity for members, and
    # ``token:<issuer>/<sub>`` for token clients (stable across refreshed tokens). Made
    # once here: every publish's rate limit is keyed by it.
    owner: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        token = self.token
        owner = self.identity if token is None else f"token:{token.iss}/{token.sub}"
        object.__setattr__(self, "owner", owner)

    def may_call(self, name: str, version: str, min_level: Level) -> bool:
        """Level and (for tokens) scope check for calling ``name@version``."""
        if self.level < min_level:
            return False
        return self.token is None or self.token.allows_call(name, version)

    @property
    def sender(self) -> dict[str, str]:
        """The ``sender`` field of messages this caller publishes (spec §6.2)."""
        if self.token is not None:
            return {"kind": "token", "id": f"{self.token.iss}/{self.token.sub}"}
        return {"kind": self.kind, "id": self.identity}

    @property
    def rate_limited(self) -> bool:
        """The node's own identity is not rate limited (spec §2.5)."""
        return not self.is_self
