"""A relay that dies silently (spec §8 failover, §11 ≤ 5 s): the relay in use is stopped
with SIGSTOP, so its connections stay open and nothing says it is gone; the members'
keepalive notices and their relayed link moves to the other relay. Real relay
processes on loopback (stopped, continued and ended by PID), members in-process."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import time
from pathlib import Path

from hearthnet.client import Client
from hearthnet.config import Config
from hearthnet.errors import HearthNetError
from hearthnet.mesh.relayed_link import path_fields
from hearthnet.mesh.remote import RemoteProvider
from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import NodeProcess, start_node_process, wait_until
from tests.mesh.test_relaying import UNDIALLABLE, one_community, path_to

SILENT_LIMIT_S = 10.0  # the keepalive's 3 s plus a loaded machine; heartbeats need 15 s


def watched(node: Node) -> set[str]:
    """The relays ``node`` keeps alive (none before it is a member)."""
    ours = node.mesh.relaying.attachments
    return set() if ours is None else set(ours.keepalive.watched)


def routed_via(node: Node, provider: str) -> str | None:
    """The neighbour ``node``'s calls to ``provider`` go to: until the provider's own
    capability announcement comes over the relayed link, the route learnt from a relay
    node (a member linked to both, two hops) is the shortest, and a call goes that way,
    not through the relayed path."""
    route = node.router.remote.get(provider)
    return route.via if isinstance(route, RemoteProvider) else None


def member(config: Config, relays: tuple[str, ...]) -> Config:
    """``config`` attached to ``relays``, undiallable, not punching, default heartbeats."""
    mesh = dataclasses.replace(
        config.mesh, relay_urls=relays, advertise_url=UNDIALLABLE, direct_upgrade=False
    )
    return dataclasses.replace(config, mesh=mesh)


async def test_a_stopped_relay_is_left_for_the_other_within_seconds(
    make_config: MakeConfig,
) -> None:
    """SIGSTOP of the relay in use: a pinned call goes through the other relay within the
    limit, and both members counted the stopped relay as silent."""
    configs = [make_config(), make_config(), make_config(), make_config()]
    one_community(configs)
    relays: list[NodeProcess] = []
    try:
        started = await asyncio.gather(
            *(
                asyncio.to_thread(
                    start_node_process, Path(c.node.data_dir), "--relay", "--no-zeroconf"
                )
                for c in configs[:2]
            ),
            return_exceptions=True,
        )
        relays += [r for r in started if isinstance(r, NodeProcess)]
        assert len(relays) == 2, started
        urls = tuple(r.url for r in relays)
        ids = [r.fields["node"] for r in relays]
        async with (
            Node(member(configs[2], urls)) as a,
            Node(member(configs[3], urls)) as b,
        ):
            await wait_until(
                lambda: (
                    all(watched(n) == set(ids) for n in (a, b))
                    and (path_to(a, b), path_to(b, a)) == ("relayed", "relayed")
                    and routed_via(a, b.keys.node_id) == b.keys.node_id
                ),
                30,
                "a and b attached to both relays, relayed to each other, a's calls on it",
            )
            used = path_fields(a.mesh.links[b.keys.node_id])["via"]
            stopped = relays[ids.index(used)]
            stopped.proc.send_signal(signal.SIGSTOP)
            start = time.monotonic()
            answer = None
            async with Client(a.url, keys=a.keys) as client:
                while answer is None and time.monotonic() - start < SILENT_LIMIT_S:
                    with contextlib.suppress(HearthNetError, TimeoutError):
                        answer = await asyncio.wait_for(
                            client.call_with_meta(
                                "echo@1.0", {"x": 1}, target=b.keys.node_id, deadline_ms=1000
                            ),
                            2,
                        )
            via = path_fields(a.mesh.links[b.keys.node_id])["via"]
            # b may answer through the other relay before its own keepalive has called
            # the stopped one silent: that comes within the same limit
            await wait_until(
                lambda: all(n.mesh.relaying.counts["relays_silent"] for n in (a, b)),
                SILENT_LIMIT_S,
                "both members call the stopped relay silent",
            )
            silent = [n.mesh.relaying.counts["relays_silent"] for n in (a, b)]
    finally:
        for r in relays:  # all at once: they shut down in parallel
            with contextlib.suppress(ProcessLookupError):
                r.proc.send_signal(signal.SIGCONT)
                r.proc.send_signal(signal.SIGTERM)
        for r in relays:
            r.stop()
    other = ids[1 - ids.index(used)]
    assert ({"echo": {"x": 1}}, other, [1, 1]) == (
        answer["output"] if answer is not None else None,
        via,
        silent,
    )
