"""Community federation end to end (spec §8): two communities, one node each, as real
processes on loopback. The anchors set it up with the CLI; granted topics flow both ways
and nothing else does; granted capabilities answer and others are ``forbidden``; a
revocation stops both within 10 s."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from hearthnet.client import Client
from hearthnet.clock import now_ms
from hearthnet.community import CommunityStore, Level, MembershipRecord
from hearthnet.errors import Forbidden
from hearthnet.identity import KeyPair, load_or_create_keys
from hearthnet.membership import Membership, Source
from tests.helpers import NodeProcess, eventually, run_cli, start_node_process
from tests.integration.mesh_cluster import MESH_ARGS


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[NodeProcess, NodeProcess]]:
    """Node A (its own community) and node B (another), B bridging to A."""
    with socket.socket() as probe:  # a free port for A, so that both start at once
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with ThreadPoolExecutor(2) as pool:
        starts = [
            pool.submit(start_node_process, tmp_path / "a", *MESH_ARGS, "--port", str(port)),
            pool.submit(
                start_node_process,
                tmp_path / "b",
                *MESH_ARGS,
                *("--federation-peer", f"http://127.0.0.1:{port}"),
            ),
        ]
    nodes = [s.result() for s in starts if s.exception() is None]
    try:
        assert 2 == len(nodes), [s.exception() for s in starts]
        yield nodes[0], nodes[1]
    finally:
        for node in nodes:
            node.stop()


async def listing(node: NodeProcess) -> list[dict[str, Any]]:
    """The agreements ``node`` holds (what ``federation list --json`` prints)."""
    async with client(node, node) as c:
        answer = await c.request_json("GET", "/mesh/v1/federation")
    agreements: list[dict[str, Any]] = answer["agreements"]
    return agreements


def cli(*args: str) -> str:
    """Run the CLI; its stdout (it must succeed)."""
    done = run_cli(*args)
    assert 0 == done.returncode, done.stderr
    return done.stdout


def client(node: NodeProcess, signer: NodeProcess) -> Client:
    """A client of ``node`` signing as ``signer``'s key (of its own community)."""
    keys = load_or_create_keys(signer.data_dir)
    return Client(node.url, keys=keys, community=keys.node_id)


async def topic_ids(node: NodeProcess, topic: str) -> list[Any]:
    """The ``data`` of every message ``node`` holds on ``topic``."""
    async with client(node, node) as c:
        page = await c.history(topic, limit=500)
    return [m["data"]["data"] for m in page["messages"]]


async def call_error(caller: NodeProcess, node: NodeProcess, capability: str) -> str | None:
    """Call ``capability`` on ``node`` as ``caller``: None when it answers, else the code."""
    async with client(node, caller) as c:
        try:
            await c.call(capability, {"x": 1})
        except Forbidden as exc:
            return exc.code
    return None


async def test_federation_grants_flow_and_revocation_stops_them(
    pair: tuple[NodeProcess, NodeProcess], tmp_path: Path
) -> None:
    """Granted topics flow both ways, granted calls answer, the rest is forbidden; a
    revocation stops both within 10 s."""
    a, b = pair
    a_id, b_id = (load_or_create_keys(n.data_dir).node_id for n in (a, b))
    proposal, signed = tmp_path / "proposal.hnf", tmp_path / "signed.hnf"
    cli(
        *("federation", "propose", "--data-dir", str(a.data_dir), "--with", b_id),
        *("--grant-topics", "chat.**", "--grant-capabilities", "echo@1"),
        *("--want-topics", "news.*", "--expires", "1d", "--out", str(proposal)),
        *("--bridges", a_id, "--their-bridges", b_id),
    )
    cli("federation", "accept", "--data-dir", str(b.data_dir), str(proposal), "--out", str(signed))
    imported = cli("federation", "accept", "--data-dir", str(a.data_dir), str(signed))
    held = await listing(a)
    agreement = held[0]["id"]
    assert (
        ["in_force"],
        [[a_id], [b_id]],
        f"agreement {agreement}: in_force (signed by both communities; nothing to send)\n",
    ) == (
        [x["status"] for x in held],
        [held[0].get("bridges_a"), held[0].get("bridges_b")],
        imported,
    )

    async with client(a, a) as ca, client(b, b) as cb:
        await ca.publish("secret.plans", "m", {"n": "hidden"})
        await ca.publish("chat.room", "m", {"n": "a1"})
        await cb.publish("chat.room", "m", {"n": "b-chat"})  # B grants A no chat
        await cb.publish("news.today", "m", {"n": "b1"})
    await eventually(lambda: topic_ids(b, "chat.room"), lambda d: {"n": "a1"} in d, 15, "A→B")
    await eventually(lambda: topic_ids(a, "news.today"), lambda d: {"n": "b1"} in d, 15, "B→A")
    # the ungranted ones were published first and had the same way open
    assert [] == await topic_ids(b, "secret.plans")
    assert [{"n": "a1"}] == await topic_ids(a, "chat.room")

    assert [None, "forbidden"] == [
        await call_error(b, a, "echo"),
        await call_error(b, a, "echo.stream"),
    ]

    revoked_at = time.monotonic()
    cli("federation", "revoke", "--data-dir", str(a.data_dir), agreement)
    await eventually(
        lambda: call_error(b, a, "echo"), lambda code: code == "forbidden", 10, "calls stop"
    )

    await eventually(
        lambda: listing(b), lambda held: held[0]["status"] == "revoked", 10, "B has the revocation"
    )
    assert time.monotonic() - revoked_at < 10
    async with client(a, a) as ca, client(b, b) as cb:
        await ca.publish("chat.room", "m", {"n": "after"})
        await cb.publish("news.today", "m", {"n": "after"})
    # before the revocation both arrived at once; here a pull (parked 2 s) and a push
    # (woken by the commit) have had their chance within the window
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        assert {"n": "after"} not in await topic_ids(b, "chat.room")
        assert {"n": "after"} not in await topic_ids(a, "news.today")
        await asyncio.sleep(0.2)


def test_propose_on_a_node_that_is_not_an_anchor_says_what_to_do(tmp_path: Path) -> None:
    """A member that is not an anchor gets exit 1 and a message naming what to do."""
    founder, data = KeyPair.from_seed(bytes(32)), tmp_path / "member"
    member = load_or_create_keys(data)
    view = Membership(founder.node_id)
    genesis = MembershipRecord.create(
        founder,
        "community.created",
        founder.node_id,
        founder.node_id,
        now_ms=now_ms(),
        name="c",
        signer_seq=1,
        prev=None,
    )
    view.add_all([genesis], Source.STORE)
    added = view.sign(founder, "member.added", member.node_id, now_ms=now_ms(), level=Level.MEMBER)
    CommunityStore(data).replace([genesis, added])
    done = run_cli("federation", "propose", "--data-dir", str(data), "--with", member.node_id)
    assert (1, True) == (done.returncode, "is not an anchor of community" in done.stderr)


async def test_cli_calls_the_other_communitys_node_with_url(
    pair: tuple[NodeProcess, NodeProcess], tmp_path: Path
) -> None:
    """``hearthnet call CAP --url <a node of A> --data-dir <B's>`` signs for B, so A
    answers under the agreement's grant; before it, the refusal names federation. ``sub``
    likewise reads a granted topic (its WebSocket session once said "not a member of this
    community" whatever the agreement), and ``peers`` is refused: the addresses of A's
    nodes are in no grant (once any token or federated node could read them)."""
    a, b = pair
    b_id = load_or_create_keys(b.data_dir).node_id

    def call() -> Any:
        return run_cli(
            *("call", "echo@1.0", "--body", '{"x": 1}', "--json", "--url", a.url),
            *("--data-dir", str(b.data_dir)),
        )

    before = call()
    assert 4 == before.returncode
    assert "federation agreement" in json.loads(before.stderr)["message"]
    proposal, signed = tmp_path / "proposal.hnf", tmp_path / "signed.hnf"
    cli(
        *("federation", "propose", "--data-dir", str(a.data_dir), "--with", b_id),
        *("--grant-capabilities", "echo@1", "--expires", "1d", "--out", str(proposal)),
        *("--grant-topics", "chat.**"),
    )
    cli("federation", "accept", "--data-dir", str(b.data_dir), str(proposal), "--out", str(signed))
    cli("federation", "accept", "--data-dir", str(a.data_dir), str(signed))
    after = call()
    assert 0 == after.returncode, after.stderr
    assert {"echo": {"x": 1}} == json.loads(after.stdout)["output"]
    cli("pub", "chat.room", "--data", '"for b"', "--data-dir", str(a.data_dir))
    as_b = ("--url", a.url, "--data-dir", str(b.data_dir))
    read = run_cli("sub", "chat.**", "--last", "1", "--count", "1", *as_b, timeout=30)
    peers = run_cli("peers", "--json", *as_b)
    token = cli("token", "issue", "--scope", "call:echo", "--data-dir", str(a.data_dir)).strip()
    async with Client(a.url, token=token) as with_token:
        with pytest.raises(Forbidden):
            await with_token.request_json("GET", "/mesh/v1/peers")
    assert (0, "for b", 1, "forbidden") == (
        read.returncode,
        json.loads(read.stdout)["data"] if read.returncode == 0 else read.stderr,
        peers.returncode,
        json.loads(peers.stderr)["error"],
    )


async def test_revoke_with_no_bridge_says_so_and_url_hands_it_to_the_other_side(
    tmp_path: Path,
) -> None:
    """With no bridge between the communities, a revocation stays on the side that signed
    it: the command once said "both communities stop within 10 s" while the other side
    went on answering. Now it says how the other side learns it, and ``revoke ID --url``
    of one of their nodes hands it there, after which that node refuses us."""
    a, b = (start_node_process(tmp_path / n, *MESH_ARGS) for n in ("a", "b"))
    try:
        b_id = load_or_create_keys(b.data_dir).node_id
        proposal, signed = tmp_path / "proposal.hnf", tmp_path / "signed.hnf"
        cli(
            *("federation", "propose", "--data-dir", str(a.data_dir), "--with", b_id),
            *("--want-capabilities", "echo@1", "--expires", "1d", "--out", str(proposal)),
        )
        cli(
            "federation",
            "accept",
            "--data-dir",
            str(b.data_dir),
            str(proposal),
            "--out",
            str(signed),
        )
        cli("federation", "accept", "--data-dir", str(a.data_dir), str(signed))
        agreement = (await listing(a))[0]["id"]
        said = cli("federation", "revoke", agreement, "--data-dir", str(a.data_dir))
        as_a = ("--url", b.url, "--data-dir", str(a.data_dir))
        still = run_cli("call", "echo@1.0", *as_a)
        there = cli("federation", "revoke", agreement, *as_a)
        after = run_cli("call", "echo@1.0", "--json", *as_a)
        assert (
            f"{b_id} stops when the revocation reaches it",
            f"hearthnet federation revoke {agreement} --url URL",
            0,
            f"revoked agreement {agreement} on {b.url} ({b_id}): its community stops",
            ["revoked"],
            (1, "forbidden"),
        ) == (
            said[said.index(b_id) : said.index(", within")],
            said.rstrip()[-len(f"hearthnet federation revoke {agreement} --url URL") :],
            still.returncode,
            there[: there.index(" within")],
            [x["status"] for x in await listing(b)],
            (after.returncode, json.loads(after.stderr)["error"]),
        )
    finally:
        for node in (a, b):
            node.stop()
