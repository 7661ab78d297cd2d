"""A direct link that dies within a switch when no relay is left to fall back to (spec §8:
"without losing or duplicating a frame"): both ends hold the relayed sequence, and a
re-dial takes it up, so what the dead link lost arrives once, by the sequence, not by
anti-entropy. Real nodes over loopback: a relay and two members that reach each other
through it, the relay stopped before the direct link comes up."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import time
from collections.abc import AsyncIterator, Callable

import aiohttp

from hearthnet.config import Config
from hearthnet.mesh.addresses import normalize_url
from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import _node_caller, wait_until
from tests.mesh.test_relaying import one_community, path_to, relayed_to

MESSAGES = 200  # published by b while the relay is gone: held in b's relayed sequence
CUT_WITHIN_S = 20.0
REPAIRED_WITHIN_S = 10.0  # for b's repaired copies to reach a (see _copies)


def _member(config: Config, relay_url: str) -> Config:
    """Relayed to ``relay_url``; anti-entropy only every hour, so a lost message stays
    lost for the test (the greeting's ``ihave`` still asks for it: b counts it repaired, and
    a does not count it a duplicate)."""
    config = relayed_to(config, relay_url)
    return dataclasses.replace(config, mesh=dataclasses.replace(config.mesh, anti_entropy_s=3600))


def _cut(a: Node, b: Node) -> None:
    """Cut a's direct link to b at its socket (both ends see it die, no ``bye``)."""
    a.mesh.book.addresses.pop(normalize_url(b.url), None)
    link = a.mesh.links[b.keys.node_id]
    sock: socket.socket = link.ws.get_extra_info("socket")  # type: ignore[attr-defined]
    sock.shutdown(socket.SHUT_RDWR)


@contextlib.asynccontextmanager
async def without_relay(
    make_config: MakeConfig,
    member: Callable[[Config, str], Config] = relayed_to,
    *,
    direct: bool = False,
) -> AsyncIterator[tuple[Node, Node]]:
    """A relay and two members ``a`` and ``b`` (configs made by ``member``) relayed to
    each other; with ``direct``, a then dials b and the link turns direct; then the relay
    stops (it says bye: no relay left at either end)."""
    configs = [make_config(mesh={"relay": True}), make_config(), make_config()]
    one_community(configs)
    async with contextlib.AsyncExitStack() as relay_stack:
        relay = await relay_stack.enter_async_context(Node(configs[0]))
        async with (
            Node(member(configs[1], relay.url)) as a,
            Node(member(configs[2], relay.url)) as b,
        ):
            await wait_until(
                lambda: (path_to(a, b), path_to(b, a)) == ("relayed", "relayed"),
                20,
                "a and b relayed to each other",
            )
            if direct:
                a.mesh.spawn(a.mesh.dial(b.url), "dial-b")
                await wait_until(
                    lambda: (path_to(a, b), path_to(b, a)) == ("direct", "direct"), 20, "direct"
                )
            await relay_stack.aclose()
            cores = [n.mesh.relaying.paths for n in (a, b)]
            await wait_until(
                lambda: all(c is not None and c.relays.primary is None for c in cores),
                10,
                "a and b without a relay",
            )
            yield a, b


async def test_a_direct_link_cut_with_no_relay_left_resends_its_sequence_on_a_redial(
    make_config: MakeConfig,
) -> None:
    """The relay stops, b publishes 200 messages (held in its relayed sequence), a dials
    b, and the direct link is cut while b's frames on it are unacknowledged: neither end
    can fall back, both hold the sequence, a re-dials, b's sequence goes on (not
    restarted) until a acknowledged all of it, and a holds every message, each one
    brought by the sequence (any repaired copy was a duplicate)."""
    async with without_relay(make_config, _member) as (a, b):
        me = _node_caller(b)
        await asyncio.gather(
            *(b.pubsub.publish(me, "held", "m", {"i": i}) for i in range(MESSAGES))
        )
        core_b, switch_a, switch_b = (
            b.mesh.relaying.paths,
            a.mesh.relaying.switch,
            b.mesh.relaying.switch,
        )
        assert core_b is not None
        assert switch_a is not None
        assert switch_b is not None
        a.mesh.spawn(a.mesh.dial(b.url), "dial-b")
        # the moment b's link to a is direct, with its sequence resent on it and not
        # all acknowledged yet: cut (the check and the cut in one step of the loop)
        deadline = time.monotonic() + CUT_WITHIN_S
        while path_to(b, a) != "direct" or path_to(a, b) != "direct":
            assert time.monotonic() < deadline, "no direct link within the limit"
            await asyncio.sleep(0)
        unsettled = not core_b.settled(a.keys.node_id)
        numbered = core_b.numbers(a.keys.node_id)[0]
        _cut(a, b)
        await wait_until(lambda: (path_to(a, b), path_to(b, a)) == (None, None), 10, "the cut seen")
        held = (switch_a.held.held, switch_b.held.held)
        a.mesh.spawn(a.mesh.dial(b.url), "redial-b")
        await wait_until(
            lambda: a.mesh.tracker.heads.get(b.keys.node_id, 0) >= MESSAGES,
            30,
            "a holds every message of b",
        )
        await wait_until(lambda: core_b.settled(a.keys.node_id), 10, "b's sequence acked")
        rows = await a.message_log.reader.read_origin(b.keys.node_id, 1, MESSAGES, 1000)
        # the greeting's ``ihave`` can overtake the messages' ingestion at a, which
        # then asks for them again: b repairs, and each copy is a duplicate at a
        copies = await _copies(a, b, REPAIRED_WITHIN_S)
        resumed = (switch_a.held.resumed, switch_b.held.resumed)
        shown = await _shown(a)
        continued = core_b.numbers(a.keys.node_id)[0] >= numbered > MESSAGES
    assert (True, (1, 1), (1, 1), True, MESSAGES, copies[0], (1, 1, 0, 1.0, 1.0)) == (
        unsettled,
        held,
        resumed,
        continued,
        len(rows),
        copies[1],
        shown,
    )


async def _copies(a: Node, b: Node, within_s: float) -> tuple[float, float]:
    """The messages b repaired and the duplicates a counted, once a took every repaired
    copy, or after ``within_s``. b's answer to a's ``iwant`` (read from its log) can go
    after its sequence settled, plainly: it may still be on its way when a holds every
    message and b's sequence is acknowledged (under load, b counts the copies repaired
    before a has taken them). Each copy is a duplicate at a when the sequence brought
    the message first; when it did not, a counts none of them and the two stay apart."""
    deadline = time.monotonic() + within_s
    while True:
        copies = (b.mesh.repaired.get(), a.pubsub.metrics.duplicates.get())
        if copies[1] >= copies[0] or time.monotonic() > deadline:
            return copies
        await asyncio.sleep(0.01)


async def _shown(node: Node) -> tuple[int, int, int, float, float]:
    """The held sequences ``hearthnet node status --json`` (``/status``) shows, held,
    resumed and expired, and ``/metrics``' held and resumed."""
    async with aiohttp.ClientSession() as http:
        async with http.get(node.url + "/status") as resp:
            switch = (await resp.json())["relaying"]["paths"]["switch"]
        async with http.get(node.url + "/metrics") as resp:
            lines = (await resp.text()).splitlines()
    metrics = dict(line.rsplit(" ", 1) for line in lines if line[:1] != "#")
    return (
        switch["held"],
        switch["resumed"],
        switch["expired"],
        float(metrics['hearthnet_path_switch_events{event="held"}']),
        float(metrics['hearthnet_path_switch_events{event="resumed"}']),
    )
