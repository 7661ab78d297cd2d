"""A relay does not attach as a member to the relays it federates with (spec §8).

Adding a second relay as docs/operations.md says (an invite made on relay 1, then
``--join INVITE --relay --relay-peer URL1``) leaves relay 1's URL in relay 2's address
book as a relay the invite brought. Relay 1 federates with relay 2 and refuses its
``attach`` on that link, so a member role attached (or trying to) to relay 1 only
confuses ``node status``: relay 2 federates with relay 1 and is reached directly, and
its status says so. Real nodes on loopback."""

from __future__ import annotations

from hearthnet.config import Config
from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import free_port, wait_until
from tests.mesh.test_relay_attach_address import remember
from tests.mesh.test_relaying import one_community

FEDERATE_WITHIN_S = 15.0


def federated(node: Node) -> int:
    relay = node.mesh.relaying.relay
    return 0 if relay is None else relay.statistics()["federated"]


def two_relays(
    make_config: MakeConfig, saved_host: str = "127.0.0.1"
) -> tuple[list[Config], list[int]]:
    """Two relays of one community, each naming the other as its relay peer; relay 2's
    address book holds relay 1 as a relay an invite brought, at ``saved_host`` (by default
    the address of relay 1's ``--relay-peer`` URL on relay 2). Returns the configs and their
    ports."""
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    configs = [
        make_config(node={"port": ports[i]}, mesh={"relay": True, "relay_peers": [urls[1 - i]]})
        for i in range(2)
    ]
    one_community(configs)
    remember(
        configs[1],
        [
            {
                "url": f"http://{saved_host}:{ports[0]}",
                "node": None,
                "source": "relay",
                "last_ok_ms": 0,
                "verified": False,
            }
        ],
    )  # what the invite made on relay 1 left in relay 2's address book
    return configs, ports


async def test_a_second_relay_federates_with_the_first_and_does_not_attach_to_it(
    make_config: MakeConfig,
) -> None:
    """Relay 2 joined with an invite naming relay 1 and names relay 1 as its relay peer:
    federated both ways; relay 2 has no member role (nothing under ``relaying.paths``,
    no hello or manifest saying it is reached through relay 1), and each relay's status
    lists the other as its peer relay."""
    configs, _ = two_relays(make_config)
    async with Node(configs[0]) as relay1, Node(configs[1]) as relay2:
        ids = (relay1.keys.node_id, relay2.keys.node_id)
        await wait_until(
            lambda: (federated(relay1), federated(relay2)) == (1, 1),
            FEDERATE_WITHIN_S,
            "the relays federated",
        )
        shown = [r.mesh.relaying.statistics() for r in (relay1, relay2)]
        attachments = relay2.mesh.relaying.attachments
        manifest = relay2.manifest()
    assert (
        [[ids[1]], [ids[0]]],
        [0, 0],
        [False, False],
        None,
        [],
    ) == (
        [s["relay"]["peers"] for s in shown],
        [s["relay"]["members"] for s in shown],
        ["paths" in s for s in shown],
        attachments,
        manifest["relays"],
    )


async def test_a_relay_peer_named_under_another_url_is_not_attached_to_either(
    make_config: MakeConfig,
) -> None:
    """The invite named relay 1 by another URL than relay 2's ``--relay-peer`` (a name,
    and an IP address): once relay 2's dial finds relay 1 there, that URL is dropped from
    the relays it attaches to and is reached through; it never attached to relay 1."""
    configs, _ = two_relays(make_config, saved_host="localhost")
    async with Node(configs[0]) as relay1, Node(configs[1]) as relay2:
        ids = (relay1.keys.node_id, relay2.keys.node_id)
        relaying = relay2.mesh.relaying
        await wait_until(
            lambda: (federated(relay1), federated(relay2)) == (1, 1),
            FEDERATE_WITHIN_S,
            "the relays federated",
        )
        await wait_until(
            lambda: relaying.relay_urls == (),
            FEDERATE_WITHIN_S * 2,
            "relay 2 dropped relay 1's other URL",
        )
        shown = relaying.statistics()
    assert ([ids[0]], [], [], 0) == (
        shown["relay"]["peers"],
        shown["paths"]["relays"],
        shown["paths"]["attached"],
        relay1.mesh.relaying.statistics()["relay"]["members"],
    )
