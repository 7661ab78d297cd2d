"""Zeroconf discovery between hosts in network namespaces: found by mDNS alone.

Each host runs ``python -m hearthnet.mesh.discovery`` on all its interfaces, with no
peer list: the only way to learn of the others is multicast DNS across the lab's bridge.
"""

from __future__ import annotations

from typing import Any

import pytest

from hearthnet.identity import KeyPair
from tests.chaos.conftest import MakeLab
from tests.chaos.netns import Host, HostProcess, Lab

pytestmark = pytest.mark.chaos

FIND_WITHIN_S = 20.0  # probing ~1 s, then the first query round; generous for a busy box
PORT = 7080


def start_discovery(host: Host, node: str, community: str) -> HostProcess:
    """Run the discovery CLI on ``host`` (all interfaces) for at most a minute."""
    return host.popen(
        *host.python(
            "-m", "hearthnet.mesh.discovery",
            "--name", f"node-{host.name}", "--node", node, "--community", community,
            "--port", str(PORT), "--seconds", "60",
        )
    )  # fmt: skip


def found_nodes(proc: HostProcess) -> dict[str, list[str]]:
    """NodeID -> addresses of every peer the process reported found."""
    return {e["node"]: e["addresses"] for e in proc.json_lines() if e["event"] == "found"}


def wait_found(proc: HostProcess, node: str, within_s: float = FIND_WITHIN_S) -> dict[str, Any]:
    """Wait until ``proc`` reports ``node`` found."""
    return proc.wait_for_json(lambda e: e["event"] == "found" and e["node"] == node, within_s)


def summary(proc: HostProcess) -> dict[str, Any]:
    """Stop ``proc`` (SIGTERM: it says goodbye) and return its summary line."""
    assert 0 == proc.stop(within_s=10)
    return proc.wait_for_json(lambda e: e["event"] == "summary", 1)


def run_community_lab(lab: Lab) -> None:
    """Hosts 0..n-2 in community A, the last one in B; check who finds whom."""
    *members, outsider = lab.hosts
    community_a, community_b = KeyPair.generate().node_id, KeyPair.generate().node_id
    nodes = {host.name: KeyPair.generate().node_id for host in lab.hosts}
    procs = {h.name: start_discovery(h, nodes[h.name], community_a) for h in members}
    procs[outsider.name] = start_discovery(outsider, nodes[outsider.name], community_b)

    for host in members:
        for other in members:
            if other is not host:
                wait_found(procs[host.name], nodes[other.name])
        # The outsider is heard, resolved and ignored (spec §7.1), not merely unseen.
        procs[host.name].wait_for_json(
            lambda e: e["event"] == "ignored" and e["node"] == nodes[outsider.name],
            FIND_WITHIN_S,
        )
    expected = {h.name: {nodes[o.name]: [o.ip] for o in members if o is not h} for h in members}
    found = {h.name: found_nodes(procs[h.name]) for h in members}

    # A member that leaves says goodbye: every other member reports it lost.
    leaver, *stayers = members
    leaver_summary = summary(procs[leaver.name])
    for host in stayers:
        procs[host.name].wait_for_json(
            lambda e: e["event"] == "lost" and e["node"] == nodes[leaver.name], FIND_WITHIN_S
        )
    summaries = {h.name: summary(procs[h.name]) for h in [*stayers, outsider]}
    summaries[leaver.name] = leaver_summary

    assert expected == found
    # The outsider was heard and ignored by every member, and found nobody itself.
    assert ({h.name: True for h in members}, {}, 0) == (
        {h.name: summaries[h.name]["ignored_other_community"] >= 1 for h in members},
        found_nodes(procs[outsider.name]),
        summaries[outsider.name]["peers"],
    )


def test_hosts_find_their_community_by_zeroconf_alone(make_lab: MakeLab) -> None:
    """Three hosts of one community find each other over mDNS; a fourth of another is ignored."""
    run_community_lab(make_lab(4))


def test_discovery_with_ten_percent_loss_on_every_link(make_lab: MakeLab) -> None:
    """With 10 % packet loss on every link, mDNS retries still get everyone found."""
    lab = make_lab(4)
    lab.netem_all(loss_pct=10)
    run_community_lab(lab)
