"""A lab with real NAT: public hosts on an "internet", home hosts behind NAT routers.

Layout of a NAT lab with id ``L`` (``hnl-<pytest pid>-<random>``, like :class:`Lab`)::

    netns L-inet    bridge br0 = the internet (203.0.113.0/24, TEST-NET-3), no address;
                    nftables table ``bridge chaos``: loss and blocked address pairs
    netns L-relay   eth0 203.0.113.10/24     (public hosts, .10 upwards, named by the caller)
    netns L-nat0    wan0 203.0.113.100/24; lan0 (a bridge) 192.168.1.1/24
                    nftables: masquerade out of wan0 (plain or fully-random); input and
                    forward drop everything unsolicited from outside, as home routers do
    netns L-h0      eth0 192.168.1.10/24, default via 192.168.1.1
    netns L-h1      (a second host behind nat0, if asked for) 192.168.1.11/24
    netns L-nat1    wan0 203.0.113.101/24; lan0 192.168.2.1/24 (or 192.168.1.1/24 with
                    ``overlapping_lans``: every home uses the same private subnet)
    netns L-h2      eth0 192.168.2.10/24 ...

Modes (spec §8 names them): ``plain`` is ``masquerade``, an endpoint-independent mapping
in practice (nf_nat reuses an existing mapping of the same inside ip:port and keeps the
port when free), so hole punching works; ``fully-random`` is ``masquerade fully-random``,
a symmetric NAT: every connection gets its own random public port, so the port the relay
observed is useless to the peer.

Usage::

    with NatLab(["plain", "fully-random"]) as lab:   # or the make_nat_lab fixture
        relay = lab.public["relay"]
        h0, h1 = lab.homes                         # HomeHost: .ip private, .router
        proc = h0.popen(*h0.python(...))           # same process API as Host
        lab.internet_loss(10)                      # 10 % of frames on the bridge dropped
        lab.block(relay, h0.router)                # the route between them is cut
        lab.unblock_all()

Cleanup is :class:`NamespaceLab`'s: processes in their own process groups, killed by
group; every namespace recorded when made and deleted on close, exit, the fixture's
finaliser and at exit; :func:`sweep_stale` removes labs of dead runs.
"""

from __future__ import annotations

import enum
import json
import os
import re
import secrets
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.chaos.netns import (
    NETNS_ETC,
    PREFIX,
    LabError,
    Machine,
    NamespaceLab,
    sh,
    unavailable_reason,
)

PUNCH_SCRIPT = Path(__file__).with_name("punch.py")
INTERNET = "203.0.113"  # TEST-NET-3 (RFC 5737, a /24): never routed on the real internet
PREFIXLEN = 24
FIRST_PUBLIC = 10  # public hosts: 203.0.113.10 upwards
FIRST_ROUTER = 100  # routers' wan0: 203.0.113.100 upwards
FIRST_HOME = 10  # home hosts: 192.168.x.10 upwards
MAX_PUBLIC = FIRST_ROUTER - FIRST_PUBLIC
MAX_ROUTERS = 100
MAX_HOMES_PER_NAT = 100
BRIDGE = "br0"
BRIDGE_NF_FAMILIES = ("iptables", "ip6tables", "arptables")
_NAME = re.compile(r"[a-z][a-z0-9]{0,9}")
_RESERVED = re.compile(r"inet|nat\d+|h\d+")
_HOSTNAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+")


class NatMode(enum.StrEnum):
    """How a router maps inside ip:port to public ports."""

    PLAIN = "plain"  # masquerade: endpoint-independent mapping, port kept when free
    FULLY_RANDOM = "fully-random"  # masquerade fully-random: a new port per connection


class PublicHost(Machine):
    """A host with a public address on the internet bridge (a relay, a rendezvous server)."""


class NatRouter(Machine):
    """A home router: ``wan0`` on the internet (its public address is ``ip``), ``lan0``
    a bridge to its home hosts."""

    def __init__(self, lab: NatLab, index: int, mode: NatMode, lan: str) -> None:
        super().__init__(lab, f"nat{index}", f"{INTERNET}.{FIRST_ROUTER + index}")
        self.index = index
        self.mode = mode
        self.lan = lan  # e.g. "192.168.1", the first three octets of its /24
        self.lan_ip = f"{lan}.1"
        self.hosts: list[HomeHost] = []

    @property
    def public_ip(self) -> str:
        """The address the internet sees for everything behind this router."""
        return self.ip

    def unsolicited_drops(self) -> int:
        """Packets from outside dropped so far because no connection from inside asked
        for them (the router's own input and forwarding towards the LAN)."""
        listed = self.run("nft", "-j", "list", "counter", "inet", "filter", "unsolicited")
        return _counter_packets(listed.stdout)

    def conntrack(self) -> str:
        """The router's connection tracking table, for failure messages."""
        return self.run("cat", "/proc/net/nf_conntrack", check=False).stdout


class HomeHost(Machine):
    """A host behind a :class:`NatRouter`, with a private address and a default route
    through it."""

    def __init__(self, lab: NatLab, index: int, router: NatRouter, ip: str) -> None:
        super().__init__(lab, f"h{index}", ip)
        self.index = index
        self.router = router
        self.port = f"l{len(router.hosts)}"  # its port on the router's lan0 bridge


def _write_sysctls(netns: str, values: dict[str, str], *, only_existing: bool = False) -> None:
    """Set per-namespace sysctls (paths under /proc/sys) from inside ``netns``, without
    needing procps; with ``only_existing``, settings the kernel lacks are skipped."""
    lines = []
    for key, value in values.items():
        path = f"/proc/sys/{key}"
        write = f"echo {value} > {path}"
        lines.append(f"if [ -e {path} ]; then {write}; fi" if only_existing else write)
    sh("ip", "netns", "exec", netns, "sh", "-ec", "\n".join(lines))


def _counter_packets(nft_json: str) -> int:
    for item in json.loads(nft_json)["nftables"]:
        if "counter" in item:
            return int(item["counter"]["packets"])
    raise LabError(f"no counter in {nft_json!r}")


def _router_ruleset(mode: NatMode) -> str:
    flags = " fully-random" if mode is NatMode.FULLY_RANDOM else ""
    # Drop, never reject: a home router stays silent. If it answered RST, the first SYN
    # of a simultaneous open would be refused at once, and the punch would only work
    # when both SYNs cross within one round trip.
    return f"""
table ip nat {{
  chain postrouting {{ type nat hook postrouting priority srcnat; policy accept;
    oifname "wan0" masquerade{flags}
  }}
}}
table inet filter {{
  counter unsolicited {{ }}
  chain input {{ type filter hook input priority filter; policy drop;
    ct state established,related accept
    iifname {{ "lo", "lan0" }} accept
    icmp type echo-request accept
    counter name "unsolicited" drop
  }}
  chain forward {{ type filter hook forward priority filter; policy drop;
    ct state established,related accept
    iifname "lan0" oifname "wan0" accept
    counter name "unsolicited" drop
  }}
}}
"""


# The internet's own rules: dropped address pairs (both directions are separate elements)
# and loss (a rule in chain "loss", replaced as a whole when the loss changes).
_INTERNET_RULESET = """
table bridge chaos {
  set blocked { type ipv4_addr . ipv4_addr; }
  counter lost { }
  counter blocked { }
  chain loss { }
  chain forward { type filter hook forward priority filter; policy accept;
    ip saddr . ip daddr @blocked counter name "blocked" drop
    jump loss
  }
}
"""


def nat_unavailable_reason() -> str | None:
    """Why NAT labs cannot run here (as :func:`unavailable_reason`, plus no ``nft``, or a
    kernel without nftables NAT), or None."""
    reason = unavailable_reason()
    if reason is not None:
        return reason
    if shutil.which("nft") is None:
        return "nft (nftables) is not installed"
    probe = f"{PREFIX}{os.getpid()}-natprobe{secrets.token_hex(2)}"
    made = sh("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    try:
        loaded = sh(
            "ip", "netns", "exec", probe, "nft", "-f", "-",
            input=_router_ruleset(NatMode.FULLY_RANDOM) + _INTERNET_RULESET, check=False,
        )  # fmt: skip
    finally:
        sh("ip", "netns", "del", probe, check=False)
    if loaded.returncode != 0:
        return f"nftables NAT unavailable: {loaded.stderr.strip()}"
    return None


class NatLab(NamespaceLab):
    """Public hosts and NAT'd home hosts on one simulated internet; a context manager.

    Args:
        nats: one mode per router (``"plain"`` or ``"fully-random"``).
        public: names of the public hosts (short lowercase names, not ``inet``,
            ``natN`` or ``hN``), addressed 203.0.113.10 upwards.
        hosts_per_nat: home hosts behind each router: one number for all, or one each.
        overlapping_lans: every home LAN is 192.168.1.0/24, as with real home routers
            (otherwise router i has 192.168.(i+1).0/24).
        names: DNS names of public hosts (``{"relay.example.org": "relay"}``), in every
            machine's ``/etc/hosts`` (``/etc/netns/<netns>/hosts``, which ``ip netns
            exec`` mounts over it; removed with the namespace).
    """

    def __init__(
        self,
        nats: Sequence[str | NatMode] = (NatMode.PLAIN, NatMode.PLAIN),
        *,
        public: Sequence[str] = ("relay",),
        hosts_per_nat: int | Sequence[int] = 1,
        overlapping_lans: bool = False,
        names: Mapping[str, str] | None = None,
    ) -> None:
        counts = (
            [hosts_per_nat] * len(nats) if isinstance(hosts_per_nat, int) else list(hosts_per_nat)
        )
        if len(counts) != len(nats):
            raise ValueError("hosts_per_nat needs one count per router")
        if not 0 <= len(nats) <= MAX_ROUTERS or not all(
            0 <= n <= MAX_HOMES_PER_NAT for n in counts
        ):
            raise ValueError(f"up to {MAX_ROUTERS} routers, {MAX_HOMES_PER_NAT} hosts each")
        if len(public) > MAX_PUBLIC or len(set(public)) != len(public):
            raise ValueError(f"up to {MAX_PUBLIC} public hosts, each name once")
        for name in public:
            if not _NAME.fullmatch(name) or _RESERVED.fullmatch(name):
                raise ValueError(f"bad public host name {name!r}")
        super().__init__()
        self.internet_netns = f"{self.id}-inet"
        self.public = {
            name: PublicHost(self, name, f"{INTERNET}.{FIRST_PUBLIC + i}")
            for i, name in enumerate(public)
        }
        self.routers: list[NatRouter] = []
        self.homes: list[HomeHost] = []
        for i, (mode, count) in enumerate(zip(nats, counts, strict=True)):
            lan = "192.168.1" if overlapping_lans else f"192.168.{i + 1}"
            router = NatRouter(self, i, NatMode(mode), lan)
            for j in range(count):
                home = HomeHost(self, len(self.homes), router, f"{lan}.{FIRST_HOME + j}")
                router.hosts.append(home)
                self.homes.append(home)
            self.routers.append(router)
        self.blocked: set[tuple[str, str]] = set()
        self.names = dict(names or {})
        for name, host in self.names.items():
            if host not in self.public or not _HOSTNAME.fullmatch(name):
                raise ValueError(f"bad name {name!r} for public host {host!r}")

    def __repr__(self) -> str:
        modes = ",".join(r.mode for r in self.routers)
        return f"<NatLab {self.id} public={list(self.public)} nats={modes} homes={len(self.homes)}>"

    @property
    def machines(self) -> list[Machine]:
        """Every public host, router and home host."""
        return [*self.public.values(), *self.routers, *self.homes]

    # building

    def _build(self) -> None:
        inet = self.internet_netns
        self._add_netns(inet)
        self._bridge(inet, BRIDGE)
        sh("ip", "netns", "exec", inet, "nft", "-f", "-", input=_INTERNET_RULESET)
        for i, host in enumerate(self.public.values()):
            self._add_netns(host.netns)
            self._plug(host.netns, "eth0", inet, f"p{i}", BRIDGE, host.ip)
        for router in self.routers:
            self._add_router(router)
        if self.names:
            hosts = "127.0.0.1 localhost\n" + "".join(
                f"{self.public[host].ip} {name}\n" for name, host in self.names.items()
            )
            for machine in self.machines:
                (NETNS_ETC / machine.netns).mkdir(parents=True, exist_ok=True)
                (NETNS_ETC / machine.netns / "hosts").write_text(hosts, encoding="utf-8")

    def _bridge(self, netns: str, name: str) -> None:
        sh("ip", "-n", netns, "link", "add", name, "type", "bridge")
        sh("ip", "-n", netns, "link", "set", name, "up")
        # A switch, not a firewall: bridged frames skip the IP hooks (br_netfilter is
        # built into the kernel and on by default in every new namespace).
        _write_sysctls(
            netns,
            {f"net/bridge/bridge-nf-call-{family}": "0" for family in BRIDGE_NF_FAMILIES},
            only_existing=True,
        )

    def _plug(
        self, netns: str, dev: str, bridge_netns: str, port: str, bridge: str, ip: str
    ) -> None:
        """A veth from ``dev`` in ``netns`` (address ``ip``) to a port of ``bridge``.

        Both ends are born inside lab namespaces: the root namespace never sees them.
        """
        sh(
            "ip", "-n", netns, "link", "add", dev, "type", "veth",
            "peer", "name", port, "netns", bridge_netns,
        )  # fmt: skip
        sh("ip", "-n", bridge_netns, "link", "set", port, "master", bridge, "up")
        sh("ip", "-n", netns, "addr", "add", f"{ip}/{PREFIXLEN}", "dev", dev)
        sh("ip", "-n", netns, "link", "set", dev, "up")

    def _add_router(self, router: NatRouter) -> None:
        self._add_netns(router.netns)
        self._plug(router.netns, "wan0", self.internet_netns, f"n{router.index}", BRIDGE, router.ip)
        self._bridge(router.netns, "lan0")
        sh("ip", "-n", router.netns, "addr", "add", f"{router.lan_ip}/{PREFIXLEN}", "dev", "lan0")
        _write_sysctls(router.netns, {"net/ipv4/ip_forward": "1"})
        router.run("nft", "-f", "-", input=_router_ruleset(router.mode))
        for home in router.hosts:
            self._add_netns(home.netns)
            self._plug(home.netns, "eth0", router.netns, home.port, "lan0", home.ip)
            sh("ip", "-n", home.netns, "route", "add", "default", "via", router.lan_ip)

    # impairments of the internet

    def _nft(self, *args: str) -> str:
        return sh("ip", "netns", "exec", self.internet_netns, "nft", *args).stdout

    def internet_loss(self, pct: float) -> None:
        """Drop ``pct`` % of the frames crossing the internet bridge (0 clears it).

        Each crossing is one draw (nftables ``numgen random``), ARP included: a request
        and its reply cross twice, so a round trip is lost with 1 - (1 - p)².
        """
        if not 0.0 <= pct <= 100.0:
            raise ValueError("pct must be within 0..100")
        self._nft("flush", "chain", "bridge", "chaos", "loss")
        if pct:
            below = round(pct * 100)  # in 1/10000: two decimals of a percent
            self._nft(
                "add", "rule", "bridge", "chaos", "loss",
                "numgen", "random", "mod", "10000", "<", str(below),
                "counter", "name", "lost", "drop",
            )  # fmt: skip

    def lost_frames(self) -> int:
        """Frames dropped by :meth:`internet_loss` so far."""
        return _counter_packets(self._nft("-j", "list", "counter", "bridge", "chaos", "lost"))

    def block(self, a: PublicHost | NatRouter | str, b: PublicHost | NatRouter | str) -> None:
        """Cut the route between two public addresses, both directions (IPv4 dropped on
        the internet; ARP still passes). Blocking a router cuts every host behind it."""
        pair = (_public_ip(a), _public_ip(b))
        for src, dst in (pair, pair[::-1]):
            if (src, dst) not in self.blocked:
                self._nft("add", "element", "bridge", "chaos", "blocked", f"{{ {src} . {dst} }}")
                self.blocked.add((src, dst))

    def unblock(self, a: PublicHost | NatRouter | str, b: PublicHost | NatRouter | str) -> None:
        """Undo :meth:`block` between ``a`` and ``b``."""
        pair = (_public_ip(a), _public_ip(b))
        for src, dst in (pair, pair[::-1]):
            if (src, dst) in self.blocked:
                self._nft("delete", "element", "bridge", "chaos", "blocked", f"{{ {src} . {dst} }}")
                self.blocked.discard((src, dst))

    def partition(
        self,
        side_a: Sequence[PublicHost | NatRouter | str],
        side_b: Sequence[PublicHost | NatRouter | str],
    ) -> None:
        """Block every address of ``side_a`` from every address of ``side_b``."""
        for a in side_a:
            for b in side_b:
                self.block(a, b)

    def unblock_all(self) -> None:
        """Undo every :meth:`block` and :meth:`partition`."""
        self._nft("flush", "set", "bridge", "chaos", "blocked")
        self.blocked.clear()


def _public_ip(target: PublicHost | NatRouter | str) -> str:
    if isinstance(target, HomeHost):
        raise TypeError("block the home host's router: a home host has no public address")
    return target.ip if isinstance(target, Machine) else target
