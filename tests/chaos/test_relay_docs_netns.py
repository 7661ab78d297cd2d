"""docs/operations.md followed word for word in the NAT lab, so the docs cannot drift:
"Run a relay on a small VPS" (the relay founds the community and invites; a second
relay joins and the two federate, the first naming the second from its first start, so
it need not restart: that step was checked by hand), "A home node behind NAT" (join with the relay's
invite, restart without flags, a second relay in ``hearthnet.toml``), then the
commands a user checks it with, each a real ``hearthnet`` CLI process in the home's
namespace: ``peers`` (table and ``--json``: one row per peer, no nameless row at the
other home's private address), ``call``, ``pub``/``sub``, ``bridge``,
``node status``, the relay's ``/metrics``; and the first relay stopped, the homes
carry on through the second.

Both routers are symmetric NATs (``fully-random``), so the direct upgrade fails and the
homes stay relayed: what is checked is the relay path. Each machine has its own data
directory (``$HEARTHNET_DATA_DIR``, as on separate machines) and no zeroconf (nothing
multicasts across the internet; in the lab the relays share one bridge)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.conftest import MakeNatLab
from tests.chaos.netns import HostProcess, Machine
from tests.chaos.test_relay_failover_netns import through
from tests.chaos.test_relay_netns import FAST

pytestmark = [pytest.mark.chaos, pytest.mark.slow]

READY_S = 60.0  # several nodes start at once on a loaded 2-core machine
SETTLE_S = 60.0  # relayed links and attachments, on the same machine
PUBLISHED = [{"n": 1}, {"n": 2}, {"n": 3}]


class User:
    """Somebody at one machine's shell: ``hearthnet`` commands with its data directory."""

    def __init__(self, root: Path, machine: Machine) -> None:
        self.machine = machine
        self.env = {
            **FAST,
            "HEARTHNET_DATA_DIR": str(root / machine.name),
            "HEARTHNET_MESH_ZEROCONF": "false",
        }

    def argv(self, *args: str) -> list[str]:
        env = [f"{key}={value}" for key, value in self.env.items()]
        return ["env", *env, *self.machine.python("-m", "hearthnet.cli", *args)]

    def start(self, *args: str) -> HostProcess:
        """``hearthnet node start ARGS``, not waited for (:func:`ready`)."""
        return self.machine.popen(*self.machine.python("-m", "hearthnet.cli", "node", "start",
                                                       *args), env=self.env)  # fmt: skip

    def run(self, *args: str, stdin: str | None = None) -> str:
        """``hearthnet ARGS`` to its end; its stdout (exit status 0 required)."""
        return self.machine.run(*self.argv(*args), timeout=60, input=stdin).stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.run(*args, "--json"))

    def stop(self) -> None:
        """``hearthnet node stop``: SIGTERM, waited for."""
        self.run("node", "stop")

    @property
    def config(self) -> Path:
        return Path(self.env["HEARTHNET_DATA_DIR"]) / "hearthnet.toml"


def ready(*procs: HostProcess) -> list[str]:
    """Each node's NodeID from its ready line."""
    lines = [p.wait_for_line(lambda ln: ln.startswith("hearthnet ready"), READY_S) for p in procs]
    return [ln.split(" node=")[1].split()[0] for ln in lines]


def at_once(*calls: Callable[[], Any]) -> list[Any]:
    """Run ``calls`` in threads at once (commands on different machines, or several on
    one, as two terminals would); their results in order."""
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(call) for call in calls]]


def until(fetch: Callable[[], Any], holds: Callable[[Any], bool], what: str) -> Any:
    """Poll ``fetch()`` until ``holds`` its result (:data:`SETTLE_S` at most)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        value = fetch()
        if holds(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last: {value!r}")
        time.sleep(0.5)


def peer_paths(user: User) -> dict[str, tuple[str, str | None]]:
    """``{node: (path, via)}`` of the linked peers, from ``hearthnet peers --json``."""
    return {p["node"]: (p["path"], p["via"]) for p in user.json("peers")["peers"] if p["linked"]}


def via_relay(table: str) -> bool:
    """Whether the ``hearthnet peers`` table lists a peer reached through a relay
    (``relayed via NAME``, or ``upgrading via NAME`` while a direct upgrade is tried)."""
    return re.search(r"\b(relayed|upgrading) via \S", table) is not None


def relays_attached(user: User) -> set[str]:
    """The relays the node is attached to now, from its ``/status`` (what ``hearthnet node
    status --json`` prints; read with curl, polled without an interpreter start each)."""
    text = user.machine.run("curl", "-s", "http://127.0.0.1:7080/status", timeout=30).stdout
    return set(json.loads(text)["relaying"]["paths"]["attached"])


def one_row_each(rows: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The addresses of ``hearthnet peers --json`` rows with no node (another home's
    private address, passed on by the relay, once made one), and the nodes listed twice."""
    nodes = [r["node"] for r in rows if r["node"] is not None]
    return [r["url"] for r in rows if r["node"] is None], sorted(
        {n for n in nodes if nodes.count(n) > 1}
    )


def metrics(user: User, prefix: str) -> float:
    """The sum of the node's ``/metrics`` samples whose line starts with ``prefix``."""
    text = user.machine.run("curl", "-s", "http://127.0.0.1:7080/metrics", timeout=30).stdout
    return sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith(prefix))


def test_the_relay_and_home_node_docs_word_for_word(
    make_nat_lab: MakeNatLab, tmp_path: Path
) -> None:
    lab = make_nat_lab(
        ["fully-random", "fully-random"],
        public=("relay", "relay2"),
        names={"relay1.example.org": "relay", "relay2.example.org": "relay2"},
    )
    vps, vps2 = User(tmp_path, lab.public["relay"]), User(tmp_path, lab.public["relay2"])
    home_a, home_b = (User(tmp_path, h) for h in lab.homes)
    # the relays by name, as in the docs: the homes also learn their addresses from peers
    url1, url2 = "http://relay1.example.org:7080", "http://relay2.example.org:7080"
    named = ("--relay-url", url1, "--bootstrap", url1)
    relay_args = ("--host", "0.0.0.0", "--port", "7080", "--relay")
    procs: list[HostProcess] = []
    try:
        # Run a relay on a small VPS: the first start founds the community (naming the
        # relay it will federate with, so that it need not restart when that one joins)
        procs.append(vps.start(*relay_args, "--relay-peer", url2))
        (relay1,) = ready(procs[-1])
        # one invite per home node, and one for a second relay
        invite, invite_b, invite_vps2 = at_once(
            lambda: vps.json("community", "invite", *named),
            lambda: vps.run("community", "invite", *named).strip(),
            lambda: vps.run("community", "invite", *named).strip(),
        )
        # the second relay joins once with its invite; both relays name each other
        procs.append(vps2.start(*relay_args, "--join", invite_vps2, "--relay-peer", url1))
        (relay2,) = ready(procs[-1])
        # A home node behind NAT: once with an invite made on the relay
        procs.append(home_a.start("--join", invite["invite"]))
        procs.append(home_b.start("--join", invite_b))
        _, b = ready(*procs[-2:])
        paths = until(
            lambda: peer_paths(home_a),
            lambda got: got.get(b) in through(relay1),
            "home A relayed to home B through the first relay",
        )
        table = home_a.run("peers")
        rows = home_a.json("peers")["peers"]
        answer = home_a.json("call", "echo@1.0", "--body", '{"x": 1}', "--target", b)
        sub = home_b.machine.popen(*home_b.argv("sub", "home.news", "--last", "3", "--count", "3"))
        procs.append(sub)
        home_a.run("pub", "home.news", "--data", json.dumps(PUBLISHED[0]))
        bridged = [
            json.loads(line)
            for line in home_a.run(
                "bridge",
                stdin="\n".join(
                    json.dumps(frame)
                    for frame in (
                        {"type": "publish", "topic": "home.news", "msg_type": "message",
                         "data": PUBLISHED[1], "ref": "p1"},
                        {"type": "call", "id": "c1", "capability": "echo@1.0",
                         "input": {"x": 2}, "target": b},
                    )
                ) + "\n",
            ).splitlines()
        ]  # fmt: skip
        status, relay_members, forwarded = at_once(
            lambda: home_a.json("node", "status"),
            lambda: metrics(vps, "hearthnet_relay_members"),
            lambda: metrics(vps, "hearthnet_relay_forwarded_frames"),
        )
        # the second relay federates with the first and is not a member of it, although
        # its invite names the first relay: no relaying.paths, nobody attached yet
        second = until(
            lambda: vps2.json("node", "status")["relaying"],
            lambda got: got["relay"]["peers"] == [relay1],
            "the second relay federated with the first",
        )
        # afterwards: started without flags, a second relay in hearthnet.toml
        at_once(home_a.stop, home_b.stop)
        for home in (home_a, home_b):
            home.config.write_text(f'[mesh]\nrelay_urls = ["{url2}"]\n', encoding="utf-8")
        procs += [home_a.start(), home_b.start()]
        ready(*procs[-2:])
        attached = until(
            lambda: [relays_attached(h) for h in (home_a, home_b)],
            lambda got: got == [{relay1, relay2}] * 2,
            "both homes attached to both relays (the invite's and the configured one)",
        )
        vps.stop()  # the first relay goes away: the homes carry on through the second
        home_a.run("pub", "home.news", "--data", json.dumps(PUBLISHED[2]))
        sub.wait_for_line(lambda ln: json.dumps(PUBLISHED[2]) in ln, SETTLE_S)
        after = until(
            lambda: peer_paths(home_a),
            lambda got: got.get(b) in through(relay2),
            "home A relayed to home B through the second relay",
        )
        answer2 = home_a.json("call", "echo@1.0", "--body", '{"x": 3}', "--target", b)
        until(
            lambda: relays_attached(home_a),
            lambda got: got == {relay2},
            "home A attached to the second relay only",
        )
        table2 = home_a.run("peers")
    finally:
        for proc in reversed(procs):
            if proc.returncode is None:
                proc.host.kill(proc, 15)
    by_event = {(f["event"], f.get("call")): f["data"] for f in bridged}
    assert (
        (invite["bootstrap"], invite["relays"]),
        True,
        True,
        ([], []),
        ({"echo": {"x": 1}}, b),
        {"echo": {"x": 2}},
        "p1",
        [relay1],
        2,
        True,
        (False, 0),
        [{relay1, relay2}] * 2,
        PUBLISHED,
        True,
        {"echo": {"x": 3}},
        True,
    ) == (
        ([url1], [url1]),
        paths[b] in through(relay1),
        via_relay(table),
        one_row_each(rows),
        (answer["output"], answer["meta"]["node"]),
        by_event.get(("output", "c1")),
        by_event.get(("published.ok", None), {}).get("ref"),
        status["relaying"]["paths"]["attached"],
        relay_members,
        forwarded > 0,
        ("paths" in second, second["relay"]["members"]),
        attached,
        [m["data"] for m in sub.json_lines()],
        after[b] in through(relay2),
        answer2["output"],
        via_relay(table2),
    )
