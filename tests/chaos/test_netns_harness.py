"""The namespace lab itself: reachability, multicast, loss, partitions, crashes, cleanup."""

from __future__ import annotations

import http.client
import itertools
import json
import os
import subprocess
import tempfile
from pathlib import Path

import aiohttp
import pytest

from tests.chaos.conftest import MakeLab
from tests.chaos.netns import (
    HostProcess,
    ImpairmentUnsupported,
    Lab,
    lab_namespaces,
    netem_supported,
    sh,
    sweep_stale,
    unavailable_reason,
    wait_until_sync,
)

pytestmark = pytest.mark.chaos

# Joins 224.0.0.251:5353 (the mDNS group and port) on eth0, says "ready", then prints
# the JSON list of sources heard from until it has heard `expected` others or times out.
LISTEN = r"""
import json, socket, struct, sys, time
own, expected, within = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("224.0.0.251", 5353))
group = struct.pack("4s4s", socket.inet_aton("224.0.0.251"), socket.inet_aton(own))
sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, group)
print("ready", flush=True)
heard, deadline = set(), time.monotonic() + within
while len(heard) < expected and time.monotonic() < deadline:
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        data, (source, _) = sock.recvfrom(512)
    except socket.timeout:
        break
    if source != own and data == b"hearthnet-lab":
        heard.add(source)
print(json.dumps(sorted(heard)), flush=True)
"""

# Sends one datagram to 224.0.0.251:5353 out of eth0 with TTL 255, as mDNS does.
SEND = r"""
import socket, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_UDP)
sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(sys.argv[1]))
sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, 255)
sock.sendto(b"hearthnet-lab", ("224.0.0.251", 5353))
"""


def test_labs_are_refused_without_root(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without root the harness gives a reason to skip instead of failing."""
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "network namespaces need root" == unavailable_reason()


def test_every_host_pings_every_other(make_lab: MakeLab) -> None:
    """Each host of a three-host lab gets all its echo requests to every other host answered."""
    lab = make_lab(3)
    answered = {
        (a.name, b.name): a.ping(b, count=3).received
        for a, b in itertools.permutations(lab.hosts, 2)
    }
    assert dict.fromkeys(answered, 3) == answered


def test_multicast_reaches_every_host(make_lab: MakeLab) -> None:
    """A datagram to the mDNS group from any host reaches every other host across the bridge."""
    lab = make_lab(4)
    others = len(lab.hosts) - 1
    # each listener ends once it heard the others: the long window only bounds a failure
    # (four senders started one after the other can take seconds on a loaded machine)
    listeners = [h.popen(*h.python("-c", LISTEN, h.ip, str(others), "30")) for h in lab.hosts]
    for listener in listeners:
        listener.wait_for_line(lambda line: line == "ready", within_s=10)
    for host in lab.hosts:
        host.run(*host.python("-c", SEND, host.ip))
    heard = {
        host.name: json.loads(listener.wait_for_line(lambda line: line.startswith("["), 40))
        for host, listener in zip(lab.hosts, listeners, strict=True)
    }
    expected = {h.name: sorted(o.ip for o in lab.hosts if o is not h) for h in lab.hosts}
    assert expected == heard


def test_loss_is_applied_and_cleared(make_lab: MakeLab) -> None:
    """30 % egress loss loses a plausible share of 300 pings; clearing it loses none."""
    lab = make_lab(2)
    a, b = lab.hosts
    warm = a.ping(b, 3)  # ARP resolved first: a lost ARP request would stall every ping
    a.netem(loss_pct=30)
    shown = a.qdisc_show()
    lossy = a.ping(b, count=300, interval_s=0.002)
    a.clear_netem()
    clean = a.ping(b, count=20)
    # Binomial(300, 0.3) lies within 12..55 % with probability 1 - 1e-11.
    assert (3, True, True, 0.0) == (
        warm.received,
        "netem" in shown or "bpf" in shown,
        12.0 <= lossy.loss_pct <= 55.0,
        clean.loss_pct,
    ), (shown, lossy)


def test_delay_needs_netem(make_lab: MakeLab) -> None:
    """Delay is applied with netem where the kernel has it, and refused clearly where not."""
    a = make_lab(1).hosts[0]
    if not netem_supported():
        with pytest.raises(ImpairmentUnsupported):
            a.netem(delay_ms=50)
        return
    a.netem(delay_ms=50)
    assert "delay 50" in a.qdisc_show()


def test_partition_and_heal(make_lab: MakeLab) -> None:
    """A partition cuts both directions between two hosts only; heal restores them."""
    lab = make_lab(3)
    a, b, c = lab.hosts
    lab.partition([a], [b])
    during = (
        a.ping(b, 5, wait_s=0.3).received,
        b.ping(a, 5, wait_s=0.3).received,
        a.ping(c, 5).received,
    )
    lab.heal_all()
    after = (a.ping(b, 5).received, b.ping(a, 5).received, len(lab.cuts))
    assert ((0, 0, 5), (5, 5, 0)) == (during, after)


def test_partition_blocks_multicast(make_lab: MakeLab) -> None:
    """Multicast from a partitioned host does not reach the other side."""
    lab = make_lab(3)
    a, b, c = lab.hosts
    lab.partition([a], [b])
    # b listens until it hears one host: c's datagram, sent once a's has gone out, comes
    # after a's would have, so hearing c alone is hearing nothing from a (a fixed window
    # was missed by c's sender starting late on a loaded machine)
    listener = b.popen(*b.python("-c", LISTEN, b.ip, "1", "15"))
    listener.wait_for_line(lambda line: line == "ready", within_s=10)
    a.run(*a.python("-c", SEND, a.ip))
    c.run(*c.python("-c", SEND, c.ip))
    heard = json.loads(listener.wait_for_line(lambda line: line.startswith("["), 20))
    assert [c.ip] == heard


def test_disconnect_and_reconnect(make_lab: MakeLab) -> None:
    """A host whose cable is pulled answers nothing; plugged back in, it answers again."""
    lab = make_lab(2)
    a, b = lab.hosts
    a.disconnect()
    cut = a.ping(b, 3, wait_s=0.3).received
    a.reconnect()
    assert (0, 3) == (cut, a.ping(b, 3).received)


def test_test_process_talks_to_a_host_through_a_namespaced_socket(make_lab: MakeLab) -> None:
    """host.socket() gives the test a socket in a namespace: HTTP to a server on another host."""
    lab = make_lab(2)
    a, b = lab.hosts
    server = b.popen(*b.python("-m", "http.server", "--bind", b.ip, "8080"), cwd=lab.workdir)

    def get() -> int:
        sock = a.socket()
        sock.settimeout(2)
        try:
            sock.connect((b.ip, 8080))
        except OSError:
            sock.close()
            return 0
        conn = http.client.HTTPConnection(b.ip, 8080)
        conn.sock = sock
        try:
            conn.request("GET", "/")
            return conn.getresponse().status
        finally:
            conn.close()

    wait_until_sync(lambda: get() == 200, 10, "the HTTP server in h1")
    assert (200, None) == (get(), server.returncode)


def test_kill_crashes_a_process_group(make_lab: MakeLab) -> None:
    """host.kill sends SIGKILL to the whole group: the child a process spawned dies too."""
    lab = make_lab(1)
    (host,) = lab.hosts
    parent = host.popen("sh", "-c", "sleep 600 & echo child $!; wait")
    child_pid = int(parent.wait_for_line(lambda line: line.startswith("child "))[6:])
    code = host.kill(parent)
    wait_until_sync(lambda: not _alive(child_pid), 5, "the child to die")
    assert (-9, False) == (code, _alive(child_pid))


def test_close_removes_everything_even_when_the_test_fails(lab_support: None) -> None:
    """A failing `with Lab()` body still kills its processes and deletes its namespaces."""
    lab = Lab(2)
    started: list[HostProcess] = []

    def failing_test() -> None:
        with lab:
            started.append(lab.hosts[0].popen("sleep", "600"))
            lab.hosts[0].netem(loss_pct=5)
            lab.partition([lab.hosts[0]], [lab.hosts[1]])
            raise RuntimeError("the test failed")

    with pytest.raises(RuntimeError, match="the test failed"):
        failing_test()
    (proc,) = started
    links = sh("ip", "-o", "link", "show").stdout
    assert ([], False, -15, False) == (
        lab_namespaces(lab.id),
        lab.id in links,
        proc.returncode,
        lab.workdir.exists(),
    )


def test_sweeper_deletes_labs_of_dead_runs_only(make_lab: MakeLab) -> None:
    """sweep_stale deletes the namespaces and work directory of a dead owner, not a live one's."""
    live = make_lab(1)
    stale = f"hnl-{_dead_pid()}-dead00"
    sh("ip", "netns", "add", f"{stale}-h0")
    stale_workdir = Path(tempfile.mkdtemp(prefix=f"{stale}-"))
    swept = sweep_stale()
    assert ([f"{stale}-h0"], [], False, [live.hosts[0].netns], True) == (
        [n for n in swept if n.startswith(stale)],
        lab_namespaces(stale),
        stale_workdir.exists(),
        lab_namespaces(live.hosts[0].netns),
        live.workdir.exists(),
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); its state in /proc says it is dead.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


async def test_real_nodes_in_namespaces_answer_the_test_over_aiohttp(
    make_lab: MakeLab, tmp_path: Path
) -> None:
    """`hearthnet node start` runs in two namespaces; the test reaches each over aiohttp."""
    lab = make_lab(2)
    nodes = [
        h.popen(
            *h.python("-m", "hearthnet.cli", "node", "start", "--name", h.name),
            *("--data-dir", str(tmp_path / h.name), "--host", h.ip, "--port", "7080"),
        )
        for h in lab.hosts
    ]
    ready = [n.wait_for_line(lambda line: line.startswith("hearthnet ready"), 30) for n in nodes]
    health = []
    for host in lab.hosts:
        # Dial from the *other* host's namespace: the request crosses the bridge.
        via = lab.hosts[1 - host.index]
        connector = aiohttp.TCPConnector(socket_factory=via.socket_factory)
        async with (
            aiohttp.ClientSession(connector=connector) as http,
            http.get(f"http://{host.ip}:7080/health") as resp,
        ):
            health.append(resp.status)
    urls = [f"url=http://{h.ip}:7080 " in line for h, line in zip(lab.hosts, ready, strict=True)]
    assert ([200, 200], [True, True]) == (health, urls)
