"""A lab of hosts in Linux network namespaces for chaos tests: a bridge, real multicast,
packet loss, partitions, crashes, and cleanup that survives failing tests.

Layout of a lab with id ``L`` (``hnl-<pytest pid>-<random>``) and N hosts::

    netns L-br    bridge br0, IGMP snooping off (multicast, mDNS included, floods to
                  every port), ports p0 .. pN-1
    netns L-h0    lo up; eth0 = 10.231.0.1/24, veth to p0; route 224.0.0.0/4 dev eth0
    netns L-h1    eth0 = 10.231.0.2/24 ...

Nothing is created in the caller's (root) namespace: the veth pairs are made with
both ends already inside lab namespaces, so a lab cannot collide with the machine's
interfaces, routes or firewall, nor with another lab (each has its own bridge, so two
labs using the same subnet never meet). Deleting the namespaces deletes everything.

Usage::

    with Lab(3) as lab:                      # or the ``make_lab`` fixture in conftest.py
        a, b, c = lab.hosts
        proc = a.popen(*a.python("-m", "hearthnet.cli", "node", "start", ...))
        proc.wait_for_line(lambda line: line.startswith("hearthnet ready"), within_s=20)
        a.netem(loss_pct=10)                 # a's outgoing packets: 10 % lost
        lab.partition([a], [b, c])           # a and {b, c} cannot reach each other
        lab.heal_all()
        a.kill(proc)                         # SIGKILL the process group: a crash

Impairments: ``tc netem`` when the kernel has it (loss, delay, jitter). Kernels built
without ``sch_netem`` (this project's CI machines among them) still get loss: a classic
BPF filter drawing a random number per packet, on a ``clsact`` hook, redirects the
unlucky packets to a veth that is down, which drops them. Partitions use the same
drop, matched by source address with ``u32``; they need nothing beyond iproute2.

Cleanup: processes are started in their own process group and killed by group; every
namespace is recorded as soon as it exists and deleted in :meth:`Lab.close` (also
called from ``__exit__``, the fixture finaliser and an ``atexit`` hook), after killing
whatever still runs inside it. :func:`sweep_stale` deletes namespaces of labs whose
owning process is dead (a crashed or SIGKILLed test run).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

PREFIX = "hnl-"
# per-namespace files `ip netns exec` mounts over /etc (a lab's /etc/hosts names)
NETNS_ETC = Path("/etc/netns")
DEFAULT_SUBNET = "10.231.0.0/24"
MAX_HOSTS = 64
HOST_DEV = "eth0"
BRIDGE = "br0"
SINK = "sink0"  # one end of a veth pair that stays down: packets redirected to it are dropped
SINK_PEER = "sink1"
REPO_ROOT = Path(__file__).resolve().parents[2]
COMMAND_TIMEOUT_S = 30.0
MAX_OUTPUT_LINES = 10_000  # per process; older lines are dropped
# diagnosing a failure (docs/chaos-testing.md): a directory where each lab's work directory
# (every process's stderr: the nodes' logs) is copied at close, and the log level of the
# nodes the lab starts. Not HEARTHNET_*: tests/conftest.py clears those for the run
KEEP_ENV = "HNL_KEEP"
LOG_LEVEL_ENV = "HNL_LOG_LEVEL"

# Filter priorities (tc "pref") on one device: loss first, then one per partitioned peer.
_LOSS_PREF = 10
_PARTITION_PREF_BASE = 1000

_CLONE_NEWNET = 0x40000000
Socket = socket.socket  # Host.socket() shadows the module name inside the class


class LabError(RuntimeError):
    """The lab could not do what was asked (a command failed, a wait timed out)."""


class ImpairmentUnsupported(LabError):
    """The kernel cannot apply this impairment (delay and jitter need ``sch_netem``)."""


# --- small helpers ---------------------------------------------------------------------


def sh(
    *cmd: str, check: bool = True, timeout: float = COMMAND_TIMEOUT_S, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command, capture its output; :class:`LabError` with stderr when it fails."""
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, input=input, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise LabError(f"{' '.join(cmd)}: no exit within {timeout} s") from exc
    if check and done.returncode != 0:
        raise LabError(f"{' '.join(cmd)}: exit {done.returncode}: {done.stderr.strip()}")
    return done


def wait_until_sync(
    condition: Callable[[], bool],
    within_s: float = 10.0,
    what: str = "condition",
    interval_s: float = 0.02,
) -> None:
    """Poll ``condition()`` until true; :class:`AssertionError` after ``within_s``.

    The synchronous twin of ``tests.helpers.wait_until``, for code that waits on other
    processes rather than on an event loop.
    """
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within_s} s waiting for {what}")
        time.sleep(interval_s)


def unavailable_reason() -> str | None:
    """Why labs cannot run here (not root, no iproute2, namespaces refused), or None."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"{tool} (iproute2) is not installed"
    probe = f"{PREFIX}{os.getpid()}-probe{secrets.token_hex(2)}"
    made = sh("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    sh("ip", "netns", "del", probe, check=False)
    return None


_netem_supported: bool | None = None


def netem_supported() -> bool:
    """Whether this kernel has ``sch_netem`` (probed once, in a scratch namespace)."""
    global _netem_supported  # noqa: PLW0603 (a per-process probe result)
    if _netem_supported is None:
        probe = f"{PREFIX}{os.getpid()}-netem{secrets.token_hex(2)}"
        sh("ip", "netns", "add", probe)
        try:
            added = sh(
                "ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                check=False,
            )  # fmt: skip
            _netem_supported = added.returncode == 0
        finally:
            sh("ip", "netns", "del", probe, check=False)
    return _netem_supported


def lab_namespaces(prefix: str = PREFIX) -> list[str]:
    """Names of existing network namespaces that start with ``prefix``."""
    listed = sh("ip", "netns", "list", check=False).stdout
    names = (line.split()[0] for line in listed.splitlines() if line.strip())
    return sorted(name for name in names if name.startswith(prefix))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_namespace(netns: str) -> None:
    """SIGKILL whatever still runs in ``netns``, then delete it."""
    pids = sh("ip", "netns", "pids", netns, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    sh("ip", "netns", "del", netns, check=False)
    shutil.rmtree(NETNS_ETC / netns, ignore_errors=True)


def _owner_alive(name: str, prefix: str) -> bool:
    owner = name[len(prefix) :].split("-", 1)[0]
    return owner.isdigit() and _pid_alive(int(owner))


def sweep_stale(prefix: str = PREFIX) -> list[str]:
    """Delete lab namespaces (and work directories) whose owning process is gone.

    A lab's namespaces are named ``hnl-<owner pid>-...``; labs of live processes (other
    test runs on the same machine) are left alone. Returns the namespaces deleted.
    """
    swept = []
    for netns in lab_namespaces(prefix):
        if not _owner_alive(netns, prefix):
            _kill_namespace(netns)
            swept.append(netns)
    for workdir in [*Path(tempfile.gettempdir()).glob(f"{prefix}*"), *NETNS_ETC.glob(f"{prefix}*")]:
        if workdir.is_dir() and not _owner_alive(workdir.name, prefix):
            shutil.rmtree(workdir, ignore_errors=True)
    return swept


class _NetnsSwitch:
    """setns(2) for the calling thread only, via libc (os.setns arrives in Python 3.12)."""

    _libc: Any = None

    @classmethod
    def setns(cls, fd: int) -> None:
        if cls._libc is None:
            cls._libc = ctypes.CDLL(None, use_errno=True)
        if cls._libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))


@contextlib.contextmanager
def _in_netns(netns: str) -> Iterator[None]:
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{netns}", os.O_RDONLY)
    try:
        _NetnsSwitch.setns(target)
        try:
            yield
        finally:
            _NetnsSwitch.setns(own)
    finally:
        os.close(target)
        os.close(own)


# --- processes -------------------------------------------------------------------------


def _log_level() -> dict[str, str]:
    """``HEARTHNET_NODE_LOG_LEVEL`` for a process, when :data:`LOG_LEVEL_ENV` asks for one."""
    level = os.environ.get(LOG_LEVEL_ENV)
    return {"HEARTHNET_NODE_LOG_LEVEL": level} if level else {}


class HostProcess:
    """A process started in a host's namespace, in its own process group.

    Its stdout lines are collected by a reader thread (the last
    :data:`MAX_OUTPUT_LINES`); its stderr goes to a file in the lab's work directory.
    """

    def __init__(
        self, host: Machine, argv: Sequence[str], popen: subprocess.Popen[str], stderr: Path
    ):
        self.host = host
        self.argv = list(argv)
        self.popen = popen
        self.stderr_path = stderr
        self._lines: deque[str] = deque(maxlen=MAX_OUTPUT_LINES)
        self._changed = threading.Condition()
        self._eof = False
        self._reader = threading.Thread(target=self._read, name=f"out-{popen.pid}", daemon=True)
        self._reader.start()

    def __repr__(self) -> str:
        return f"<HostProcess {self.host.name} pid={self.pid} {' '.join(self.argv[-6:])}>"

    @property
    def pid(self) -> int:
        """The process id (also its process group id)."""
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        """The exit status, or None while it runs."""
        return self.popen.poll()

    @property
    def lines(self) -> list[str]:
        """The stdout lines so far (without newlines)."""
        with self._changed:
            return list(self._lines)

    def json_lines(self) -> list[dict[str, Any]]:
        """The stdout lines that are JSON objects, parsed."""
        out = []
        for line in self.lines:
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def stderr_text(self, tail: int = 4000) -> str:
        """The last ``tail`` characters of stderr, for failure messages."""
        try:
            return self.stderr_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def wait_for_line(self, predicate: Callable[[str], bool], within_s: float = 10.0) -> str:
        """The first stdout line matching ``predicate``, waiting up to ``within_s``.

        Raises:
            AssertionError: no such line in time, or the process ended without one.
        """
        deadline = time.monotonic() + within_s
        with self._changed:
            while True:
                for line in self._lines:
                    if predicate(line):
                        return line
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    why = "exited" if self._eof else f"no such line within {within_s} s"
                    raise AssertionError(
                        f"{self!r}: {why}; stdout tail {list(self._lines)[-5:]}, "
                        f"stderr tail {self.stderr_text(800)!r}"
                    )
                self._changed.wait(left)

    def wait_for_json(
        self, predicate: Callable[[dict[str, Any]], bool], within_s: float = 10.0
    ) -> dict[str, Any]:
        """The first JSON-object stdout line matching ``predicate``."""

        def matches(line: str) -> bool:
            if not line.startswith("{"):
                return False
            try:
                return bool(predicate(json.loads(line)))
            except ValueError:
                return False

        return dict(json.loads(self.wait_for_line(matches, within_s)))

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process group (no-op once it has exited)."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    def wait(self, within_s: float = 10.0) -> int:
        """Wait for the exit status; :class:`AssertionError` if still running after ``within_s``."""
        try:
            code = self.popen.wait(within_s)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"{self!r} still running after {within_s} s") from exc
        self._reader.join(within_s)
        return code

    def stop(self, within_s: float = 5.0) -> int:
        """SIGTERM the group, wait up to ``within_s``, then SIGKILL; returns the exit status."""
        self.signal(signal.SIGTERM)
        try:
            self.popen.wait(within_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.popen.wait(5.0)
        self._reader.join(5.0)
        return self.popen.returncode

    def kill(self) -> int:
        """SIGKILL the group (a crash) and reap it; returns the exit status."""
        self.signal(signal.SIGKILL)
        self.popen.wait(5.0)
        self._reader.join(5.0)
        return self.popen.returncode

    def _read(self) -> None:
        stream = self.popen.stdout
        assert stream is not None
        try:
            for line in stream:
                with self._changed:
                    self._lines.append(line.rstrip("\n"))
                    self._changed.notify_all()
        finally:
            stream.close()
            with self._changed:
                self._eof = True
                self._changed.notify_all()


# --- hosts -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PingResult:
    """ICMP echo requests sent and distinct replies received."""

    sent: int
    received: int

    @property
    def loss_pct(self) -> float:
        """Percentage of requests without a reply."""
        return 100.0 * (self.sent - self.received) / self.sent if self.sent else 0.0


# Runs inside a namespace as `python -c`: ICMP echo over a raw socket (we are root), so the
# harness does not depend on iputils-ping being installed.
_PING_SCRIPT = r"""
import os, select, socket, struct, sys, time
target, count = sys.argv[1], int(sys.argv[2])
interval, wait = float(sys.argv[3]), float(sys.argv[4])
def checksum(data):
    total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    total = (total >> 16) + (total & 0xFFFF)
    return ~(total + (total >> 16)) & 0xFFFF
sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
ident = os.getpid() & 0xFFFF
replied = set()
def receive(until, stop_when_all=False):
    while not (stop_when_all and len(replied) == count):
        left = until - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            return
        packet, (source, _) = sock.recvfrom(2048)
        header = (packet[0] & 0x0F) * 4
        kind, _, _, pid, seq = struct.unpack("!BBHHH", packet[header:header + 8])
        if kind == 0 and pid == ident and source == target:
            replied.add(seq)
for seq in range(count):
    body = struct.pack("!BBHHH", 8, 0, 0, ident, seq) + b"hearthnet-lab-ping!!"
    body = body[:2] + struct.pack("!H", checksum(body)) + body[4:]
    sock.sendto(body, (target, 0))
    receive(time.monotonic() + interval)
receive(time.monotonic() + wait, stop_when_all=True)
print(count, len(replied))
"""


class Machine:
    """A namespace of a lab that runs things: processes, pings, sockets for the test.

    :class:`Host` (a machine on the plain lab's bridge) and the NAT lab's machines
    (``nat_lab.py``) share it, so they start, watch and kill processes the same way.
    """

    def __init__(self, lab: NamespaceLab, name: str, ip: str):
        self.lab = lab
        self.name = name
        self.netns = f"{lab.id}-{name}"
        self.ip = ip

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self.ip} netns={self.netns}>"

    # running things

    def exec_argv(self, *cmd: str) -> list[str]:
        """``cmd`` wrapped to run inside this host's namespace."""
        return ["ip", "netns", "exec", self.netns, *cmd]

    def python(self, *args: str) -> list[str]:
        """The test's own interpreter (the repo's venv) with ``args``."""
        return [sys.executable, *args]

    def run(
        self,
        *cmd: str,
        check: bool = True,
        timeout: float = COMMAND_TIMEOUT_S,
        input: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``cmd`` in this namespace and wait for it (output captured)."""
        return sh(*self.exec_argv(*cmd), check=check, timeout=timeout, input=input)

    def popen(
        self, *cmd: str, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> HostProcess:
        """Start ``cmd`` in this namespace in its own process group; the lab stops it at close.

        ``cwd`` defaults to the repository root, so ``python -m tests...`` works too.
        """
        argv = self.exec_argv(*cmd)
        stderr = self.lab.workdir / f"{self.name}-{len(self.lab.processes)}.stderr"
        with stderr.open("w") as err:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                cwd=cwd or REPO_ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **_log_level(), **(env or {})},
                start_new_session=True,  # own process group: killpg reaches its children
            )
        proc = HostProcess(self, cmd, popen, stderr)
        self.lab.processes.append(proc)
        return proc

    def kill(self, proc: HostProcess, sig: int = signal.SIGKILL) -> int:
        """Crash ``proc``: send ``sig`` (default SIGKILL) to its group and reap it."""
        proc.signal(sig)
        return proc.wait(10.0)

    def socket(
        self, family: int = socket.AF_INET, type: int = socket.SOCK_STREAM, proto: int = 0
    ) -> Socket:
        """A socket that lives in this host's namespace, usable from the test process.

        A socket keeps the namespace it was created in, so the test (in the root
        namespace) can talk to a node on ``host.ip`` through it.
        """
        with _in_netns(self.netns):
            return socket.socket(family, type, proto)

    def socket_factory(self, addr_info: tuple[Any, ...]) -> Socket:
        """For ``aiohttp.TCPConnector(socket_factory=host.socket_factory)``."""
        family, type_, proto = addr_info[0], addr_info[1], addr_info[2]
        return self.socket(family, type_, proto)

    def ping(
        self, other: Machine | str, count: int = 20, interval_s: float = 0.01, wait_s: float = 1.0
    ) -> PingResult:
        """Send ``count`` ICMP echo requests to ``other``; count distinct replies.

        Requests go out every ``interval_s``; replies are awaited up to ``wait_s`` after
        the last one. The first request may need ARP, which an impaired link can lose
        too (the kernel retries after 1 s): ping once before impairing a link when the
        exact loss matters.
        """
        target = other.ip if isinstance(other, Machine) else other
        done = self.run(
            *self.python("-c", _PING_SCRIPT, target, str(count), str(interval_s), str(wait_s)),
            timeout=count * interval_s + wait_s + 10,
        )
        sent, received = (int(part) for part in done.stdout.split())
        return PingResult(sent, received)


class Host(Machine):
    """One machine of the lab: a namespace with ``eth0`` on the lab's bridge."""

    lab: Lab

    def __init__(self, lab: Lab, index: int, ip: str):
        super().__init__(lab, f"h{index}", ip)
        self.index = index
        self.dev = HOST_DEV
        self.port = f"p{index}"  # this host's port on the bridge

    # impairments

    def netem(
        self,
        loss_pct: float = 0.0,
        delay_ms: float = 0.0,
        jitter_ms: float = 0.0,
        *,
        both_directions: bool = False,
    ) -> None:
        """Impair what this host sends (and, with ``both_directions``, what it receives).

        Loss applies per packet on the host's egress, so a packet from A to B is lost
        with ``loss_pct`` when only A is impaired; impair every host for "10 % loss on
        every link". Replaces any earlier setting of this host.

        Raises:
            ImpairmentUnsupported: delay or jitter on a kernel without ``sch_netem``.
        """
        if not 0.0 <= loss_pct <= 100.0:
            raise ValueError("loss_pct must be within 0..100")
        for netns, dev in self._impaired_devices(both_directions):
            _impair(netns, dev, loss_pct, delay_ms, jitter_ms)
        if not both_directions:
            _clear_impairment(self.lab.bridge_netns, self.port)

    def clear_netem(self) -> None:
        """Remove loss, delay and jitter from this host's link (both directions)."""
        for netns, dev in self._impaired_devices(True):
            _clear_impairment(netns, dev)

    def partition(self, *others: Host) -> None:
        """Cut this host off from ``others`` (both directions, unicast and multicast).

        Each side drops IPv4 packets whose source is the other, on ingress. ARP still
        passes, as through a firewall. :meth:`heal` undoes it.
        """
        for other in others:
            if other is self:
                continue
            _drop_from(self.netns, self.dev, other)
            _drop_from(other.netns, other.dev, self)
            self.lab.cuts.add(frozenset((self.index, other.index)))

    def heal(self, *others: Host) -> None:
        """Undo :meth:`partition` with ``others`` (with none given: with every host)."""
        targets = others or tuple(self.lab.hosts)
        for other in targets:
            pair = frozenset((self.index, other.index))
            if other is self or pair not in self.lab.cuts:
                continue
            _undrop_from(self.netns, self.dev, other)
            _undrop_from(other.netns, other.dev, self)
            self.lab.cuts.discard(pair)

    def disconnect(self) -> None:
        """Pull the cable: take this host's bridge port down (eth0 loses carrier)."""
        sh("ip", "-n", self.lab.bridge_netns, "link", "set", self.port, "down")

    def reconnect(self) -> None:
        """Plug the cable back in."""
        sh("ip", "-n", self.lab.bridge_netns, "link", "set", self.port, "up")

    def qdisc_show(self) -> str:
        """``tc qdisc show`` and egress filters of eth0, for checks and failure messages."""
        qdiscs = self.run("tc", "qdisc", "show", "dev", self.dev).stdout
        filters = self.run("tc", "filter", "show", "dev", self.dev, "egress", check=False).stdout
        return qdiscs + filters

    def _impaired_devices(self, both_directions: bool) -> list[tuple[str, str]]:
        devices = [(self.netns, self.dev)]
        if both_directions:
            devices.append((self.lab.bridge_netns, self.port))  # the bridge's egress to us
        return devices


def _loss_bytecode(loss_pct: float) -> str:
    """Classic BPF for cls_bpf: match (return -1) with probability ``loss_pct`` / 100.

    ``ld rand`` (SKF_AD_OFF + SKF_AD_RANDOM) loads a fresh 32-bit random number; a
    packet matches when it is below the threshold.
    """
    if loss_pct >= 100.0:
        return "1,6 0 0 4294967295"
    threshold = round(loss_pct / 100.0 * 2**32)
    return f"4,32 0 0 4294963256,53 1 0 {threshold},6 0 0 4294967295,6 0 0 0"


def _tc(netns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return sh("ip", "netns", "exec", netns, "tc", *args, check=check)


def _ensure_drop_hooks(netns: str, dev: str) -> None:
    """A clsact qdisc on ``dev`` and the down veth that swallows redirected packets."""
    links = sh("ip", "-n", netns, "-o", "link", "show").stdout
    if f" {SINK}@" not in links:
        sh("ip", "-n", netns, "link", "add", SINK, "type", "veth", "peer", "name", SINK_PEER)
    if "clsact" not in _tc(netns, "qdisc", "show", "dev", dev).stdout:
        _tc(netns, "qdisc", "add", "dev", dev, "clsact")


_DROP = ("action", "mirred", "egress", "redirect", "dev", SINK)


def _impair(netns: str, dev: str, loss_pct: float, delay_ms: float, jitter_ms: float) -> None:
    _clear_impairment(netns, dev)
    if loss_pct == 0 and delay_ms == 0 and jitter_ms == 0:
        return
    if netem_supported():
        args = ["qdisc", "replace", "dev", dev, "root", "netem", "limit", "10000"]
        if loss_pct:
            args += ["loss", f"{loss_pct}%"]
        if delay_ms or jitter_ms:
            args += ["delay", f"{delay_ms}ms"] + ([f"{jitter_ms}ms"] if jitter_ms else [])
        _tc(netns, *args)
        return
    if delay_ms or jitter_ms:
        raise ImpairmentUnsupported("delay and jitter need sch_netem, which this kernel lacks")
    _ensure_drop_hooks(netns, dev)
    _tc(
        netns, "filter", "add", "dev", dev, "egress", "pref", str(_LOSS_PREF),
        "bpf", "bytecode", _loss_bytecode(loss_pct), *_DROP,
    )  # fmt: skip


def _clear_impairment(netns: str, dev: str) -> None:
    _tc(netns, "qdisc", "del", "dev", dev, "root", check=False)  # netem, if any
    _tc(netns, "filter", "del", "dev", dev, "egress", "pref", str(_LOSS_PREF), check=False)


def _drop_from(netns: str, dev: str, source: Host) -> None:
    _ensure_drop_hooks(netns, dev)
    _tc(
        netns, "filter", "add", "dev", dev, "ingress", "pref",
        str(_PARTITION_PREF_BASE + source.index), "protocol", "ip",
        "u32", "match", "ip", "src", f"{source.ip}/32", *_DROP,
    )  # fmt: skip


def _undrop_from(netns: str, dev: str, source: Host) -> None:
    pref = str(_PARTITION_PREF_BASE + source.index)
    _tc(netns, "filter", "del", "dev", dev, "ingress", "pref", pref)


# --- the lab ---------------------------------------------------------------------------

_OPEN_LABS: set[NamespaceLab] = set()
_atexit_registered = False


def _close_open_labs() -> None:
    for lab in list(_OPEN_LABS):
        with contextlib.suppress(Exception):
            lab.close()


class NamespaceLab:
    """What every lab shares: its id, namespaces, processes, work directory and cleanup.

    Subclasses build their network in :meth:`_build`, creating each namespace with
    :meth:`_add_netns` so it is recorded before anything else can fail. A lab is a
    context manager; :meth:`close` also runs from an ``atexit`` hook, and
    :func:`sweep_stale` finds labs of dead runs by their id ``hnl-<pid>-<hex>``.
    """

    def __init__(self) -> None:
        self.id = f"{PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        self.processes: list[HostProcess] = []
        self.namespaces: list[str] = []  # every namespace created, in order
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.id}-"))
        self._closed = False

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.close()
        except LabError as cleanup_error:
            if exc is None:
                raise
            exc.add_note(f"and the lab's cleanup failed too: {cleanup_error}")

    def start(self) -> None:
        """Create the lab's namespaces and links; on failure, undo all."""
        global _atexit_registered  # noqa: PLW0603 (one hook per process)
        if not _atexit_registered:
            atexit.register(_close_open_labs)
            _atexit_registered = True
        _OPEN_LABS.add(self)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        raise NotImplementedError

    def _add_netns(self, netns: str) -> None:
        sh("ip", "netns", "add", netns)
        self.namespaces.append(netns)
        sh("ip", "-n", netns, "link", "set", "lo", "up")

    def close(self) -> None:
        """Kill every process, delete every namespace; safe to call twice.

        Raises:
            LabError: some namespace of this lab still exists afterwards.
        """
        if self._closed:
            return
        self._closed = True
        _OPEN_LABS.discard(self)
        for proc in self.processes:  # SIGTERM all first, so they stop in parallel
            proc.signal(signal.SIGTERM)
        for proc in self.processes:
            proc.stop(within_s=3.0)
        for netns in reversed(self.namespaces):
            _kill_namespace(netns)
        keep = os.environ.get(KEEP_ENV)
        if keep:  # the processes' stderr (the nodes' logs) kept for a failure's diagnosis
            shutil.copytree(self.workdir, Path(keep) / self.id, dirs_exist_ok=True)
        shutil.rmtree(self.workdir, ignore_errors=True)
        left = [n for n in lab_namespaces(self.id + "-")]
        if left:
            raise LabError(f"namespaces left behind: {left}")


class Lab(NamespaceLab):
    """N hosts in network namespaces on one bridge; a context manager.

    Args:
        n_hosts: how many hosts (1..64).
        subnet: the IPv4 /24 (or larger) the hosts get addresses in, ``.1`` upwards.
            The lab is isolated, so the default never collides with anything.
    """

    def __init__(self, n_hosts: int = 3, *, subnet: str = DEFAULT_SUBNET) -> None:
        if not 1 <= n_hosts <= MAX_HOSTS:
            raise ValueError(f"n_hosts must be within 1..{MAX_HOSTS}")
        network = ipaddress.IPv4Network(subnet)
        if network.num_addresses < n_hosts + 2:
            raise ValueError(f"{subnet} is too small for {n_hosts} hosts")
        super().__init__()
        self.prefixlen = network.prefixlen
        self.bridge_netns = f"{self.id}-br"
        self.hosts = [Host(self, i, str(network.network_address + i + 1)) for i in range(n_hosts)]
        self.cuts: set[frozenset[int]] = set()

    def __repr__(self) -> str:
        return f"<Lab {self.id} hosts={len(self.hosts)}>"

    def __getitem__(self, index: int) -> Host:
        return self.hosts[index]

    def _build(self) -> None:
        self._add_netns(self.bridge_netns)
        br = ("ip", "-n", self.bridge_netns)
        sh(*br, "link", "add", BRIDGE, "type", "bridge", "mcast_snooping", "0")
        sh(*br, "link", "set", BRIDGE, "up")
        for host in self.hosts:
            self._add_host(host)

    def _add_host(self, host: Host) -> None:
        self._add_netns(host.netns)
        ns = ("ip", "-n", host.netns)
        # Both ends are born inside lab namespaces: the root namespace never sees them.
        sh(
            *ns, "link", "add", host.dev, "type", "veth",
            "peer", "name", host.port, "netns", self.bridge_netns,
        )  # fmt: skip
        sh("ip", "-n", self.bridge_netns, "link", "set", host.port, "master", BRIDGE, "up")
        sh(*ns, "addr", "add", f"{host.ip}/{self.prefixlen}", "dev", host.dev)
        sh(*ns, "link", "set", host.dev, "up")
        # Multicast (mDNS: 224.0.0.251) leaves through eth0 even for a socket that did
        # not pick an interface; there is no default route to carry it otherwise.
        sh(*ns, "route", "add", "224.0.0.0/4", "dev", host.dev)

    # impairments for many hosts at once

    def netem_all(
        self, loss_pct: float = 0.0, delay_ms: float = 0.0, jitter_ms: float = 0.0
    ) -> None:
        """:meth:`Host.netem` on every host: each link loses ``loss_pct`` per packet."""
        for host in self.hosts:
            host.netem(loss_pct, delay_ms, jitter_ms)

    def partition(self, side_a: Iterable[Host], side_b: Iterable[Host]) -> None:
        """Split the lab: no host of ``side_a`` reaches one of ``side_b``, or back."""
        b = list(side_b)
        for host in side_a:
            host.partition(*b)

    def heal_all(self) -> None:
        """Undo every partition."""
        for pair in list(self.cuts):
            i, j = sorted(pair)
            self.hosts[i].heal(self.hosts[j])
