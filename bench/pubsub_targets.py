"""The servers the pub/sub benchmark runs against (``bench_pubsub``): HearthNet nodes
reached by clients of several kinds, nats-server (core and JetStream) and Mosquitto, each
started on free loopback ports and stopped by PID, and the credentials HearthNet's load
generator clients present (tokens, or identity proofs signed with the node's key).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import start_node
from bench.servers import RefServer, start_jetstream, start_mosquitto, start_nats
from hearthnet.clock import now_ms
from hearthnet.identity import load_or_create_keys

SERVERS = (
    "hearthnet", "hearthnet-cbor", "hearthnet-sig", "hearthnet-node", "hearthnet-normal",
    "hearthnet-lean", "hearthnet-cbor-lean", "nats", "mosquitto", "jetstream-sync", "jetstream",
)  # fmt: skip
DEFAULT_SERVERS = (
    "hearthnet", "hearthnet-cbor", "nats", "mosquitto", "jetstream-sync", "jetstream",
)  # fmt: skip
# One node reached by clients of several kinds: JSON, CBOR, subscribers that ask for sig,
# subscribers that ask for lean frames (LEAN_FIELDS), and clients that authenticate as the
# node itself (the benchmark's way before tokens).
SHARED_NODE = (
    "hearthnet", "hearthnet-cbor", "hearthnet-sig", "hearthnet-node", "hearthnet-lean",
    "hearthnet-cbor-lean",
)  # fmt: skip
# What a lean subscriber asks for (subscribe `fields`): what a token-stream page reads.
LEAN_FIELDS = "topic,type,data"
# Which servers each kind of scenario runs against, and the peer its ratios are taken to.
FANOUT_SERVERS = (
    "hearthnet",
    "hearthnet-cbor",
    "hearthnet-sig",
    "hearthnet-node",
    "hearthnet-lean",
    "hearthnet-cbor-lean",
    "hearthnet-normal",  # the latency scenario's node without an fsync per commit
    "nats",
    "mosquitto",
)
DURABLE_SERVERS = (
    "hearthnet", "hearthnet-cbor", "hearthnet-node", "hearthnet-normal", "jetstream-sync",
    "jetstream",
)  # fmt: skip
# What a durable server's acknowledgement promises (spec §6.4: the reply after the
# commit), and the server with the same promise each is compared with (its ratio in the
# "like-for-like" table). The node's `pubsub.sync`: `full` fsyncs SQLite's WAL at each
# commit, `normal` writes it without an fsync (fsync at checkpoints), as JetStream's
# default writes its block file and fsyncs every 2 minutes (bench/servers.py).
SURVIVES_POWER_CUT = "fsync before each ack: survives a power cut"
SURVIVES_KILL = "written (no fsync) before each ack: survives kill -9, not a power cut"
DURABILITY = {
    "hearthnet": f"sync=full, {SURVIVES_POWER_CUT}",
    "hearthnet-cbor": f"sync=full, {SURVIVES_POWER_CUT}",
    "hearthnet-node": f"sync=full, {SURVIVES_POWER_CUT}",
    "hearthnet-normal": f"sync=normal, {SURVIVES_KILL}",
    "jetstream-sync": f"sync_interval=always, {SURVIVES_POWER_CUT}",
    "jetstream": f"default (fsync every 2 min), {SURVIVES_KILL}",
}
LIKE_FOR_LIKE = {
    "hearthnet": "jetstream-sync",
    "hearthnet-cbor": "jetstream-sync",
    "hearthnet-node": "jetstream-sync",
    "hearthnet-normal": "jetstream",
}
PROTO = {
    **{name: "hearthnet" for name in SERVERS if name.startswith("hearthnet")},
    "nats": "nats", "mosquitto": "mqtt", "jetstream": "jetstream", "jetstream-sync": "jetstream",
}  # fmt: skip
# The node's connection limits (spec §2.5: 100 per identity, 10,000 per node) and the
# token clients' publish rate (100/s) are policy an operator sets for the application; the
# benchmark's subscribers share one token (one identity) and its publisher is a token
# client, so it raises them. The limits are still checked on every connection and publish.
NODE_ENV = {
    "HEARTHNET_LIMITS_CONNECTIONS_PER_IDENTITY": "30000",
    "HEARTHNET_LIMITS_CONNECTIONS_TOTAL": "30000",
    "HEARTHNET_PUBSUB_PUBLISH_PER_S_TOKEN": "1000000",
}


@dataclass
class Target:
    """One server under test, as the load generator sees it."""

    name: str
    pid: int
    ws_url: str
    version: str
    stop: Callable[[], None]
    proc: subprocess.Popen[Any]
    node: Any = None  # NodeUnderTest for HearthNet
    tokens: dict[str, str] | None = None  # HearthNet: publisher and subscriber tokens

    @property
    def hearthnet(self) -> bool:
        """A HearthNet node (in any of its client forms)."""
        return self.node is not None

    @property
    def form(self) -> str:
        """The HearthNet subprotocol its clients speak: json or cbor."""
        return "cbor" if self.name.startswith("hearthnet-cbor") else "json"

    @property
    def fields(self) -> str:
        """The envelope fields HearthNet subscribers ask for (lean frames), or ``""``."""
        return LEAN_FIELDS if self.name.endswith("-lean") else ""

    @property
    def verify(self) -> bool:
        """HearthNet subscribers ask for frames with ``sig`` (spec §6.2)."""
        return self.name == "hearthnet-sig"

    def auth(self, default: str) -> str:
        """How HearthNet clients authenticate: ``node`` for ``hearthnet-node``."""
        return "node" if self.name == "hearthnet-node" else default

    def alive(self) -> bool:
        """True while the server process runs."""
        return self.proc.poll() is None

    @property
    def proto(self) -> str:
        """The load generator's adapter for this server."""
        return PROTO[self.name]


def start_targets(names: list[str]) -> dict[str, Target]:
    """Start the servers ``names`` on free loopback ports; the names in
    :data:`SHARED_NODE` are one node, reached by clients of different kinds."""
    targets: dict[str, Target] = {}
    try:
        for name in names:
            shared = next((targets[n] for n in SHARED_NODE if n in targets), None)
            if name in SHARED_NODE and shared is not None:
                targets[name] = Target(
                    name, shared.pid, shared.ws_url, shared.version, lambda: None,
                    shared.proc, node=shared.node, tokens=shared.tokens,
                )  # fmt: skip
            else:
                targets[name] = start_target(name)
    except Exception:
        for target in targets.values():
            target.stop()
        raise
    return targets


def start_target(name: str) -> Target:
    """Start one server on free loopback ports."""
    if name.startswith("hearthnet"):
        env = dict(NODE_ENV)
        if name == "hearthnet-normal":
            env["HEARTHNET_PUBSUB_SYNC"] = "normal"
        node = start_node(env=env)
        ws = "ws" + node.url.removeprefix("http") + "/pubsub/v1/subscribe"
        version = subprocess.run(
            [sys.executable, "-m", "hearthnet.cli", "--version"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()

        def stop() -> None:
            node.stop()
            shutil.rmtree(node.data_dir, ignore_errors=True)

        tokens = {role: issue_token(node.data_dir, role) for role in ("publisher", "subscriber")}
        if name == "hearthnet-normal":
            version = f"{version} (sync=normal)"
        return Target(
            name, node.pid, ws, version or "hearthnet", stop, node.proc, node=node, tokens=tokens
        )
    starters: dict[str, Callable[[], RefServer]] = {
        "nats": start_nats,
        "mosquitto": start_mosquitto,
        "jetstream": start_jetstream,
        "jetstream-sync": partial(start_jetstream, sync_always=True),
    }
    ref: RefServer = starters[name]()
    return Target(name, ref.pid, ref.ws_url, ref.version, ref.stop, ref.proc)


def issue_token(data_dir: Path, role: str) -> str:
    """A capability token from the node's CLI, as an application gets one: the publisher
    may publish on ``bench.**``, subscribers may subscribe to it (spec §1.6)."""
    scope = "pub:bench.**" if role == "publisher" else "sub:bench.**"
    out = subprocess.run(
        [
            sys.executable, "-m", "hearthnet.cli", "token", "issue",
            "--data-dir", str(data_dir), "--scope", scope, "--ttl", "6h", "--sub", f"bench-{role}",
        ],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return out.stdout.strip()


def hearthnet_auth_file(target: Target, subs: int, workdir: Path, how: str) -> Path:
    """Auth frames for one run. ``token`` (the default): the publisher's token and one
    token shared by the subscribers, as an application's clients would hold. ``node``:
    identity proofs signed with the node's own key, one per connection (single use, valid
    60 s, so made right before each run); the node's own identity skips the token checks
    and the publish rate limit (spec §2.5), which is what the benchmark measured before."""
    if how == "token":
        assert target.tokens is not None
        path = workdir / f"auth-{time.monotonic_ns()}.json"
        path.write_text(
            json.dumps(
                {
                    "publisher": {"token": target.tokens["publisher"]},
                    "shared": {"token": target.tokens["subscriber"]},
                }
            ),
            encoding="ascii",
        )
        path.chmod(0o600)
        return path
    keys = load_or_create_keys(target.node.data_dir)
    server_id = target.node.fields["node"]

    def proof() -> dict[str, Any]:
        fields = {
            "identity": keys.node_id,
            "ts": now_ms(),
            "nonce": os.urandom(12).hex(),
            "node": server_id,
        }
        return {
            "identity": keys.node_id,
            "ts": fields["ts"],
            "nonce": fields["nonce"],
            "sig": keys.sign_object(fields),
        }

    path = workdir / f"auth-{time.monotonic_ns()}.json"
    path.write_text(
        json.dumps({"publisher": proof(), "subscribers": [proof() for _ in range(subs)]}),
        encoding="ascii",
    )
    path.chmod(0o600)
    return path


def hearthnet_token_file(target: Target, workdir: Path) -> Path:
    """The subscribers' token, shared by the idle connections: proofs expire after 60 s,
    and opening 20,000 connections on a busy box may take longer."""
    assert target.tokens is not None
    path = workdir / "idle-token.json"
    path.write_text(json.dumps({"shared": {"token": target.tokens["subscriber"]}}), "ascii")
    path.chmod(0o600)
    return path
