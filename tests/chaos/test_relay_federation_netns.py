"""Relays beyond one relay and its members (spec §8): two home nodes behind NAT, each
attached to a different relay, the relays federated, so a frame for the other home node
goes relay → relay → node; and a home node joining through the relay of an inviter that
is itself behind NAT; and a second community federated with the first, whose bridge, behind
a fourth NAT, reaches home A only through relay 1. The scenarios share one lab and its
nodes (home A founded the community and is attached to relay 1; the joiner is a third
home, the other community's bridge a fourth). Real node processes
in network namespaces; no home node can dial another, and the NATs are symmetric
(fully-random) so the direct upgrade fails and the paths stay relayed (the upgrade
itself: test_punch_netns.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from hearthnet.client import Client
from hearthnet.clock import now_ms
from hearthnet.community import CommunityStore, Level
from hearthnet.errors import WireError
from hearthnet.federation.agreement import Agreement, Grant, Revocation
from hearthnet.federation.carried_client import carried_by
from hearthnet.federation.store import FederationStore
from hearthnet.identity import KeyPair, load_or_create_keys
from hearthnet.ids import new_ulid
from hearthnet.membership import Membership
from tests.chaos.mesh_lab import NamespacedClient
from tests.chaos.nat_lab import HomeHost, NatLab, PublicHost
from tests.chaos.netns import Machine
from tests.chaos.relay_lab import launch, metric, start_all, stop_all, url
from tests.chaos.test_relay_netns import (
    PORT,
    both_paths,
    cli,
    paths,
    prepare,
    public_status,
    relayed_in,
    subscribe,
)
from tests.helpers import eventually

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

REFUSED = 'hearthnet_mesh_refused_total{reason="unauthorized"}'
ENDED = 'hearthnet_federated_refused{reason="agreement_ended"}'
NOT_A_BRIDGE = 'hearthnet_federated_refused{reason="not_a_bridge"}'
NON_BRIDGE = "nonbridge"  # a member of the other community not named as its bridge


@dataclass
class Federated:
    """The lab, the data root, the two relays, homes A and B, the joiner, the other
    community's bridge, and the keys of home A, relay 1, relay 2 and home B (in that
    order; home A founded the community)."""

    lab: NatLab
    root: Path
    relay1: PublicHost
    relay2: PublicHost
    a: HomeHost
    b: HomeHost
    joiner: HomeHost
    bridge: HomeHost
    keys: list[KeyPair]


@pytest.fixture(scope="module")
def fed(nat_lab_support: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federated]:
    """Relays 1 and 2 federated; home A on relay 1, home B on relay 2; a third home idle."""
    root = tmp_path_factory.mktemp("federated")
    with NatLab(["fully-random"] * 4, public=("relay", "relay2")) as lab:
        relay1, relay2 = lab.public["relay"], lab.public["relay2"]
        home_a, home_b, joiner, bridge = lab.homes
        keys = prepare(root, [home_a, relay1, relay2, home_b])
        procs = start_all(
            root,
            [
                # relays federate when each names the other (spec §8)
                (relay2, ("--relay", "--relay-peer", url(relay1))),
                (relay1, ("--relay", "--relay-peer", url(relay2))),
                (home_a, ("--relay-url", url(relay1))),
                (home_b, ("--relay-url", url(relay2))),
            ],
        )
        try:
            yield Federated(lab, root, relay1, relay2, home_a, home_b, joiner, bridge, keys)
        finally:
            stop_all(procs)


async def test_two_nat_nodes_publish_and_call_through_federated_relays(fed: Federated) -> None:
    """Home A on relay 1, home B on relay 2, relays federated: pub/sub, a pinned call and a
    pinned stream cross; relay 1's /metrics count what it forwarded."""
    root, home_a, home_b = fed.root, fed.a, fed.b
    a_keys, r1_keys, r2_keys, b_keys = fed.keys
    want = (("relayed", r1_keys.node_id), ("relayed", r2_keys.node_id))
    seen = await eventually(
        lambda: both_paths(root, home_a, home_b),
        lambda got: (got[0].get(b_keys.node_id), got[1].get(a_keys.node_id)) == want,
        within_s=60,
        what="each home node relayed to the other, each via its own relay",
    )
    sub = subscribe(root, home_b, "home.news", 1)
    try:
        published = await asyncio.to_thread(
            cli, root, home_a, "pub", "home.news", "--json", "--data", '{"n": 42}'
        )
        line = await asyncio.to_thread(sub.wait_for_line, lambda ln: '"n": 42' in ln, 30)
        answer = await asyncio.to_thread(
            cli, root, home_a, "call", "echo", "--body", '{"x": 7}', "--target", b_keys.node_id
        )
        events = await asyncio.to_thread(streamed, root, home_a, b_keys.node_id)
        opened = await asyncio.to_thread(relayed_in, root, home_b)
        status = await asyncio.to_thread(public_status, fed.relay1)
        forwarded = [
            await asyncio.to_thread(metric, fed.relay1, f"hearthnet_relay_forwarded_{unit}")
            for unit in ("frames", "bytes")
        ]
    finally:
        stop_all([sub])
    got = json.loads(line)
    assert (
        want,
        (published["id"], {"n": 42}),
        {"echo": {"x": 7}},
        ["token"] * 5 + ["done"],
        True,
        True,
        [True, True],
    ) == (
        (seen[0][b_keys.node_id], seen[1][a_keys.node_id]),
        (got["id"], got["data"]),
        answer,
        events,
        opened > 0,
        status["relaying"]["relay"]["forwarded"] > 0,
        [n > 0 for n in forwarded],
    )


def streamed(root: Path, machine: Machine, target: str) -> list[str]:
    """The events of ``hearthnet call echo.stream --stream`` (5 tokens) pinned to
    ``target``, run in the machine's namespace."""
    done = machine.run(
        *machine.python(
            "-m", "hearthnet.cli", "call", "echo.stream", "--stream", "--body", '{"count": 5}',
            "--target", target, "--data-dir", str(root / machine.name),
        ),
        timeout=60,
    )  # fmt: skip
    return [json.loads(line)["event"] for line in done.stdout.splitlines()]


async def test_a_nat_node_joins_through_the_relay_of_an_inviter_behind_nat(
    fed: Federated,
) -> None:
    """The inviter is behind NAT: the new node, behind another NAT, joins through the relay."""
    root, relay, home_a, joiner = fed.root, fed.relay1, fed.a, fed.joiner
    a_keys, relay_keys = fed.keys[0], fed.keys[1]
    await eventually(
        lambda: asyncio.to_thread(public_status, relay),
        lambda got: got["relaying"]["relay"]["members"] == 1,
        within_s=30,
        what="home A attached to relay 1",
    )
    made = home_a.run(
        *home_a.python(
            "-m", "hearthnet.cli", "community", "invite",
            "--data-dir", str(root / home_a.name),
            "--bootstrap", url(home_a), "--relay-url", url(relay),
        ),
        timeout=60,
    )  # fmt: skip
    proc = launch(root, joiner, "--join", made.stdout.strip())
    try:
        proc.wait_for_line(lambda line: line.startswith("hearthnet ready"), 60)
        seen = await eventually(
            lambda: asyncio.to_thread(paths, root, joiner),
            lambda got: got.get(a_keys.node_id) == ("relayed", relay_keys.node_id),
            within_s=60,
            what="the new member relayed to the inviter",
        )
        status = await asyncio.to_thread(public_status, relay)
    finally:
        stop_all([proc])
    assert (("relayed", relay_keys.node_id), 1) == (
        seen[a_keys.node_id],
        status["relaying"]["relay"]["joins_forwarded"],
    )


# --- community federation through a relay (spec §8) ---------------------------------------

CHAT, NEWS = Grant(("chat.**",), ("echo@1",)), Grant(("news.*",), ())


def other_community(
    root: Path, bridge: HomeHost, home_a: HomeHost, a_keys: KeyPair
) -> tuple[KeyPair, Agreement]:
    """Community B, founded by the bridge's key, with a second member (data dir
    ``NON_BRIDGE``), and an agreement with home A's community (A grants chat.** and
    echo@1, B grants news.*; home A and the bridge are the named bridges), signed by both
    founders; the bridge's and the second member's data dirs hold it with A's records, as
    ``federation accept`` leaves it."""
    keys = load_or_create_keys(root / bridge.name)
    second = load_or_create_keys(root / NON_BRIDGE)
    view = Membership(keys.node_id)
    view.add(view.sign(keys, "community.created", keys.node_id, now_ms=1, name="b"))
    view.add(view.sign(keys, "member.added", second.node_id, now_ms=2, level=Level.MEMBER))
    for name in (bridge.name, NON_BRIDGE):
        CommunityStore(root / name).replace(list(view.records.values()))
    now = now_ms()
    agreement = Agreement.propose(
        a_keys,
        agreement_id=new_ulid(now),
        community_a=a_keys.node_id,
        community_b=keys.node_id,
        a_grants_b=CHAT,
        b_grants_a=NEWS,
        now_ms=now,
        expires_ms=now + 86_400_000,
        bridges_a=(a_keys.node_id,),  # spec §8: only the named bridges use relays
        bridges_b=(keys.node_id,),
    ).countersign(keys)
    for name in (bridge.name, NON_BRIDGE):
        store = FederationStore(root / name)
        try:
            store.put_agreement(agreement)
            store.put_records(a_keys.node_id, CommunityStore(root / home_a.name).load())
        finally:
            store.close()
    return keys, agreement


async def held(root: Path, machine: Machine) -> list[str]:
    """The statuses of the agreements the machine's node holds."""
    async with NamespacedClient(root, machine, PORT) as client:
        answer = await client.request_json("GET", "/mesh/v1/federation")
    return [a["status"] for a in answer["agreements"]]


async def history(root: Path, machine: Machine, topic: str) -> list[Any]:
    """The ``data`` of every message the machine's node holds on ``topic``, sorted."""
    async with NamespacedClient(root, machine, PORT) as client:
        page = await client.history(topic, limit=100)
    return sorted((m["data"]["data"] for m in page["messages"]), key=json.dumps)


async def call_code(client: Client, capability: str) -> str | None:
    """None when ``capability`` answers through the relay, else the error's code."""
    try:
        await client.call(capability, {"x": 1})
    except WireError as exc:
        return exc.code
    return None


async def test_federated_communities_bridge_through_a_relay(fed: Federated) -> None:
    """B's bridge behind NAT reaches A's home node behind NAT only through A's relay:
    granted topics flow both ways, others do not; the granted capability answers, others
    are forbidden; a member of B not named a bridge is refused by the relay
    (not_a_bridge); revoking the agreement stops both within 10 s."""
    root, relay, home_a, bridge = fed.root, fed.relay1, fed.a, fed.bridge
    a_keys = fed.keys[0]
    b_keys, agreement = other_community(root, bridge, home_a, a_keys)
    b_records = {b_keys.node_id: [r.to_json() for r in CommunityStore(root / bridge.name).load()]}
    async with NamespacedClient(root, home_a, PORT) as ca:
        await ca.request_json(
            "POST",
            "/mesh/v1/federation",
            {"agreements": [agreement.to_json()], "records": b_records},
        )
        await ca.publish("secret.plans", "m", {"n": "hidden"})
        await ca.publish("chat.room", "m", {"n": "a1"})
    # A's relay learns it from A's mesh (mesh.federation) before B's bridge dials it
    await eventually(lambda: held(root, relay), lambda s: s == ["in_force"], 30, "relay 1 holds it")
    proc = launch(
        root, bridge, "--relay-url", url(relay), "--federation-peer", f"mesh:{a_keys.node_id}"
    )
    # on the joiner's machine (its node is stopped), on a port of its own
    other = launch(root, fed.joiner, "--relay-url", url(relay), name=NON_BRIDGE, port="7081")
    try:
        proc.wait_for_line(lambda line: line.startswith("hearthnet ready"), 60)
        async with NamespacedClient(root, bridge, PORT) as cb:
            await cb.publish("chat.room", "m", {"n": "b-chat"})  # B grants A no chat
            await cb.publish("news.today", "m", {"n": "b1"})
        await eventually(
            lambda: history(root, bridge, "chat.room"), lambda d: {"n": "a1"} in d, 60, "A→B"
        )
        await eventually(
            lambda: history(root, home_a, "news.today"), lambda d: {"n": "b1"} in d, 30, "B→A"
        )
        # what hearthnet peers --json prints on the bridge: A's relay it attached to, and
        # home A through it
        async with NamespacedClient(root, bridge, PORT) as cb:
            peers = await cb.request_json("GET", "/mesh/v1/peers")
        federated = sorted(
            (p["node"], p["community"], p["bridge"], p["relay"], p["path"], p["via"])
            for p in peers["peers"]
            if p.get("community")
        )
        async with (
            NamespacedClient(root, bridge, PORT) as outer,
            carried_by(outer, a_keys.node_id, keys=b_keys, community=b_keys.node_id) as client,
        ):
            calls = [await call_code(client, "echo@1"), await call_code(client, "echo.stream@1")]
            not_a_bridge = await eventually(
                lambda: asyncio.to_thread(metric, relay, NOT_A_BRIDGE),
                lambda n: n >= 1,
                30,
                "the relay refuses B's member that is not a bridge",
            )
            revoked_at = time.monotonic()
            revocation = Revocation.create(a_keys, agreement.id, now_ms())
            async with NamespacedClient(root, home_a, PORT) as ca:
                await ca.request_json(
                    "POST", "/mesh/v1/federation", {"revocations": [revocation.to_json()]}
                )
            await eventually(
                lambda: call_code(client, "echo@1"), lambda code: code is not None, 10, "calls stop"
            )
            stopped_s = time.monotonic() - revoked_at
        # the relay hands the revocation to B's bridge before it closes their link
        statuses = await eventually(
            lambda: held(root, bridge), lambda s: s == ["revoked"], 10, "B holds the revocation"
        )
        async with (
            NamespacedClient(root, home_a, PORT) as ca,
            NamespacedClient(root, bridge, PORT) as cb,
        ):
            await ca.publish("chat.room", "m", {"n": "after"})
            await cb.publish("news.today", "m", {"n": "after"})
        await asyncio.sleep(3)  # a pull parks 2 s, a push is woken by the commit
        after = [
            await history(root, bridge, "chat.room"),
            await history(root, home_a, "news.today"),
            await history(root, bridge, "secret.plans"),
            await history(root, home_a, "chat.room"),
        ]
        # home A held the revocation first: it ended its relayed link with B's bridge
        ended = await asyncio.to_thread(metric, home_a, ENDED)
        # B's bridge dials the relay again and is refused as any other community's node
        refused = await eventually(
            lambda: asyncio.to_thread(metric, relay, REFUSED),
            lambda n: n >= 1,
            15,
            "the relay refuses B's bridge",
        )
    finally:
        stop_all([proc, other])
    relay_id = fed.keys[1].node_id
    assert (
        sorted(
            [
                (a_keys.node_id, a_keys.node_id, True, False, "relayed", relay_id),
                (relay_id, a_keys.node_id, False, True, "direct", None),
            ]
        )
        == federated
    )
    assert (
        [None, "forbidden"],
        True,
        [
            [{"n": "a1"}, {"n": "b-chat"}],  # A's chat.room, and B's own
            [{"n": "b1"}],  # nothing after the revocation, either way
            [],  # not granted
            [{"n": "a1"}, {"n": "after"}],  # B grants A no chat
        ],
        True,
        True,
        ["revoked"],
        True,
    ) == (
        calls,
        stopped_s < 10,
        after,
        ended >= 1,
        refused >= 1,
        statuses,
        not_a_bridge >= 1,
    )
