"""Where peers can be dialled (spec §7.1–7.2): bootstrap URLs, discovery, peer exchange.

:class:`PeerBook` is pure apart from :meth:`save`/:meth:`load` (a small JSON file, so peer
addresses survive a restart, spec §9). Each address has its own redial backoff, 0.5 s
doubling to 30 s, reset by a successful link.

The NodeID at an address is *verified* once our own dial of it reached that node (the
signed hello answering our nonce). Anything else (an inbound hello's ``url``, peer
exchange, discovery) is a claim: it never overwrites a verified NodeID, is not shared with
peers as that node's address, and the address is dialled expecting no particular node, so
whoever answers there is what gets recorded.

An operator can forget an address, or every address of a node (``hearthnet peers forget``,
a machine that left for good): it is no longer dialled, and until something vouches for
it again (a configured peer, zeroconf, that node dialling us, our dial of it working)
peer exchange does not teach it back; at most :data:`MAX_FORGOTTEN` such marks are kept.

A linked peer's own claim (its hello's ``url``) is passed on in peer exchange as
``claimed_by`` that peer, and kept as :attr:`PeerAddress.claimed_by`: ``hearthnet peers``
lists the address under that node (one row per peer: behind NAT, a peer reached through
a relay is not listed again as a nameless address), and nothing else reads it.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from hearthnet.errors import BadRequest
from hearthnet.ids import is_node_id

MAX_ADDRESSES = 1000
MAX_FORGOTTEN = 256  # forgotten addresses and nodes that peer exchange may not bring back
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0


def forget_target(text: str) -> str:
    """What ``hearthnet peers forget`` takes: a NodeID, or an address (``host:port`` alone
    is ``http://host:port``), normalised; :class:`BadRequest` for anything else."""
    text = text.strip()
    if is_node_id(text):
        return text
    if "://" not in text:
        text = "http://" + text
    try:
        return normalize_url(text)
    except BadRequest:
        raise BadRequest(
            f"not a NodeID or a peer address: {text!r} (ed25519:... or http://host:port,"
            " as hearthnet peers lists them)"
        ) from None


def normalize_url(url: object) -> str:
    """``http(s)://host:port`` with no path; :class:`BadRequest` for anything else."""
    if not isinstance(url, str) or len(url) > 256:
        raise BadRequest("a peer URL is a string")
    try:
        parts = urlsplit(url.strip())
        port = parts.port  # raises for a port that is no number, or out of range
    except ValueError:
        port = None
    if port is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadRequest(f"peer URL {url!r} must look like http://host:port")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{port}"


def well_formed(urls: Iterable[str]) -> list[str]:
    """The peer URLs among ``urls``, normalized (:func:`normalize_url`), in order; the
    rest left out (a peer's hello or referral may carry anything)."""
    out = []
    for url in urls:
        try:
            out.append(normalize_url(url))
        except BadRequest:
            continue
    return out


@dataclass
class PeerAddress:
    """One dialable address and what we know about it."""

    url: str
    node: str | None = None
    source: str = "bootstrap"  # bootstrap | zeroconf | exchange | inbound | relay
    failures: int = 0
    next_try: float = 0.0
    last_ok_ms: int = 0
    verified: bool = False  # ``node`` is what our own dial of ``url`` reached
    # the node whose own hello gives this address, as a peer passed it on: for
    # ``hearthnet peers`` only (never expected on a dial, never shared as its)
    claimed_by: str | None = None

    @property
    def expect(self) -> str | None:
        """The NodeID a dial of this address insists on: the verified one, else none."""
        return self.node if self.verified else None

    def to_json(self) -> dict[str, Any]:
        """Stored form."""
        stored = {
            "url": self.url,
            "node": self.node,
            "source": self.source,
            "last_ok_ms": self.last_ok_ms,
            "verified": self.verified,
        }
        return stored if self.claimed_by is None else {**stored, "claimed_by": self.claimed_by}


class PeerBook:
    """Known peer addresses, bounded, with backoff."""

    def __init__(self, path: Path | None = None, own_urls: tuple[str, ...] = ()) -> None:
        self.path = path
        self.own_urls = set(own_urls)
        self.addresses: dict[str, PeerAddress] = {}
        # forgotten ``host:port``s and NodeIDs, oldest first (an ordered set)
        self.forgotten: dict[str, None] = {}
        self.dirty = False

    def add(
        self,
        url: str,
        *,
        node: str | None = None,
        source: str = "bootstrap",
        claimed_by: str | None = None,
    ) -> PeerAddress | None:
        """Learn an address (refusing our own); returns it, or None when refused. ``node``
        is a claim: it replaces an unverified NodeID, never a verified one. ``claimed_by``:
        the node whose own hello gives the address (:attr:`PeerAddress.claimed_by`)."""
        try:
            url = normalize_url(url)
        except BadRequest:
            return None
        if url in self.own_urls or (node is not None and not is_node_id(node)):
            return None
        if claimed_by is not None and not is_node_id(claimed_by):
            return None
        if self.forgotten and not self._vouched(url, node, claimed_by, source):
            return None
        entry = self.addresses.get(url)
        if entry is None:
            if len(self.addresses) >= MAX_ADDRESSES:
                self._forget_one()
            entry = self.addresses[url] = PeerAddress(url, node, source)
            self.dirty = True
        elif node is not None and entry.node != node and not entry.verified:
            entry.node = node
            self.dirty = True
        if claimed_by is not None and entry.claimed_by != claimed_by:
            entry.claimed_by = claimed_by
            self.dirty = True
        return entry

    def _vouched(self, url: str, node: str | None, claimed_by: str | None, source: str) -> bool:
        """Whether an address may be learnt despite :attr:`forgotten`: what peers pass on
        may not bring a forgotten one back; anything else (configuration, zeroconf, an
        inbound hello, our own dial) vouches for it, and lifts its marks."""
        marks = [k for k in (_host_port(url), node, claimed_by) if k in self.forgotten]
        if not marks:
            return True
        if source == "exchange":
            return False
        for mark in marks:
            del self.forgotten[mark]
        self.dirty = True
        return True

    def forget(self, target: str) -> list[PeerAddress]:
        """Forget every address of ``target`` (:func:`forget_target`'s form): a NodeID's
        (verified there, or claimed by it), or an address under either scheme; what was
        forgotten, by URL. Peer exchange may not bring them back (:attr:`forgotten`);
        nothing is marked when nothing matched."""
        if is_node_id(target):
            gone = [a.url for a in self.addresses.values() if target in (a.node, a.claimed_by)]
        else:
            where = _host_port(target)
            gone = [u for u in self.addresses if _host_port(u) == where]
        if not gone:
            return []
        marks = [target] if is_node_id(target) else []
        removed = []
        for url in sorted(gone):
            removed.append(self.addresses.pop(url))
            marks.append(_host_port(url))
        for mark in marks:
            self.forgotten.pop(mark, None)
            self.forgotten[mark] = None  # the newest last
        while len(self.forgotten) > MAX_FORGOTTEN:
            del self.forgotten[next(iter(self.forgotten))]
        self.dirty = True
        return removed

    def _forget_one(self) -> None:
        worst = max(self.addresses.values(), key=lambda a: (a.failures, -a.last_ok_ms))
        del self.addresses[worst.url]

    def due(self, now: float, linked: set[str]) -> list[PeerAddress]:
        """Addresses worth dialling now: not in backoff, not verified as a linked node's
        (an address only claimed by a linked node is due, to check it); best first."""
        ready = [
            a
            for a in self.addresses.values()
            if a.next_try <= now and not (a.verified and a.node in linked)
        ]
        ready.sort(key=lambda a: (a.failures, -a.last_ok_ms))
        return ready

    def failed(self, url: str, now: float) -> None:
        """A dial failed: back off (0.5 s doubling to 30 s, ±20 % jitter)."""
        entry = self.addresses.get(url)
        if entry is None:
            return
        entry.failures += 1
        delay = min(BACKOFF_MAX_S, BACKOFF_START_S * 2 ** (entry.failures - 1))
        entry.next_try = now + delay * random.uniform(0.8, 1.2)

    def succeeded(self, url: str, node: str, wall_ms: int) -> None:
        """Our own dial of this address reached ``node`` (which is now verified there)."""
        entry = self.addresses.get(url) or self.add(url, node=node)
        if entry is None:
            return
        entry.node, entry.failures, entry.next_try, entry.last_ok_ms = node, 0, 0.0, wall_ms
        entry.verified = True
        self.dirty = True

    def retry_now(self, nodes: set[str], now: float) -> None:
        """Dial the addresses of ``nodes`` now: those waiting out a backoff are due at
        ``now`` with their failures forgotten (spec §8 failover: when a relay is lost, the
        first try at another relay waits for nothing). Addresses held for other reasons
        (a link up, a refusal) are not touched: only a failed dial backs off."""
        for entry in self.addresses.values():
            if entry.node in nodes and entry.failures and entry.next_try > now:
                entry.failures, entry.next_try = 0, now

    def verified_node(self, url: str) -> str | None:
        """The NodeID our own dial found at ``url``, if any."""
        entry = self.addresses.get(url)
        return entry.node if entry is not None and entry.verified else None

    def hold(self, url: str, now: float, seconds: float) -> None:
        """Do not dial ``url`` for a while (its link is up, or it refused us for good)."""
        entry = self.addresses.get(url)
        if entry is not None:
            entry.next_try = now + seconds

    def exchange_entry(self, address: str, node: str) -> dict[str, Any]:
        """The peer-exchange entry for a linked ``node`` at ``address``: with its NodeID
        only where our own dial found that node there; else the address the node's own
        hello claims, ``claimed_by`` it (whoever dials it checks who answers, and lists it
        under that node meanwhile: behind a symmetric NAT the address is another home's
        private one that only the relayed peer's row may show); a claim our own dial
        found false (another node answers there) goes without either."""
        verified = self.verified_node(address)
        if verified == node:
            return {"url": address, "node": node}
        if verified is None:
            return {"url": address, "claimed_by": node}
        return {"url": address}

    def urls_for_exchange(self, limit: int = 64) -> list[dict[str, Any]]:
        """Addresses to share with peers (verified ones that worked, most recent first)."""
        good = sorted(
            (a for a in self.addresses.values() if a.last_ok_ms and a.node and a.verified),
            key=lambda a: -a.last_ok_ms,
        )
        return [{"url": a.url, "node": a.node} for a in good[:limit]]

    def learn_exchanged(self, peers: list[Any], own_node: str, limit: int = 64) -> None:
        """Peer exchange: remember the addresses a member shared (spec §7.1), at most
        ``limit`` of them, never our own."""
        for entry in peers[:limit]:
            if not isinstance(entry, dict) or own_node in (
                entry.get("node"),
                entry.get("claimed_by"),
            ):
                continue
            claimant = entry.get("claimed_by")
            self.add(
                str(entry.get("url", "")),
                node=entry.get("node"),
                source="exchange",
                claimed_by=claimant if is_node_id(claimant) else None,
            )

    def known_peers(
        self, linked: set[str], claimed: dict[str, str] | None = None
    ) -> list[dict[str, Any]]:
        """One row per peer that is not linked now, for ``hearthnet peers``: a node known
        at several addresses (``http://`` and ``https://``, a LAN and a relay address)
        is listed once, with the address that last worked (else the one that failed
        least) as ``url`` and all of them in ``urls``. Addresses whose node is unknown
        are listed one by one, but for those in ``claimed`` (URL -> NodeID: what linked
        peers say their address is) or that a peer passed on ``claimed_by`` a node, which
        are that node's."""
        # an address whose node is not known yet is the node known at the same host and
        # port under the other scheme, if any, else the node that claims it
        at = {_host_port(u): n for u, n in _normalized(claimed or {}).items()}
        at.update(
            (_host_port(a.url), a.claimed_by)
            for a in self.addresses.values()
            if a.claimed_by is not None
        )
        at.update(
            (_host_port(a.url), a.node) for a in self.addresses.values() if a.node is not None
        )
        by_node: dict[str, list[PeerAddress]] = {}
        rows: list[dict[str, Any]] = []
        for address in self.addresses.values():
            node = address.node or at.get(_host_port(address.url))
            if node is None:
                rows.append(_known_row(None, [address]))
            elif node not in linked:
                by_node.setdefault(node, []).append(address)
        rows.extend(_known_row(node, addresses) for node, addresses in by_node.items())
        return rows

    def load(self) -> None:
        """Read the saved addresses (a missing or corrupt file is an empty book)."""
        if self.path is None or not self.path.exists():
            return
        try:
            saved = json.loads(self.path.read_text(encoding="utf-8"))
            entries = saved["addresses"]
        except (ValueError, KeyError, OSError, TypeError):
            return
        for item in entries[:MAX_ADDRESSES]:
            if isinstance(item, dict):
                entry = self.add(
                    item.get("url", ""), node=item.get("node"), source=item.get("source", "saved")
                )
                if entry is not None:
                    entry.last_ok_ms = int(item.get("last_ok_ms") or 0)
                    entry.verified = item.get("verified") is True and entry.node is not None
                    claimant = item.get("claimed_by")
                    entry.claimed_by = claimant if is_node_id(claimant) else None
        forgotten = saved.get("forgotten") if isinstance(saved, dict) else None
        if isinstance(forgotten, list):  # after the addresses: they were not forgotten
            marks = [m for m in forgotten if isinstance(m, str)][-MAX_FORGOTTEN:]
            self.forgotten = dict.fromkeys(marks)
        self.dirty = False

    def save(self) -> None:
        """Write the book atomically if it changed."""
        if self.path is None or not self.dirty:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        saved: dict[str, Any] = {"addresses": [a.to_json() for a in self.addresses.values()]}
        if self.forgotten:
            saved["forgotten"] = list(self.forgotten)
        tmp.write_text(json.dumps(saved), encoding="utf-8")
        os.replace(tmp, self.path)
        self.dirty = False


def _normalized(urls: dict[str, str]) -> dict[str, str]:
    """``urls`` with each URL normalised, those that are not peer URLs left out."""
    return {u: node for url, node in urls.items() for u in well_formed((url,))}


def same_place(url: str, other: str) -> bool:
    """Whether two normalised URLs are the same ``host:port`` (under either scheme)."""
    return _host_port(url) == _host_port(other)


def _host_port(url: str) -> str:
    """``host:port`` of a normalised URL (its scheme dropped)."""
    return url.partition("://")[2]


def _known_row(node: str | None, addresses: list[PeerAddress]) -> dict[str, Any]:
    best = min(addresses, key=lambda a: (-a.last_ok_ms, a.failures, a.url))
    return {
        "node": node,
        "linked": False,
        "url": best.url,
        "urls": sorted(a.url for a in addresses),
        "source": best.source,
        "failures": min(a.failures for a in addresses),
        "last_ok_ms": best.last_ok_ms or None,
    }
