"""Zeroconf announce and browse (spec §7.1): thin asyncio glue over :mod:`.announce`.

A node uses it like this::

    discovery = Discovery(
        Announcement.local(node=..., community=..., name=..., port=bound_port),
        on_found=links.consider,      # Announcement: a new peer, or one that changed
        on_lost=links.forget_address,  # NodeID: the peer said goodbye or expired
    )
    await discovery.start()            # open sockets, start browsing (fast, no waiting)
    task_group.create_task(discovery.run())  # announce, then resolve what the browser saw
    ...
    await discovery.stop()             # say goodbye, close sockets (run() then returns)

Callbacks run on the event loop and must not block; an exception in one is logged and
does not stop discovery. Discovery is only a hint of where to dial: the peer's identity
is proven by the link handshake (spec §7.2), never by what a TXT record says.

Run as ``python -m hearthnet.mesh.discovery --name N --node ID --community C --port P``
it announces, browses for ``--seconds`` and prints one JSON line per event (the chaos
tests run it in network namespaces).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import ifaddr
import orjson
from zeroconf import (
    InterfaceChoice,
    IPVersion,
    NonUniqueNameException,
    NotRunningException,
    ServiceStateChange,
)
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from hearthnet.errors import BadRequest, ConfigError, HearthNetError
from hearthnet.mesh.announce import (
    DEFAULT_MAX_PEERS,
    MAX_ADDRESSES,
    SERVICE_TYPE,
    Announcement,
    PeerTable,
    PeerTableStats,
    Sighting,
)

log = logging.getLogger("hearthnet.mesh.discovery")
_T = TypeVar("_T")

# How long one resolve (SRV, TXT, A) may take; mDNS answers on a LAN come within a few
# hundred ms, retries included (RFC 6762 §5.2 re-asks after 1 s).
DEFAULT_RESOLVE_TIMEOUT_MS = 3000
# Resolves in flight at once; one slow or silent responder must not hold up the others.
MAX_CONCURRENT_RESOLVES = 8
# TTL of every record we announce. zeroconf's default for SRV/TXT/PTR is 75 minutes, so a
# node that crashed without a goodbye would stay "found" that long. With 120 s browsers
# re-query at 80 % of the TTL and drop a silent node about two minutes after it died.
DEFAULT_RECORD_TTL_S = 120
# Browser events waiting to be resolved: one slot per service name (a newer event for the
# same name replaces the older one), so this bounds work, not history.
DEFAULT_MAX_PENDING = 2 * DEFAULT_MAX_PEERS
# The CLI runs for at most an hour.
MAX_CLI_SECONDS = 3600.0


@dataclass(frozen=True, slots=True)
class DiscoveryStats:
    """A snapshot of discovery's counters, for ``Node.statistics()``."""

    announced: bool  # our service was registered (probing done) at some point
    table: PeerTableStats
    unresolved: int
    malformed: int
    dropped_events: int
    callback_errors: int


def local_ipv4_addresses() -> set[str]:
    """Every IPv4 address assigned to an interface of this host (namespace)."""
    return {
        ip.ip for adapter in ifaddr.get_adapters() for ip in adapter.ips if isinstance(ip.ip, str)
    }


def check_interfaces(interfaces: Sequence[str]) -> None:
    """:class:`ConfigError` unless every entry is an IPv4 address this host has.

    Checked before zeroconf opens anything: zeroconf leaks the sockets it already
    opened when a later interface fails.
    """
    local = local_ipv4_addresses()
    for address in interfaces:
        try:
            ipaddress.IPv4Address(address)
        except ValueError as exc:
            raise ConfigError(f"mDNS interface {address!r} is not an IPv4 address") from exc
        if address not in local and address != "0.0.0.0":  # noqa: S104 (not a bind)
            raise ConfigError(f"mDNS interface {address} is not an address of this host")


def default_addresses() -> list[str]:
    """Every non-loopback IPv4 address of this host, or ``["127.0.0.1"]`` if none.

    Loopback-only is what an offline laptop has: other processes on it can still find
    the node.
    """
    found: list[str] = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            if isinstance(ip.ip, str) and not ipaddress.IPv4Address(ip.ip).is_loopback:
                found.append(ip.ip)
    return list(dict.fromkeys(found)) or ["127.0.0.1"]


class Discovery:
    """Announces this node over mDNS and reports the peers of its community.

    Args:
        announcement: what to announce. When its ``addresses`` are empty, they are
            filled in at :meth:`start`: the ``interfaces`` given, or else
            :func:`default_addresses` (the first :data:`MAX_ADDRESSES` of either).
        on_found: called with the peer's :class:`Announcement` when a node of our
            community appears or its announcement changes (port, addresses, name, tls).
        on_lost: called with the peer's NodeID when it said goodbye or its records
            expired (:data:`DEFAULT_RECORD_TTL_S` after it went silent).
        on_ignored: optional; called with a resolved announcement of another community
            (spec §7.1: ignored), for diagnostics. It may be called again for the same
            node when its records are refreshed.
        interfaces: IPv4 addresses to serve mDNS on; ``None`` means every IPv4
            interface. ``["127.0.0.1"]`` keeps everything on loopback: two processes on
            one host find each other that way (tests do).
        max_peers: bound of the peer table; further nodes are counted and ignored.
        resolve_timeout_ms: how long one resolve may take.
        record_ttl_s: TTL of our own records.
        max_pending: bound of browser events waiting to be resolved.
    """

    def __init__(
        self,
        announcement: Announcement,
        *,
        on_found: Callable[[Announcement], None],
        on_lost: Callable[[str], None],
        on_ignored: Callable[[Announcement], None] | None = None,
        interfaces: Sequence[str] | None = None,
        max_peers: int = DEFAULT_MAX_PEERS,
        resolve_timeout_ms: int = DEFAULT_RESOLVE_TIMEOUT_MS,
        record_ttl_s: int = DEFAULT_RECORD_TTL_S,
        max_pending: int = DEFAULT_MAX_PENDING,
    ) -> None:
        self._announcement = announcement
        self._on_found = on_found
        self._on_lost = on_lost
        self._on_ignored = on_ignored
        self._interfaces = list(interfaces) if interfaces is not None else None
        self._table = PeerTable(announcement.node, announcement.community, max_peers)
        self._resolve_timeout_ms = resolve_timeout_ms
        self._record_ttl_s = record_ttl_s
        self._max_pending = max_pending
        self._pending: dict[str, ServiceStateChange] = {}
        self._wakeup = asyncio.Event()
        self._resolving = asyncio.Semaphore(MAX_CONCURRENT_RESOLVES)
        self._zc: AsyncZeroconf | None = None
        self._browser: AsyncServiceBrowser | None = None
        self._info: AsyncServiceInfo | None = None
        self._announced = False
        self._closed = False
        self._unresolved = 0
        self._malformed = 0
        self._dropped_events = 0
        self._callback_errors = 0

    @property
    def announcement(self) -> Announcement:
        """What we announce (with the addresses filled in once started)."""
        return self._announcement

    def peers(self) -> tuple[Announcement, ...]:
        """The peers of our community currently known, oldest first."""
        return self._table.peers()

    def statistics(self) -> DiscoveryStats:
        """A snapshot of the counters."""
        return DiscoveryStats(
            announced=self._announced,
            table=self._table.statistics(),
            unresolved=self._unresolved,
            malformed=self._malformed,
            dropped_events=self._dropped_events,
            callback_errors=self._callback_errors,
        )

    async def start(self) -> None:
        """Open the mDNS sockets and start browsing; returns without waiting on the network.

        Raises:
            ConfigError: the interfaces cannot be used (no such address, port 5353 not
                available, ...).
        """
        if self._closed:
            raise HearthNetError("a stopped Discovery cannot start again; make a new one")
        if self._zc is not None:
            return
        if self._interfaces is not None:
            check_interfaces(self._interfaces)
        if not self._announcement.addresses:
            chosen = [a for a in self._interfaces or () if a != "0.0.0.0"]  # noqa: S104
            self._announcement = Announcement.local(
                node=self._announcement.node,
                community=self._announcement.community,
                name=self._announcement.name,
                port=self._announcement.port,
                tls=self._announcement.tls,
                addresses=(chosen or default_addresses())[:MAX_ADDRESSES],
            )
        try:
            self._zc = AsyncZeroconf(
                interfaces=(
                    self._interfaces if self._interfaces is not None else InterfaceChoice.All
                ),
                ip_version=IPVersion.V4Only,
            )
        except OSError as exc:
            raise ConfigError(f"cannot open mDNS sockets on {self._interfaces}: {exc}") from exc
        self._browser = AsyncServiceBrowser(
            self._zc.zeroconf, SERVICE_TYPE, handlers=[self._on_service_state_change]
        )

    async def run(self) -> None:
        """Announce ourselves, then resolve browsed services until :meth:`stop`.

        The node runs this in its task group. Announcing probes for our name first
        (RFC 6762 §8), about a second; a name already held by someone else (the same
        identity running twice) is logged and we keep browsing without announcing.
        """
        if self._zc is None:
            raise HearthNetError("Discovery.run() called before start()")
        await self._announce(self._zc)
        while not self._closed:
            await self._wakeup.wait()
            self._wakeup.clear()
            batch, self._pending = self._pending, {}
            # A batch finishes before the next starts, so a goodbye that arrives while
            # its service is being resolved is applied after that resolve, not before.
            async with asyncio.TaskGroup() as group:
                for name, change in batch.items():
                    if self._closed:
                        break
                    if change is ServiceStateChange.Removed:
                        self._removed(name)
                    else:
                        group.create_task(self._resolve(self._zc, name))

    async def stop(self) -> None:
        """Say goodbye (peers see us lost at once), close the sockets, end :meth:`run`."""
        self._closed = True
        self._wakeup.set()
        if self._browser is not None:
            await self._browser.async_cancel()
            self._browser = None
        if self._zc is not None:
            zc, self._zc = self._zc, None
            await zc.async_close()  # unregisters every service: sends the goodbyes

    # --- internals -------------------------------------------------------------------

    async def _announce(self, zc: AsyncZeroconf) -> None:
        ann = self._announcement
        self._info = AsyncServiceInfo(
            SERVICE_TYPE,
            ann.service_name,
            port=ann.port,
            properties=ann.to_txt(),
            server=ann.host_name,
            parsed_addresses=list(ann.addresses),
            host_ttl=self._record_ttl_s,
            other_ttl=self._record_ttl_s,
        )
        try:
            broadcast = await zc.async_register_service(self._info)
        except NonUniqueNameException:
            log.error("another responder holds %s; not announcing", ann.service_name)
            return
        except NotRunningException:
            return  # stop() closed the sockets while we were probing
        self._announced = True
        # zeroconf owns the task that repeats the announcement; only collect its outcome.
        asyncio.ensure_future(broadcast).add_done_callback(_log_failure)

    def _on_service_state_change(
        self,
        *,
        zeroconf: object,
        service_type: str,
        name: str,
        state_change: ServiceStateChange,
    ) -> None:
        # Called by zeroconf on the event loop; only queue, resolving needs awaiting.
        if self._closed or service_type != SERVICE_TYPE:
            return
        if name.lower() == self._announcement.service_name.lower():
            return  # our own announcement echoed back
        if name not in self._pending and len(self._pending) >= self._max_pending:
            self._dropped_events += 1
            return
        self._pending[name] = state_change
        self._wakeup.set()

    async def _resolve(self, zc: AsyncZeroconf, name: str) -> None:
        info = AsyncServiceInfo(SERVICE_TYPE, name)
        async with self._resolving:
            try:
                resolved = await info.async_request(zc.zeroconf, self._resolve_timeout_ms)
            except NotRunningException:
                return  # stop() closed the sockets under this resolve
        if not resolved:
            self._unresolved += 1
            log.debug("could not resolve %s", name)
            return
        try:
            announcement = Announcement.from_record(
                _instance_of(name),
                info.properties,
                info.parsed_addresses(IPVersion.V4Only),
                info.port,
            )
        except BadRequest as exc:
            self._malformed += 1
            log.debug("ignoring malformed announcement %s: %s", name, exc.message)
            return
        sighting = self._table.observe(announcement)
        if sighting in (Sighting.NEW, Sighting.CHANGED):
            self._call(self._on_found, announcement)
        elif sighting is Sighting.OTHER_COMMUNITY and self._on_ignored is not None:
            self._call(self._on_ignored, announcement)

    def _removed(self, name: str) -> None:
        node = self._table.forget(_instance_of(name))
        if node is not None:
            self._call(self._on_lost, node)

    def _call(self, callback: Callable[[_T], None], arg: _T) -> None:
        try:
            callback(arg)
        except Exception:
            self._callback_errors += 1
            log.exception("discovery callback %r failed", callback)


def _log_failure(future: asyncio.Future[object]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("announcing failed: %r", future.exception())


def _instance_of(name: str) -> str:
    return name[: -len(SERVICE_TYPE) - 1] if name.endswith("." + SERVICE_TYPE) else name


# --- CLI -------------------------------------------------------------------------------


def _emit(event: str, **fields: object) -> None:
    sys.stdout.write(orjson.dumps({"event": event, **fields}).decode() + "\n")
    sys.stdout.flush()


def _peer_fields(announcement: Announcement) -> dict[str, object]:
    return {
        "node": announcement.node,
        "community": announcement.community,
        "name": announcement.name,
        "instance": announcement.instance,
        "port": announcement.port,
        "tls": announcement.tls,
        "addresses": list(announcement.addresses),
    }


async def run_cli(args: argparse.Namespace) -> int:
    """Announce and browse for ``args.seconds`` (or until SIGINT/SIGTERM), printing events.

    Lines: ``{"event": "started", ...our announcement}``, then ``{"event": "found", ...}``
    per peer found or changed, ``{"event": "lost", "node": ...}`` per peer lost and
    ``{"event": "ignored", ...}`` per resolve of another community's node, then
    ``{"event": "summary", ...counters}`` at the end.
    """
    announcement = Announcement.local(
        node=args.node,
        community=args.community,
        name=args.name,
        port=args.port,
        tls=args.tls,
    )
    discovery = Discovery(
        announcement,
        on_found=lambda peer: _emit("found", **_peer_fields(peer)),
        on_lost=lambda node: _emit("lost", node=node),
        on_ignored=lambda peer: _emit("ignored", **_peer_fields(peer)),
        interfaces=args.interface or None,
        max_peers=args.max_peers,
    )
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, done.set)
    await discovery.start()
    _emit("started", **_peer_fields(discovery.announcement))
    try:
        async with asyncio.TaskGroup() as group:
            runner = group.create_task(discovery.run())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), args.seconds)
            runner.cancel()
    finally:
        await discovery.stop()
    stats = discovery.statistics()
    _emit(
        "summary",
        announced=stats.announced,
        peers=stats.table.peers,
        lost=stats.table.lost,
        ignored_other_community=stats.table.ignored_other_community,
        refused_full=stats.table.refused_full,
        malformed=stats.malformed,
        unresolved=stats.unresolved,
    )
    return 0


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value <= MAX_CLI_SECONDS:
        raise argparse.ArgumentTypeError(f"seconds must be in (0, {MAX_CLI_SECONDS:.0f}]")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The CLI's arguments."""
    parser = argparse.ArgumentParser(
        prog="python -m hearthnet.mesh.discovery",
        description="Announce a HearthNet service over mDNS and print the peers found.",
    )
    parser.add_argument("--name", required=True, help="display name (sanitised, cut to fit)")
    parser.add_argument("--node", required=True, help="our NodeID")
    parser.add_argument("--community", required=True, help="our CommunityID")
    parser.add_argument("--port", required=True, type=int, help="the port to announce")
    parser.add_argument("--tls", action="store_true", help="announce tls=1")
    parser.add_argument("--seconds", type=_seconds, default=10.0, help="how long to run")
    parser.add_argument(
        "--interface",
        action="append",
        metavar="ADDR",
        help="IPv4 address to serve mDNS on (repeatable; default: all interfaces)",
    )
    parser.add_argument("--max-peers", type=int, default=DEFAULT_MAX_PEERS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m hearthnet.mesh.discovery``."""
    args = build_parser().parse_args(argv)
    try:
        return asyncio.run(run_cli(args))
    except ConfigError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(main())
