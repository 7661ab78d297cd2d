"""One node's HTTP API as a client sees it (spec §2.2, §3): the pooled session, the
credentials (a member key or a token) and the signed request envelopes, the call envelope
and headers, the capability versions the node offers. :class:`~hearthnet.client.Client`
and the objects it opens (streams, subscriptions, publishers) go through it.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlencode

import aiohttp
import orjson
from yarl import URL

from hearthnet.bus.envelope import request_envelope
from hearthnet.clock import now_ms
from hearthnet.errors import BadRequest, Unavailable, error_from_wire
from hearthnet.identity import KeyPair
from hearthnet.ids import new_ulid
from hearthnet.transport import headers as h


def split_capability(cap: str) -> tuple[str, str | None]:
    """``"llm.chat@2.0"`` -> ``("llm.chat", "2.0")``; ``"echo@1"`` -> ``("echo", "1.0")``."""
    name, _, version = cap.partition("@")
    if not version:
        return name, None
    if "." not in version:
        version += ".0"
    return name, version


class NodeHttp:
    """Authenticated HTTP access to the node at ``url``, by a member key or a token.

    Raises:
        BadRequest: not exactly one of ``keys`` and ``token``.
    """

    def __init__(
        self,
        url: str,
        *,
        keys: KeyPair | None = None,
        token: str | None = None,
        community: str | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        if (keys is None) == (token is None):
            raise BadRequest("a Client needs exactly one of keys and token")
        self.url = url.rstrip("/")
        self.keys = keys
        self.token = token
        self.community = community
        # ``session``: the caller's pooled session (its own connector: a proxy, a socket
        # factory); closed by :meth:`close` like the one made here on first use
        self._session: aiohttp.ClientSession | None = session
        self._versions: dict[str, str] | None = None
        self._node_id: str | None = None

    async def close(self) -> None:
        """Close pooled connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        """The pooled HTTP session (keep-alive)."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                json_serialize=lambda o: orjson.dumps(o).decode(),
            )
        return self._session

    async def community_id(self) -> str:
        """The node's community (from its manifest, once)."""
        if self.community is None:
            manifest = await self.get_json("/manifest")
            self.community = str(manifest["community"])
        return self.community

    async def capability_version(self, name: str, version: str | None) -> str:
        """``version``, or the newest the node offers of capability ``name`` ("1.0" when
        it lists none)."""
        if version is not None:
            return version
        if self._versions is None:
            caps = await self.get_json("/bus/v1/capabilities")
            versions: dict[str, str] = {}
            for desc in caps["capabilities"]:
                current = versions.get(desc["name"])
                key = tuple(int(p) for p in desc["version"].split("."))
                if current is None or key > tuple(int(p) for p in current.split(".")):
                    versions[desc["name"]] = desc["version"]
            self._versions = versions
        return self._versions.get(name, "1.0")

    async def call_envelope(self, name: str, version: str, body: dict[str, Any]) -> dict[str, Any]:
        """The call envelope of spec §2.2 for this client."""
        envelope: dict[str, Any] = {
            "body": body,
            "capability": name,
            "version": version,
            "request_id": new_ulid(),
            "community": await self.community_id(),
            "ts": now_ms(),
        }
        if self.keys is not None:
            envelope["from"] = self.keys.node_id
        return envelope

    def credential_headers(self, envelope: dict[str, Any], signature: str | None) -> dict[str, str]:
        """The headers naming and authenticating ``envelope`` (its ``signature``, or the
        token)."""
        headers = {
            h.REQUEST_ID: envelope["request_id"],
            h.COMMUNITY: envelope["community"],
            h.TIMESTAMP: str(envelope["ts"]),
        }
        if self.keys is not None and signature is not None:
            headers[h.FROM] = self.keys.node_id
            headers[h.SIGNATURE] = signature
        elif self.token is not None:
            headers[h.TOKEN] = self.token
        return headers

    def sign(self, obj: dict[str, Any]) -> str | None:
        """Our signature over ``obj`` (None for a token client)."""
        return self.keys.sign_object(obj) if self.keys is not None else None

    async def signed_headers(self, method: str, path: str, body: Any) -> dict[str, str]:
        """Headers authenticating a non-call request (request envelope of spec §2.2)."""
        if self.keys is None:
            assert self.token is not None
            return {h.TOKEN: self.token}
        envelope = request_envelope(
            method=method,
            path=path,
            body=body,
            request_id=new_ulid(),
            sender=self.keys.node_id,
            community=await self.community_id(),
            ts=now_ms(),
        )
        return self.credential_headers(envelope, self.keys.sign_object(envelope))

    async def get_json(self, path: str) -> Any:
        """GET a JSON resource (unauthenticated)."""
        return await self.send("GET", self.url + path)

    async def send(self, method: str, url: str | URL, **kwargs: Any) -> Any:
        """One HTTP exchange; transport failures become :class:`Unavailable`."""
        try:
            async with self.session.request(method, url, **kwargs) as resp:
                return await json_or_raise(resp)
        except (aiohttp.ClientError, OSError) as exc:
            raise Unavailable(f"{method} {self.url}: {exc or type(exc).__name__}") from exc

    async def request_json(
        self, method: str, path: str, body: Any = None, query: dict[str, Any] | None = None
    ) -> Any:
        """An authenticated JSON request (publish, history, presence, ...).

        The signature covers the path with its query string exactly as sent.
        """
        clean = {k: v for k, v in (query or {}).items() if v is not None}
        path_qs = path + ("?" + urlencode(clean, safe="*,") if clean else "")
        headers = await self.signed_headers(method, path_qs, body)
        data = orjson.dumps(body) if body is not None else None
        if data is not None:
            headers["Content-Type"] = "application/json"
        return await self.send(
            method, URL(self.url + path_qs, encoded=True), data=data, headers=headers
        )

    async def node_id(self) -> str:
        """The node's NodeID (from its signed manifest)."""
        if self._node_id is None:
            manifest = await self.get_json("/manifest")
            self._node_id = str(manifest["node"])
            self.community = self.community or str(manifest["community"])
        return self._node_id

    async def session_auth(self) -> dict[str, Any]:
        """The fields of a WebSocket ``auth`` frame (spec §2.2): a token, or a proof of
        identity signed over ``{identity, ts, nonce, node}`` for this node."""
        if self.keys is None:
            return {"token": self.token}
        proof = {
            "identity": self.keys.node_id,
            "ts": now_ms(),
            "nonce": os.urandom(12).hex(),
            "node": await self.node_id(),
        }
        return {
            "identity": proof["identity"],
            "ts": proof["ts"],
            "nonce": proof["nonce"],
            "sig": self.keys.sign_object(proof),
        }

    def call_headers(
        self,
        envelope: dict[str, Any],
        signature: str | None,
        *,
        target: str | None,
        deadline_ms: int | None,
        accept: str,
    ) -> dict[str, str]:
        """The headers of a call over HTTP (spec §2.2) for ``envelope``."""
        headers = self.credential_headers(envelope, signature)
        headers.update(
            {
                h.CAPABILITY: envelope["capability"],
                h.VERSION: envelope["version"],
                "Accept": accept,
                "Content-Type": "application/json",
            }
        )
        if target:
            headers[h.TARGET] = target
        if deadline_ms:
            headers[h.DEADLINE] = str(deadline_ms)
        return headers


async def get_public_json(url: str, path: str) -> Any:
    """GET an unauthenticated JSON resource of the node at ``url`` (``/status``,
    ``/manifest``): no keys or token needed, so it works on a machine with no identity.

    Raises:
        Unavailable: nothing answered at ``url``.
        WireError: the node answered with an error.
    """
    try:
        async with aiohttp.ClientSession() as session, session.get(url.rstrip("/") + path) as resp:
            return await json_or_raise(resp)
    except (aiohttp.ClientError, OSError) as exc:
        raise Unavailable(f"GET {url}: {exc or type(exc).__name__}") from exc


async def json_or_raise(resp: aiohttp.ClientResponse) -> Any:
    raw = await resp.read()
    try:
        body = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"node answered {resp.status} with non-JSON body") from exc
    if resp.status >= 400:
        if isinstance(body, dict) and ("error" in body):
            raise error_from_wire(body)
        raise error_from_wire({"error": "internal_error", "message": f"HTTP {resp.status}"})
    return body
