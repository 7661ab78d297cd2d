"""Call and request envelopes (spec §2.2) and the verified call the bus accepts.

``CallEnvelope`` is plain data: what a caller signs. The bus only ever accepts a
:class:`VerifiedCall`, which :class:`hearthnet.auth.Authenticator` builds after checking
the signature or token, the clock window, replay and membership; an unverified call
never reaches a capability.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from hearthnet.caller import Caller
from hearthnet.errors import BadRequest
from hearthnet.ids import is_node_id, is_ulid
from hearthnet.shapes import Shape

_CAP_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]*(\.[a-z0-9][a-z0-9_-]*){0,15}\Z")
_VERSION_RE = re.compile(r"^\d{1,6}\.\d{1,6}\Z")


def validate_capability_name(name: object) -> str:
    """A capability name: lower-case dot-separated segments (``llm.chat``)."""
    if not isinstance(name, str) or len(name) > 128 or not _CAP_NAME_RE.match(name):
        raise BadRequest(f"invalid capability name {str(name)[:64]!r}")
    return name


def validate_version(version: object) -> str:
    """A ``MAJOR.MINOR`` version string."""
    if not isinstance(version, str) or not _VERSION_RE.match(version):
        raise BadRequest(f"invalid capability version {str(version)[:32]!r}: MAJOR.MINOR")
    return version


# spec §2.2: the signed call envelope and the request body it carries; nothing else.
ENVELOPE_SHAPE = Shape.of(
    "call envelope",
    ("body", "capability", "version", "request_id", "from", "community", "ts"),
    {"signature": "the signature goes beside the envelope, not inside it"},
)
# The fields of a signed envelope and of a token call's (which has no ``from``).
_SIGNED_KEYS = ENVELOPE_SHAPE.fields
_TOKEN_KEYS = _SIGNED_KEYS - {"from"}
BODY_SHAPE = Shape.of(
    "call body",
    ("params", "input"),
    {"parameters": "did you mean params?", "inputs": "did you mean input?"},
)


class CallEnvelope(NamedTuple):
    """The signed part of a capability call (spec §2.2). (This and :class:`VerifiedCall`
    are made for every call: a named tuple is built several times faster than a frozen
    dataclass.)"""

    body: dict[str, Any]
    capability: str
    version: str
    request_id: str
    sender: str | None
    community: str
    ts: int

    @classmethod
    def from_json(cls, obj: object) -> CallEnvelope:
        """Check the envelope's shape (not its signature).

        Raises:
            BadRequest: a field is missing or of the wrong type.
        """
        if not isinstance(obj, dict):
            raise BadRequest("the call envelope is an object")
        keys = obj.keys()
        if keys not in (_SIGNED_KEYS, _TOKEN_KEYS):  # not one of the usual exact field sets
            missing = _TOKEN_KEYS - keys
            if missing:
                raise BadRequest(f"call envelope lacks {sorted(missing)}")
            ENVELOPE_SHAPE.check(obj)
        body = obj["body"]
        if not isinstance(body, dict):
            raise BadRequest("the call body is an object {params?, input}")
        BODY_SHAPE.check(body)
        if "params" in body and not isinstance(body["params"], dict):
            raise BadRequest("params must be an object")
        sender = obj.get("from")
        if sender is not None and not is_node_id(sender):
            raise BadRequest("from must be a NodeID")
        if not is_node_id(obj["community"]):
            raise BadRequest("community must be a NodeID")
        if not is_ulid(obj["request_id"]):
            raise BadRequest("request_id must be a ULID")
        ts = obj["ts"]
        if not isinstance(ts, int) or isinstance(ts, bool):
            raise BadRequest("ts must be integer Unix milliseconds")
        return cls(
            body=body,
            capability=validate_capability_name(obj["capability"]),
            version=validate_version(obj["version"]),
            request_id=obj["request_id"],
            sender=sender,
            community=obj["community"],
            ts=ts,
        )

    def to_json(self) -> dict[str, Any]:
        """The JSON object that is signed (JCS) and sent on WS first frames and peer links."""
        out: dict[str, Any] = {
            "body": self.body,
            "capability": self.capability,
            "version": self.version,
            "request_id": self.request_id,
            "community": self.community,
            "ts": self.ts,
        }
        if self.sender is not None:
            out["from"] = self.sender
        return out

    @property
    def params(self) -> dict[str, Any]:
        """``body.params`` or an empty dict."""
        params = self.body.get("params")
        return params if isinstance(params, dict) else {}

    @property
    def input(self) -> Any:
        """``body.input`` (None when absent)."""
        return self.body.get("input")


class VerifiedCall(NamedTuple):
    """A call whose signature or token, window, replay and membership were checked.

    ``signature``/``token`` are kept verbatim so a forwarding node can pass the
    original credentials on unchanged (spec §2.2): the provider verifies the caller.
    """

    envelope: CallEnvelope
    caller: Caller
    signature: str | None = None
    token: str | None = None
    target: str | None = None
    deadline_ms: int | None = None

    @property
    def capability(self) -> str:
        """The capability name."""
        return self.envelope.capability

    @property
    def version(self) -> str:
        """The requested ``MAJOR.MINOR``."""
        return self.envelope.version

    @property
    def request_id(self) -> str:
        """The caller's request id."""
        return self.envelope.request_id


def request_envelope(
    *, method: str, path: str, body: Any, request_id: str, sender: str, community: str, ts: int
) -> dict[str, Any]:
    """The request envelope of spec §2.2 for non-call authenticated HTTP requests."""
    return {
        "method": method.upper(),
        "path": path,
        "body": body,
        "request_id": request_id,
        "from": sender,
        "community": community,
        "ts": ts,
    }
