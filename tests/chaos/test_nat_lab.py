"""The NAT lab itself: mappings, no unsolicited inbound, hole punching, loss, blocks, cleanup."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.chaos import nat_lab
from tests.chaos.conftest import MakeNatLab
from tests.chaos.nat_lab import PUNCH_SCRIPT, HomeHost, NatLab, PublicHost
from tests.chaos.netns import NETNS_ETC, REPO_ROOT, HostProcess, lab_namespaces, sweep_stale

pytestmark = pytest.mark.chaos

RENDEZVOUS_PORTS = ("7000", "7001")
PUNCH_WITHIN_S = 3.0  # each side's simultaneous-open attempts, a few seconds as a node would


def serve(relay: PublicHost) -> HostProcess:
    """The rendezvous server on ``relay``, listening once this returns."""
    proc = relay.popen(*relay.python(str(PUNCH_SCRIPT), "serve", relay.ip, *RENDEZVOUS_PORTS))
    proc.wait_for_json(lambda event: event["event"] == "listening", within_s=10)
    return proc


def observed(home: HomeHost, relay: PublicHost, local_port: int) -> list[tuple[str, int]]:
    """The public ip:port ``relay`` sees for ``home``'s connections from ``local_port``,
    one per rendezvous port (each connection kept open while the next is made)."""
    done = home.run(
        *home.python(str(PUNCH_SCRIPT), "observe", relay.ip, ",".join(RENDEZVOUS_PORTS)),
        *("--local-port", str(local_port), "--name", home.name),
        timeout=15,
    )
    events = [json.loads(line) for line in done.stdout.splitlines()]
    return [(e["public"][0], e["public"][1]) for e in events if e["event"] == "observed"]


def connect(source: Any, ip: str, port: int, within_s: float = 1.0) -> str:
    """How a connect() from ``source``'s namespace to ``ip:port`` ends."""
    done = source.run(
        *source.python(str(PUNCH_SCRIPT), "connect", ip, str(port), "--within", str(within_s)),
        timeout=within_s + 10,
    )
    return str(json.loads(done.stdout)["result"])


def punch_pair(
    lab: NatLab, a: HomeHost, b: HomeHost, within_s: float = PUNCH_WITHIN_S
) -> list[dict[str, Any]]:
    """Both hosts rendezvous at the relay and try a simultaneous open to each other;
    each one's final event (``established`` or ``failed``)."""
    relay = lab.public["relay"]
    serve(relay)
    procs = [
        h.popen(
            *h.python(str(PUNCH_SCRIPT), "punch", relay.ip, RENDEZVOUS_PORTS[0]),
            *("--local-port", str(port), "--name", h.name, "--pair", "ab"),
            *("--within", str(within_s)),
        )
        for h, port in ((a, 41001), (b, 42002))
    ]
    return [
        p.wait_for_json(lambda e: e["event"] in ("established", "failed"), within_s=within_s + 15)
        for p in procs
    ]


def test_nat_labs_are_refused_without_nft(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the nft binary the NAT lab gives a reason to skip instead of failing."""
    monkeypatch.setattr(nat_lab, "unavailable_reason", lambda: None)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "nft (nftables) is not installed" == nat_lab.nat_unavailable_reason()


def test_a_public_server_sees_the_routers_address(make_nat_lab: MakeNatLab) -> None:
    """A home host's connection arrives from its router's public address; plain keeps the port."""
    lab = make_nat_lab(["plain"])
    relay, (home,) = lab.public["relay"], lab.homes
    serve(relay)
    assert [(home.router.public_ip, 40001)] * 2 == observed(home, relay, 40001)


def test_plain_maps_one_port_per_host_port_and_fully_random_one_per_connection(
    make_nat_lab: MakeNatLab,
) -> None:
    """From one local port, plain NAT shows the relay one public port, fully-random a new one
    per connection (the symmetric NAT of spec §8)."""
    lab = make_nat_lab(["plain", "fully-random"])
    relay = lab.public["relay"]
    serve(relay)
    plain, symmetric = (observed(home, relay, 40002) for home in lab.homes)
    assert (
        {"203.0.113.100"},
        1,
        {"203.0.113.101"},
        2,
    ) == (
        {ip for ip, _ in plain},
        len({port for _, port in plain}),
        {ip for ip, _ in symmetric},
        len({port for _, port in symmetric}),
    ), (plain, symmetric)


def test_two_hosts_behind_one_router_share_its_address(make_nat_lab: MakeNatLab) -> None:
    """Two hosts behind one NAT reach the relay from the same public address (distinct ports)
    and each other over their LAN."""
    lab = make_nat_lab(["plain"], hosts_per_nat=2)
    relay = lab.public["relay"]
    h0, h1 = lab.homes
    serve(relay)
    # Same local port on both hosts: the router must give the second one another port.
    seen = [observed(h, relay, 40003)[0] for h in (h0, h1)]
    assert ({"203.0.113.100"}, 2, 3) == (
        {ip for ip, _ in seen},
        len(set(seen)),
        h0.ping(h1, count=3).received,
    ), seen


def test_unsolicited_connections_to_a_home_host_fail(make_nat_lab: MakeNatLab) -> None:
    """A listener behind NAT is reachable from its LAN only: the router drops SYNs from the
    internet (to its address or routed to the private one); another home has no route."""
    lab = make_nat_lab(["plain", "plain"])
    relay, (h0, h1) = lab.public["relay"], lab.homes
    listener = h0.popen(*h0.python(str(PUNCH_SCRIPT), "serve", h0.ip, "9000"))
    listener.wait_for_json(lambda event: event["event"] == "listening", within_s=10)
    drops_before = h0.router.unsolicited_drops()
    from_relay = connect(relay, h0.router.public_ip, 9000)
    from_other_home = connect(h1, h0.ip, 9000)
    # A neighbour on the internet segment that routes the private subnet via the router:
    # the router forwards only from its LAN outwards.
    relay.run("ip", "route", "add", f"{h0.router.lan}.0/24", "via", h0.router.public_ip)
    routed_from_relay = connect(relay, h0.ip, 9000)
    drops_after = h0.router.unsolicited_drops()
    from_own_router = connect(h0.router, h0.ip, 9000)
    assert ("timeout", "ENETUNREACH", "timeout", True, "connected") == (
        from_relay,
        from_other_home,
        routed_from_relay,
        drops_after > drops_before,
        from_own_router,
    ), h0.router.conntrack()


@pytest.mark.parametrize(
    ("modes", "overlapping_lans", "expected"),
    [
        (("plain", "plain"), False, "established"),
        (("plain", "plain"), True, "established"),
        (("fully-random", "fully-random"), False, "failed"),
        (("plain", "fully-random"), False, "failed"),
    ],
    ids=["plain", "plain-same-lan-subnet", "fully-random", "plain-vs-fully-random"],
)
def test_simultaneous_open_between_two_homes(
    make_nat_lab: MakeNatLab, modes: tuple[str, str], overlapping_lans: bool, expected: str
) -> None:
    """A TCP simultaneous open to each other's observed address connects two hosts behind
    plain NATs and fails when either NAT is fully-random."""
    lab = make_nat_lab(list(modes), overlapping_lans=overlapping_lans)
    a, b = lab.homes
    results = punch_pair(lab, a, b)
    if expected == "established":
        assert [
            ("established", [b.router.public_ip, 42002], "hello from h1"),
            ("established", [a.router.public_ip, 41001], "hello from h0"),
        ] == [(r["event"], r["remote"], r["got"]) for r in results], results
    else:
        # Both routers dropped the other's SYNs: the attempts happened and were refused
        # by the NAT, not lost on the way.
        drops = [r.unsolicited_drops() > 0 for r in lab.routers]
        assert (["failed", "failed"], [True, True]) == (
            [r["event"] for r in results],
            drops,
        ), (results, [r.conntrack() for r in lab.routers])


def test_simultaneous_open_survives_loss_on_the_internet(make_nat_lab: MakeNatLab) -> None:
    """With 10 % of frames lost on the internet, two homes behind plain NATs still connect
    (the kernel retransmits lost SYNs and SYN-ACKs within the window)."""
    lab = make_nat_lab(["plain", "plain"])
    relay, (a, b) = lab.public["relay"], lab.homes
    for router in lab.routers:  # ARP resolved first, so the window goes to the SYNs
        relay.ping(router, count=1)
    lab.routers[0].ping(lab.routers[1], count=1)
    lab.internet_loss(10)
    # Measured: 25 of 25 runs at 10 % and 10 of 10 at 20 % connected within 5 s.
    results = punch_pair(lab, a, b, within_s=5.0)
    assert ["established", "established"] == [r["event"] for r in results], (
        results,
        lab.lost_frames(),
    )


def test_internet_loss_is_applied_and_cleared(make_nat_lab: MakeNatLab) -> None:
    """20 % loss on the internet bridge loses a plausible share of pings; cleared, none."""
    lab = make_nat_lab(["plain"])
    relay, router = lab.public["relay"], lab.routers[0]
    warm = relay.ping(router, count=3)  # ARP first: it crosses the lossy bridge too
    lab.internet_loss(20)
    lossy = relay.ping(router, count=300, interval_s=0.002)
    lost = lab.lost_frames()
    lab.internet_loss(0)
    clean = relay.ping(router, count=20)
    # A round trip crosses twice: lost with 1 - 0.8² = 36 %; Binomial(300, 0.36) lies
    # within 20..52 % with probability 1 - 1e-8.
    assert (3, True, True, 0.0) == (
        warm.received,
        20.0 <= lossy.loss_pct <= 52.0,
        lost > 0,
        clean.loss_pct,
    ), (lossy, lost)


def test_block_cuts_a_route_and_unblock_restores_it(make_nat_lab: MakeNatLab) -> None:
    """Blocking relay and one router cuts the hosts behind it off the relay, no one else."""
    lab = make_nat_lab(["plain", "plain"])
    relay, (h0, h1) = lab.public["relay"], lab.homes
    lab.block(relay, h0.router)
    during = (h0.ping(relay, 3, wait_s=0.3).received, h1.ping(relay, 3).received)
    lab.unblock_all()
    after = (h0.ping(relay, 3).received, h1.ping(relay, 3).received, len(lab.blocked))
    assert ((0, 3), (3, 3, 0)) == (during, after)


def test_nat_lab_cleans_up_when_the_test_fails(nat_lab_support: None) -> None:
    """A failing `with NatLab()` body still kills its processes and deletes its namespaces."""
    lab = NatLab(["plain", "fully-random"], hosts_per_nat=2)
    started: list[HostProcess] = []

    def failing_test() -> None:
        with lab:
            home = lab.homes[0]
            started.append(home.popen("sleep", "600"))
            lab.internet_loss(5)
            lab.block(lab.public["relay"], home.router)
            raise RuntimeError("the test failed")

    with pytest.raises(RuntimeError, match="the test failed"):
        failing_test()
    (proc,) = started
    assert ([], -15, False) == (lab_namespaces(lab.id), proc.returncode, lab.workdir.exists())


# A test that fails while its NAT lab runs a process; run by a pytest of its own.
FAILING_TEST = """
from tests.chaos.conftest import lab_support, make_nat_lab, nat_lab_support

def test_fails(make_nat_lab):
    lab = make_nat_lab(["plain", "fully-random"])
    sleeper = lab.homes[0].popen("sleep", "600")
    lab.internet_loss(5)
    print("LAB", lab.id, sleeper.pid, flush=True)
    assert "expected" == "actual"
"""


def test_a_failing_test_leaves_no_namespace_behind(nat_lab_support: None, tmp_path: Path) -> None:
    """A pytest run whose test fails mid-way still deletes its NAT lab and kills its processes."""
    test_file = tmp_path / "test_failing.py"
    test_file.write_text(FAILING_TEST)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", str(test_file)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        # a bound, not the expected time: the run (a pytest start-up with the suite's
        # plugins, a NAT lab up and down) took 36 s at load 20
        timeout=180,
        check=False,
    )
    lab_lines = [line.split() for line in done.stdout.splitlines() if line.startswith("LAB ")]
    assert 1 == len(lab_lines), done.stdout[-2000:] + done.stderr[-2000:]
    lab_id, sleeper = lab_lines[0][1], int(lab_lines[0][2])
    assert (1, [], False) == (
        done.returncode,
        lab_namespaces(lab_id),
        Path(f"/proc/{sleeper}").exists(),
    ), done.stdout[-2000:]


# Builds a NAT lab, says its id, then waits to be killed (SIGKILL: no cleanup runs).
ORPHAN = """
import sys, threading
from tests.chaos.nat_lab import NatLab
lab = NatLab(["plain"])
lab.start()
print(lab.id, flush=True)
threading.Event().wait(60)
"""


def test_sweeper_removes_a_nat_lab_of_a_killed_run(nat_lab_support: None) -> None:
    """A NAT lab whose run was SIGKILLed is deleted by the next sweep, namespaces and all."""
    orphan = subprocess.Popen(
        [sys.executable, "-c", ORPHAN],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert orphan.stdout is not None
        # Bounded: a child that never prints must not hang the run.
        ready = select.select([orphan.stdout], [], [], 20)[0]
        lab_id = orphan.stdout.readline().strip() if ready else "(no lab id printed)"
        made = lab_namespaces(lab_id)
    finally:
        os.killpg(orphan.pid, signal.SIGKILL)
        orphan.wait(10)
        if orphan.stdout is not None:
            orphan.stdout.close()
    swept = sweep_stale()
    assert (f"hnl-{orphan.pid}-", 4, sorted(made), []) == (
        lab_id[: len(f"hnl-{orphan.pid}-")],
        len(made),
        sorted(n for n in swept if n.startswith(lab_id)),
        lab_namespaces(lab_id),
    )


def test_public_hosts_are_named_in_every_machine_until_the_lab_closes(
    make_nat_lab: MakeNatLab,
) -> None:
    """``names``: a home resolves a public host's DNS name (its own /etc/hosts in the
    namespace); closing the lab removes the file."""
    lab = make_nat_lab(["plain"], names={"relay.example.org": "relay"})
    (home,) = lab.homes
    resolved = home.run("getent", "hosts", "relay.example.org").stdout.split()
    etc = NETNS_ETC / home.netns
    lab.close()
    assert (["203.0.113.10", "relay.example.org"], False) == (resolved, etc.exists())
