"""One live node process for a fuzz module, the identities that talk to it, and the
invariants checked after every input.

Hypothesis drives plain (synchronous) test functions; each input runs on one event loop
owned by :class:`LiveNode` (an :class:`asyncio.Runner`), so a module keeps one node, one
HTTP session and one loop across all its examples.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import subprocess
import time
from collections import Counter
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import orjson
from yarl import URL

from hearthnet.bus.envelope import request_envelope
from hearthnet.clock import now_ms
from hearthnet.community import CommunityStore, Level, MembershipRecord, open_membership
from hearthnet.identity import KeyPair, load_or_create_keys
from hearthnet.ids import new_ulid
from hearthnet.tokens import CapabilityToken, Scope
from tests.fuzz.oracle import check_http
from tests.helpers import NodeProcess, start_node_process

T = TypeVar("T")

# A signed echo@1.0 must come back within this after any input (the liveness invariant).
ECHO_DEADLINE_S = 5.0
LARGE_BODY = 512 * 1024
# The token the fuzzer holds may publish and subscribe only here, and call echo.
TOKEN_PREFIX = "fuzz.tok"
MEMBER_SEED = b"\x4d" * 32
STRANGER_SEED = b"\x53" * 32
# Environment of the node process: no LAN discovery, quick storage, nothing from $HOME.
NODE_ENV = {"HEARTHNET_PUBSUB_SYNC": "normal"}


class NodeDied(AssertionError):
    """The node process is gone."""


class LiveNode:
    """A ``hearthnet node start`` process and the fuzzer's view of what it may hold."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.runner = asyncio.Runner()
        self.http: aiohttp.ClientSession | None = None
        self.proc: NodeProcess | None = None
        self.generation = 0
        self.member = KeyPair.from_seed(MEMBER_SEED)
        self.stranger = KeyPair.from_seed(STRANGER_SEED)
        # Inputs run, per edge (printed in the terminal summary).
        self.inputs: Counter[str] = Counter()
        # Topics an authorised sender may have published to; any other topic the node
        # lists was created by someone without the right.
        self.allowed_topics: set[str] = set()
        # Topics that received messages without right, at the head already reported.
        self.foreign_heads: dict[str, int] = {}
        # Ids of the membership records the fuzzer signed as the anchor (legitimately).
        self.own_records: set[str] = set()
        # The membership the node must show: only the fuzzer's own records change it.
        self.expected_members: dict[str, Level] = {}
        self.expected_revoked: set[str] = set()
        # The same, as granted by the fuzzer's records alone (never re-baselined).
        self.granted_members: dict[str, Level] = {}
        self.granted_revoked: set[str] = set()

    # --- process --------------------------------------------------------------------

    def start(self) -> None:
        """Start a fresh node (a new data dir) and enrol the fuzzer's member and token."""
        self.generation += 1
        self.data_dir = self.root / f"node{self.generation}"
        env = {**NODE_ENV, "HOME": str(self.home), "XDG_CONFIG_HOME": str(self.home / "cfg")}
        self.proc = start_node_process(self.data_dir, "--no-zeroconf", env=env)
        self.url = self.proc.url
        self.anchor = load_or_create_keys(self.data_dir)
        self.community = self.anchor.node_id
        self.allowed_topics = set()
        self.foreign_heads = {}
        self.own_records = {json.loads(line)["id"] for line in self._record_lines()}
        self.expected_members = {self.anchor.node_id: Level.ANCHOR}
        self.expected_revoked = set()
        self.granted_members = {self.anchor.node_id: Level.ANCHOR}
        self.granted_revoked = set()
        if self.http is None:
            self.http = self.run(self._session())
        self.add_record(
            MembershipRecord.create(
                self.anchor,
                "member.added",
                self.community,
                self.member.node_id,
                now_ms=now_ms(),
                level=Level.MEMBER,
                name="fuzz-member",
            )
        )
        self.expected_members[self.member.node_id] = Level.MEMBER
        self.granted_members[self.member.node_id] = Level.MEMBER
        self.token = CapabilityToken.issue(
            self.member,
            community=self.community,
            scopes=[
                Scope.parse(f"pub:{TOKEN_PREFIX}.**"),
                Scope.parse(f"sub:{TOKEN_PREFIX}.**"),
                Scope.parse("call:echo"),
            ],
            ttl_ms=3_600_000,
            now_ms=now_ms(),
        ).encode()

    def ensure_running(self) -> None:
        """Start a fresh node when an earlier input killed the last one, so one crash
        does not hide what the remaining tests would find."""
        if self.proc is None or self.proc.proc.poll() is not None:
            if self.proc is not None:
                self.proc.stop()
            self.start()

    def close(self) -> None:
        """Stop the node and close the loop (also after a failure)."""
        try:
            if self.http is not None:
                self.run(self.http.close())
        finally:
            try:
                if self.proc is not None:
                    self.proc.stop()
            finally:
                self.runner.close()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run one coroutine on the module's loop; a connection that broke is reported as
        the node's death or as a dropped connection (see :meth:`why_no_answer`)."""
        try:
            return self.runner.run(coro)
        except aiohttp.ClientConnectionError as exc:
            raise self.why_no_answer(getattr(coro, "__qualname__", "an exchange")) from exc

    @staticmethod
    async def _session() -> aiohttp.ClientSession:
        # A connection per request: after hostile input the node may close a keep-alive
        # connection, and reusing it would fail the next (innocent) request.
        return aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=30),
            connector=aiohttp.TCPConnector(force_close=True),
        )

    @property
    def session(self) -> aiohttp.ClientSession:
        """The HTTP session (inside :meth:`run`)."""
        assert self.http is not None
        return self.http

    @property
    def port(self) -> int:
        """The node's TCP port."""
        return int(self.url.rsplit(":", 1)[1])

    # --- signing --------------------------------------------------------------------

    def signed_headers(self, keys: KeyPair, method: str, path: str, body: Any) -> dict[str, str]:
        """Request-envelope headers of spec §2.2 signed by ``keys``."""
        envelope = request_envelope(
            method=method,
            path=path,
            body=body,
            request_id=new_ulid(),
            sender=keys.node_id,
            community=self.community,
            ts=now_ms(),
        )
        return {
            "X-HearthNet-Request-Id": envelope["request_id"],
            "X-HearthNet-From": keys.node_id,
            "X-HearthNet-Community": self.community,
            "X-HearthNet-Timestamp": str(envelope["ts"]),
            "X-HearthNet-Signature": keys.sign_object(envelope),
        }

    def call_envelope(
        self, keys: KeyPair, body: Any, cap: str = "echo", version: str = "1.0"
    ) -> dict[str, Any]:
        """A call envelope of spec §2.2 from ``keys``."""
        return {
            "body": body,
            "capability": cap,
            "version": version,
            "request_id": new_ulid(),
            "from": keys.node_id,
            "community": self.community,
            "ts": now_ms(),
        }

    def call_headers(self, envelope: dict[str, Any], signature: str) -> dict[str, str]:
        """The headers of ``POST /bus/v1/call`` carrying ``envelope``."""
        return {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "X-HearthNet-Capability": str(envelope["capability"]),
            "X-HearthNet-Capability-Version": str(envelope["version"]),
            "X-HearthNet-Request-Id": str(envelope["request_id"]),
            "X-HearthNet-From": str(envelope["from"]),
            "X-HearthNet-Community": str(envelope["community"]),
            "X-HearthNet-Timestamp": str(envelope["ts"]),
            "X-HearthNet-Signature": signature,
        }

    def ws_auth(self, keys: KeyPair) -> dict[str, Any]:
        """An identity-proof ``auth`` frame for a pub/sub WebSocket (spec §2.2)."""
        proof = {
            "identity": keys.node_id,
            "ts": now_ms(),
            "nonce": new_ulid(),
            "node": self.anchor.node_id,
        }
        return {
            "type": "auth",
            "identity": keys.node_id,
            "ts": proof["ts"],
            "nonce": proof["nonce"],
            "sig": keys.sign_object(proof),
        }

    # --- exchanges ------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        where: str = "",
    ) -> tuple[int, Any]:
        """One HTTP exchange checked by the oracle; (status, JSON body or None)."""
        url = URL(self.url + path, encoded=True)
        # aiohttp warns that a large bytes body would block its loop; a stream does not.
        payload: bytes | io.BytesIO | None = (
            io.BytesIO(data) if data is not None and len(data) > LARGE_BODY else data
        )
        try:
            async with self.session.request(
                method, url, data=payload, headers=headers, allow_redirects=False
            ) as resp:
                body = await resp.read()
        except aiohttp.ClientConnectionError as exc:
            raise self.why_no_answer(f"{method} {path}") from exc
        if method == "HEAD":  # no body by definition: the status and type must still fit
            assert resp.status != 500, f"HEAD {path}: 500"
            return resp.status, None
        return resp.status, check_http(
            resp.status, resp.content_type, body, where or f"{method} {path}"
        )

    def why_no_answer(self, what: str) -> AssertionError:
        """The failure to report when ``what`` got no answer: the node died (it gets a
        moment to exit), or it dropped the request without a word."""
        assert self.proc is not None
        try:
            code = self.proc.proc.wait(ECHO_DEADLINE_S)
        except subprocess.TimeoutExpired:
            return AssertionError(f"{what}: the node dropped the connection without an answer")
        return NodeDied(f"the node process exited ({code}) on {what}")

    def add_record(self, record: MembershipRecord) -> None:
        """Submit a record signed by the anchor (the fuzzer's only legitimate records)."""
        self.own_records.add(record.id)
        status, body = self.run(
            self.request(
                "POST",
                "/mesh/v1/membership",
                data=orjson.dumps({"records": [record.to_json()]}),
                headers={"Content-Type": "application/json"},
            )
        )
        assert (200, 1) == (status, body["applied"]), body

    # --- invariants -----------------------------------------------------------------

    def stored_record_ids(self) -> set[str]:
        """Ids of the records in ``records.jsonl``."""
        return {json.loads(line)["id"] for line in self._record_lines()}

    def _record_lines(self) -> list[str]:
        path = self.data_dir / "community" / "records.jsonl"
        if not path.exists():
            return []
        return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

    def check(self, edge: str, n: int = 1) -> None:
        """Count ``n`` inputs on ``edge``, then check the invariants: the process is alive,
        a signed echo@1.0 is answered within the deadline, no record but the fuzzer's own
        anchor-signed ones was stored, and no topic exists that only an unauthorised
        sender could have created."""
        self.inputs[edge] += n
        assert self.proc is not None
        if self.proc.proc.poll() is not None:
            raise NodeDied(f"the node process exited ({self.proc.proc.returncode}) after {edge}")
        self.run(self._check_live(edge))
        self.check_membership(edge)

    def check_membership(self, edge: str) -> None:
        """Stored records come from the fuzzer or its members (spec §1.5: a node does not
        store records from strangers), and only the fuzzer's own records changed who is
        a member at which level, and who is revoked."""
        store = CommunityStore(self.data_dir)
        signers = {self.anchor.node_id, self.member.node_id}
        foreign = [
            r.to_json()
            for r in store.load()
            if r.id not in self.own_records and r.by not in signers
        ]
        view = open_membership(store, self.anchor, name="", now_ms=now_ms())
        expected = (self.expected_members, self.expected_revoked)
        actual = ({node: info.level for node, info in view.members.items()}, view.revoked)
        # A violation is reported once: the next inputs are judged against the node as it
        # now is, so one stored record does not fail every test after it.
        self.own_records |= {r["id"] for r in foreign}
        self.expected_members, self.expected_revoked = dict(actual[0]), set(actual[1])
        assert ([], expected) == (foreign, actual), (
            f"after {edge}: records stored from strangers {foreign}; "
            f"membership (members, revoked) expected {expected}, now {actual}"
        )

    async def _check_live(self, edge: str) -> None:
        body = {"input": {"alive": edge}}
        envelope = self.call_envelope(self.anchor, body)
        started = time.monotonic()
        try:
            async with asyncio.timeout(ECHO_DEADLINE_S):
                status, answer = await self.request(
                    "POST",
                    "/bus/v1/call",
                    data=orjson.dumps(body),
                    headers=self.call_headers(envelope, self.anchor.sign_object(envelope)),
                    where=f"liveness echo after {edge}",
                )
        except TimeoutError as exc:
            raise AssertionError(
                f"no echo within {ECHO_DEADLINE_S} s after {edge} "
                f"({time.monotonic() - started:.1f} s)"
            ) from exc
        assert (200, {"echo": {"alive": edge}}) == (status, answer["output"])
        path = "/pubsub/v1/topics?limit=1000"
        status, listing = await self.request(
            "GET", path, headers=self.signed_headers(self.anchor, "GET", path, None)
        )
        grown = {
            t["topic"]: t["head_seq"]
            for t in listing["topics"]
            if t["topic"] not in self.allowed_topics
            and t["head_seq"] > self.foreign_heads.get(t["topic"], -1)
        }
        for topic in [t for t in grown if t.startswith("mesh.")]:
            # spec §6.1: mesh.** is written by nodes; the node's own beacons (and the
            # fuzzer's member node's gossip) land there. Anyone else's message is a breach.
            since = self.foreign_heads.get(topic, 0)
            path = f"/pubsub/v1/topics/{topic}/history?since_seq={since}&limit=500"
            _, page = await self.request(
                "GET", path, headers=self.signed_headers(self.anchor, "GET", path, None)
            )
            origins = {m["data"]["origin"] for m in page["messages"]}
            if origins <= {self.anchor.node_id, self.member.node_id}:
                self.foreign_heads[topic] = grown.pop(topic)
        self.foreign_heads.update(grown)  # reported once (see check_membership)
        assert {} == grown, f"messages stored without right after {edge}: {grown}"


@contextlib.contextmanager
def live_node(root: Path) -> Any:
    """A started :class:`LiveNode`, stopped on exit whatever happened."""
    node = LiveNode(root)
    try:
        node.start()
        yield node
    finally:
        node.close()
