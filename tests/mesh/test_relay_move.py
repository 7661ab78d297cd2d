"""A fall-back to a relay that no longer has the peer (spec §8: "killing a relay moves its
members to another configured relay ... with nothing acknowledged lost"): a reaches b
through relay R1, their link turns direct, b leaves R1 and the direct link dies; a falls
back through R1, which answers ``unreachable`` for b, and a moves b to R2, the other relay
b's hello listed, while a call streams from b to a: every chunk once, in order. Real
nodes over loopback, in-process: two relays (not federated) and two members attached to
both."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp

from hearthnet.config import Config
from hearthnet.mesh.addresses import normalize_url
from hearthnet.mesh.relayed_link import path_fields
from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import wait_until
from tests.mesh.streams import stream_chunks
from tests.mesh.test_relaying import UNDIALLABLE, one_community, path_to

CHUNKS = 150
SWITCH_AT = 20  # chunks received before a dials b
CUT_WITHIN_S = 20.0


def _member(config: Config, relays: tuple[str, ...]) -> Config:
    """Attached to ``relays``, undiallable, not punching, 1 s heartbeats."""
    mesh = dataclasses.replace(
        config.mesh,
        relay_urls=relays,
        advertise_url=UNDIALLABLE,
        heartbeat_s=1.0,
        direct_upgrade=False,
    )
    return dataclasses.replace(config, mesh=mesh)


def _via(node: Node, peer: Node) -> str | None:
    link = node.mesh.links.get(peer.keys.node_id)
    return None if link is None else path_fields(link)["via"]


def _switch_counts(node: Node) -> tuple[int, int]:
    """``node``'s path switch counters: fall-backs, peers moved on ``unreachable``."""
    switch = node.mesh.relaying.switch
    assert switch is not None
    return (switch.fallbacks, switch.moved)


def _leave(b: Node, relay: Node) -> None:
    """b leaves ``relay``: its link closed with a ``bye``, its URL forgotten so it is not
    dialled again."""
    b.mesh.book.addresses.pop(normalize_url(relay.url), None)
    b.mesh.links[relay.keys.node_id].close("leaving this relay")


def _leave_and_cut(a: Node, b: Node, relay: Node) -> None:
    """b leaves ``relay`` and a's direct link to b is cut at its socket, in one step."""
    _leave(b, relay)
    a.mesh.book.addresses.pop(normalize_url(b.url), None)
    link = a.mesh.links[b.keys.node_id]
    sock: socket.socket = link.ws.get_extra_info("socket")  # type: ignore[attr-defined]
    sock.shutdown(socket.SHUT_RDWR)


@dataclass
class TwoRelays:
    """Relays r1 and r2 (not federated) and members a and b attached to both, relayed to
    each other."""

    a: Node
    b: Node
    relays: tuple[Node, Node]

    def in_use(self) -> tuple[Node, Node, tuple[int, int]]:
        """The relay a sends to b through now (while direct: the one it would fall back
        through), the other relay, and a's switch counters until now. Taken at the step,
        not at set-up: a relay a sent through before b attached to it answers
        ``unreachable`` and a moves b (on a loaded machine, sometimes after set-up)."""
        paths = self.a.mesh.relaying.paths
        assert paths is not None
        via = paths.path(self.b.keys.node_id)[1]
        r1, r2 = self.relays
        assert via in (r1.keys.node_id, r2.keys.node_id), via
        used, other = (r1, r2) if via == r1.keys.node_id else (r2, r1)
        return used, other, _switch_counts(self.a)


@contextlib.asynccontextmanager
async def _two_relays(make_config: MakeConfig) -> AsyncIterator[TwoRelays]:
    """The nodes started, a and b attached to both relays and relayed to each other."""
    configs = [make_config(mesh={"relay": True}) for _ in range(2)]
    configs += [make_config(), make_config()]
    one_community(configs)
    async with Node(configs[0]) as r1, Node(configs[1]) as r2:
        relays = (r1.url, r2.url)
        async with Node(_member(configs[2], relays)) as a, Node(_member(configs[3], relays)) as b:
            cores = [n.mesh.relaying.paths for n in (a, b)]
            await wait_until(
                lambda: (
                    (path_to(a, b), path_to(b, a)) == ("relayed", "relayed")
                    and all(c is not None and len(c.relays.attached_relays) == 2 for c in cores)
                ),
                30,
                "a and b attached to both relays, relayed to each other",
            )
            yield TwoRelays(a, b, (r1, r2))


async def test_a_fall_back_to_a_relay_without_the_peer_moves_to_the_other_listed_relay(
    make_config: MakeConfig,
) -> None:
    """echo.stream from b to a; a dials b at chunk 20; the moment both ends are direct
    (b's chunks still in its relayed sequence, one not acknowledged yet; or, when b had
    nothing unacknowledged as the link came up, plain), b leaves the relay a used and the
    direct link dies: a falls back through that relay, is answered ``unreachable``, moves
    b to the other relay, and the stream ends with every chunk once, in order; /status
    shows the move."""
    async with _two_relays(make_config) as nodes:
        a, b = nodes.a, nodes.b
        cut: list[tuple[str, Node, tuple[int, int]]] = []  # how, the other relay, a's counts
        core_b = b.mesh.relaying.paths
        assert core_b is not None

        def frames() -> str | None:
            """How b's chunks go on the direct link, once both ends are direct and it is
            worth a cut: ``sequenced`` (one in flight) or ``plain``."""
            link = b.mesh.links.get(a.keys.node_id)
            if link is None or (path_to(a, b), path_to(b, a)) != ("direct", "direct"):
                return None
            if link.sequencer is None:
                return "plain"
            return None if core_b.settled(a.keys.node_id) else "sequenced"

        async def leave_when_direct() -> None:
            # the check and the cut in one step. While b's link continues its sequence, the
            # cut waits for a chunk in flight: on a loaded machine every chunk may be
            # acknowledged when the link comes up (b's next one is 10 ms later)
            deadline = time.monotonic() + CUT_WITHIN_S
            while (how := frames()) is None:
                assert time.monotonic() < deadline, "no direct link to cut within the limit"
                await asyncio.sleep(0)
            used, other, counts = nodes.in_use()
            _leave_and_cut(a, b, used)
            cut.append((how, other, counts))

        streamed = await stream_chunks(a, b, chunks=CHUNKS, at=SWITCH_AT, step=leave_when_direct)
        await wait_until(lambda: bool(cut), 10, "the relay left and the link cut")
        via = _via(a, b)
        counts = _switch_counts(a)
        async with aiohttp.ClientSession() as http, http.get(a.url + "/status") as resp:
            shown = (await resp.json())["relaying"]["paths"]["switch"]["moved"]
    whole = list(range(1, CHUNKS + 1))
    [(how, other, before)] = cut
    # the chunks' count and last frame first: a failure shows them, not a 150-item list
    assert (CHUNKS, "done", other.keys.node_id, (1, 1), counts[1], whole) == (
        len(streamed.got),
        streamed.kinds[-1],
        via,
        (counts[0] - before[0], counts[1] - before[1]),
        shown,
        streamed.got,
    ), f"cut with b's chunks {how}"


async def test_a_relayed_peer_that_left_the_relay_in_use_is_reached_through_the_other(
    make_config: MakeConfig,
) -> None:
    """echo.stream from b to a, relayed all along; at chunk 20 b leaves the relay a sends
    through: that relay answers ``unreachable``, a moves b to the other relay, and the
    stream ends with every chunk once, in order."""
    async with _two_relays(make_config) as nodes:
        a, b = nodes.a, nodes.b
        left: list[tuple[Node, int]] = []  # the other relay, a's moves until then

        async def leave() -> None:
            used, other, counts = nodes.in_use()
            _leave(b, used)
            left.append((other, counts[1]))

        streamed = await stream_chunks(a, b, chunks=CHUNKS, at=SWITCH_AT, step=leave, dial=False)
        [(other, before)] = left
        state = (_via(a, b), path_to(a, b), _switch_counts(a)[1] - before)
    assert (CHUNKS, "done", (other.keys.node_id, "relayed", 1), list(range(1, CHUNKS + 1))) == (
        len(streamed.got),
        streamed.kinds[-1],
        state,
        streamed.got,
    )
