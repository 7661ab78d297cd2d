"""A relayed link that turns direct while a call streams across it (spec §8: "the link
moves to the direct path with no frame lost or duplicated"): the stream goes on and ends
with every chunk once, in order. Real nodes over loopback."""

from __future__ import annotations

from hearthnet.client import Client
from hearthnet.node import Node
from tests.conftest import MakeConfig
from tests.helpers import wait_until
from tests.mesh.test_relaying import one_community, path_to, relayed_to

CHUNKS = 120
SWITCH_AT = 30  # chunks received before the direct link is dialled


async def test_a_stream_across_the_switch_to_direct_loses_and_repeats_nothing(
    make_config: MakeConfig,
) -> None:
    """echo.stream from b to a while a dials b: every chunk once, in order, then done."""
    configs = [make_config(mesh={"relay": True}), make_config(), make_config()]
    one_community(configs)
    async with (
        Node(configs[0]) as relay,
        Node(relayed_to(configs[1], relay.url)) as a,
        Node(relayed_to(configs[2], relay.url)) as b,
    ):
        await wait_until(
            lambda: (path_to(a, b), path_to(b, a)) == ("relayed", "relayed"),
            20,
            "a and b relayed to each other",
        )
        got: list[int] = []
        kinds: list[str] = []
        paths: set[str | None] = set()
        async with (
            Client(a.url, keys=a.keys) as client,
            client.stream(
                "echo.stream@1.0",
                {"count": CHUNKS, "size": 64, "interval_ms": 10},
                target=b.keys.node_id,
                prefer_ws=False,
                deadline_ms=30_000,
            ) as stream,
        ):
            async for frame in stream:
                kinds.append(frame.event)
                if frame.event == "token":
                    got.append(frame.data["i"])
                    paths.add(path_to(a, b))
                if len(got) == SWITCH_AT:
                    a.mesh.spawn(a.mesh.dial(b.url), "dial-b")
        # both ends settle well before the relayed sequence is retired (10 s): the direct
        # link carries plain frames again
        await wait_until(
            lambda: all(
                n.mesh.links[m.keys.node_id].sequencer is None for n, m in ((a, b), (b, a))
            ),
            5,
            "the direct links plain again",
        )
    assert (list(range(1, CHUNKS + 1)), "done", {"relayed", "direct"}) == (
        got,
        kinds[-1],
        paths,
    )
