"""A member attaches to its relay whichever of the relay's addresses its link came up at
(spec §8). A node knows its relay under several URLs: the one it was given (an invite's,
``--relay-url``, often a DNS name) and those peers told it (the relay's IP address, its
``https://`` form). Each start dials them all at once and keeps the first link up; when
that is not the relay URL's, the member must attach all the same, or it stays linked to
its relay without being reachable through it. Real nodes on loopback."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from urllib.parse import urlsplit

from hearthnet.config import Config
from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import wait_until
from tests.mesh.test_relaying import one_community

ATTACH_WITHIN_S = 15.0


def watched(node: Node) -> set[str]:
    """The relays ``node`` is attached to and keeps alive."""
    ours = node.mesh.relaying.attachments
    return set() if ours is None else set(ours.keepalive.watched)


def remember(config: Config, addresses: list[dict[str, object]]) -> None:
    """The address book a previous run of the node left (``mesh/peers.json``)."""
    path = Path(config.node.data_dir) / "mesh" / "peers.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"addresses": addresses}), encoding="utf-8")


async def forward(listen: tuple[str, int], to: tuple[str, int]) -> asyncio.Server:
    """A TCP forwarder from ``listen`` to ``to``: the relay answering at a second address."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*to)
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    return await asyncio.start_server(serve, *listen)


async def test_a_member_linked_to_its_relay_at_another_address_attaches(
    make_config: MakeConfig,
) -> None:
    """The relay URL an invite brought does not answer at this start (its name does not
    resolve yet); the relay's other address, which peers told the node, does: attached."""
    relay_config, member_config = make_config(mesh={"relay": True}), make_config()
    one_community([relay_config, member_config])
    async with Node(relay_config) as relay:
        port = urlsplit(relay.url).port or 0
        ident = relay.keys.node_id
        remember(
            member_config,
            [
                {"url": f"http://127.0.0.2:{port}", "node": ident, "source": "relay",
                 "last_ok_ms": 1, "verified": True},
                {"url": f"http://127.0.0.1:{port}", "node": ident, "source": "exchange",
                 "last_ok_ms": 2, "verified": True},
            ],
        )  # fmt: skip
        async with Node(member_config) as member:
            await wait_until(
                lambda: watched(member) == {ident}, ATTACH_WITHIN_S, "the member attached"
            )
            shown = member.mesh.relaying.statistics()["paths"]
    assert ([ident], [ident]) == (shown["relays"], shown["attached"])


async def test_a_member_attaches_once_its_relay_url_answers_with_a_link_up_already(
    make_config: MakeConfig,
) -> None:
    """Linked to the relay at an address peers told it; the configured relay URL answers
    later, its dial finds the relay linked already (a duplicate, dropped): attached."""
    relay_config = make_config(mesh={"relay": True})
    member_config = make_config()
    one_community([relay_config, member_config])
    async with Node(relay_config) as relay:
        port = urlsplit(relay.url).port or 0
        ident = relay.keys.node_id
        name_url = f"http://127.0.0.3:{port}"
        remember(
            member_config,
            [
                {"url": name_url, "node": None, "source": "relay", "last_ok_ms": 0,
                 "verified": False},
                {"url": f"http://127.0.0.1:{port}", "node": ident, "source": "exchange",
                 "last_ok_ms": 2, "verified": True},
            ],
        )  # fmt: skip
        async with Node(member_config) as member:
            await wait_until(
                lambda: ident in member.mesh.links, ATTACH_WITHIN_S, "the member linked"
            )
            server = await forward(("127.0.0.3", port), ("127.0.0.1", port))
            try:
                await wait_until(
                    lambda: member.mesh.book.verified_node(name_url) == ident,
                    ATTACH_WITHIN_S * 3,
                    "the member's dial of the relay URL found the relay",
                )
                await wait_until(
                    lambda: watched(member) == {ident}, ATTACH_WITHIN_S, "the member attached"
                )
            finally:
                server.close()
                await server.wait_closed()
