"""What the mesh's pure cores ask the asyncio glue to do. Pure values.

The cores (:class:`~hearthnet.mesh.gossip.Gossip`, :class:`~hearthnet.mesh.flood.PresenceFlood`,
:class:`~hearthnet.mesh.heartbeat.Heartbeats`) take typed frames and the current time and
return these; :class:`~hearthnet.mesh.service.Mesh` carries them out through the routes
(:class:`~hearthnet.mesh.routing.Routes`), the log and pub/sub.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hearthnet.mesh.frames import BatchMsgs, Msg, PeerFrame
from hearthnet.pubsub.envelope import Message

if TYPE_CHECKING:  # heartbeat.py returns these actions
    from hearthnet.mesh.heartbeat import Observation


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``frame`` to the peer ``node`` (over whatever path reaches it)."""

    node: str
    frame: PeerFrame


@dataclass(frozen=True, slots=True)
class Forward:
    """Send the encoded frame ``data`` to every linked peer but ``skip`` (encoded once, the
    same bytes for every link: spec §7.3 fan-out)."""

    data: bytes
    skip: str | None
    # a message with data_enc: only to peers that take it (v3 links, mesh/older_links.py)
    binary: bool = False


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    """Send a whole signed batch to every linked peer but ``skip``: the ``batch`` frame to
    a peer that takes it (v3 links), the ``msgs`` frames (one per message) to the others;
    each kind encoded once, and only when some peer gets it."""

    batch: BatchMsgs
    messages: tuple[Message, ...]
    hops: tuple[int, ...]  # each message's hops for its msg frame
    skip: str | None

    def msgs(self, binary: bool = True) -> list[bytes]:
        """The batch as encoded ``msg`` frames, for a peer on an older link (this makes
        each message's proof, which a batch frame does without); without ``binary``,
        not the messages with ``data_enc``."""
        return [
            Msg(m.raw, h).encode()
            for m, h in zip(self.messages, self.hops, strict=True)
            if binary or m.data_enc is None
        ]


@dataclass(frozen=True, slots=True)
class Deliver:
    """A verified message new to this node: ingest it into the log (whose commit delivers
    it locally and forwards it on)."""

    message: Message
    source: str
    hops: int
    catch_up: bool = False  # a peer advertised holding it before it came (Gossip.is_catch_up)


@dataclass(frozen=True, slots=True)
class Duplicate:
    """A gossiped message this node holds or is ingesting already (counted)."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A gossiped message that failed to parse or verify, or whose origin is not a member
    (counted under ``label``, logged, dropped)."""

    source: str
    reason: str
    label: str = "gossip"


@dataclass(frozen=True, slots=True)
class Repair:
    """Read ``spans`` ``(origin, from, to)`` from the log, at most ``budget`` messages in
    all, and send them to ``node`` as ``msg`` frames; then report back with
    :meth:`~hearthnet.mesh.gossip.Gossip.repaired`."""

    node: str
    spans: tuple[tuple[str, int, int], ...]
    budget: int


@dataclass(frozen=True, slots=True)
class ApplyPresence:
    """Apply presence events gossiped from another node to the local table."""

    events: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Admit:
    """Verify and admit membership records a peer sent (off the event loop)."""

    node: str
    records: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Record:
    """Write one heartbeat-log record about the link to ``node``."""

    node: str
    observation: Observation
    ts: int


@dataclass(frozen=True, slots=True)
class CloseLink:
    """End the link to ``node``."""

    node: str
    reason: str


Action = (
    Send
    | Forward
    | ForwardBatch
    | Deliver
    | Duplicate
    | Refused
    | Repair
    | ApplyPresence
    | Admit
    | Record
    | CloseLink
)
