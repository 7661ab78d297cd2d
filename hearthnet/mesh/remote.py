"""Capability calls across peer links (spec §2.3, §7.4).

Caller side: :class:`RemoteProvider` is the :class:`~hearthnet.bus.routing.Provider` of a
capability that runs on another node. It sends the *original* call envelope and
credentials over the link towards the provider (the provider verifies the caller end to
end) and turns the ``frame`` replies back into a stream; acks, tool results and cancel
travel the same path.

Provider side (and every node in between): :class:`RemoteCalls` verifies an incoming
``call`` like any other, pins it to the provider it names and runs it through the bus, so
a node that is not the provider simply forwards it one hop further, through the same code.

Routes: every node announces the capabilities it can reach (its own at 0 hops, learnt ones
at +1, at most :data:`MAX_HOPS`) in ``caps`` frames; the fewest hops win.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Collection, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from hearthnet.auth import Authenticator
from hearthnet.bus.calls import Bus, CallHandle
from hearthnet.bus.capability import CallContext
from hearthnet.bus.descriptor import CapabilityDescriptor, parse_version, version_satisfies
from hearthnet.bus.envelope import VerifiedCall
from hearthnet.bus.routing import Router
from hearthnet.bus.signatures import SignatureWorker
from hearthnet.clock import now_ms
from hearthnet.community import Level
from hearthnet.errors import (
    BadRequest,
    CapacityExceeded,
    DeadlineExceeded,
    Unavailable,
    WireError,
)
from hearthnet.frames import Frame
from hearthnet.ids import is_node_id, new_ulid
from hearthnet.mesh.call_frames import Ack, Call, Cancel, StreamFrame, ToolResult
from hearthnet.mesh.call_hold import CallerResends, ReplyTails, ResendCounts, SeenCalls
from hearthnet.transport.flow import FlowWindow

log = logging.getLogger("hearthnet.mesh.remote")

MAX_HOPS = 4
STREAM_WINDOW = 16
ACK_EVERY = 8
ACK_TIMEOUT_S = 5.0
MAX_STREAMS_PER_LINK = 1024


class LinkSender(Protocol):
    """What remote calls need of a link."""

    @property
    def node(self) -> str:
        """The peer's NodeID."""

    def send_raw(self, data: bytes) -> bool:
        """Queue an encoded frame."""


def descriptor_from_json(obj: Any) -> CapabilityDescriptor:
    """A peer's descriptor; :class:`BadRequest` if malformed."""
    if not isinstance(obj, dict):
        raise BadRequest("a descriptor is an object")
    try:
        return CapabilityDescriptor(
            name=obj["name"],
            version=obj["version"],
            request_schema=obj.get("request_schema") or {},
            response_schema=obj.get("response_schema"),
            stream_schema=obj.get("stream_schema"),
            stability=obj.get("stability", "stable"),
            max_concurrent=int(obj.get("max_concurrent", 64)),
            timeout_s=float(obj.get("timeout_s", 30.0)),
            min_level=Level.parse(obj.get("min_level", "member")),
            idempotent=bool(obj.get("idempotent", False)),
            description=str(obj.get("description", ""))[:500],
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise BadRequest(f"malformed descriptor: {exc}") from exc


@dataclass
class _Outgoing:
    """A call we sent towards a provider, waiting for its frames."""

    via: str
    queue: asyncio.Queue[Frame | WireError] = field(
        default_factory=lambda: asyncio.Queue(STREAM_WINDOW * 2)
    )
    seq: int = 0  # the last frame's number: the provider numbers them 1, 2, 3...
    answered: bool = False  # a reply frame came (the provider has the call)

    def arrival(self, item: Frame) -> Literal["next", "again", "gap"]:
        """Where ``item`` falls in the reply: the ``next`` frame (counted as received; an
        unnumbered one too), one had ``again`` (resent after a path change), or past a
        ``gap`` (frames lost with a link that died with them on it)."""
        if item.seq is None or item.seq == self.seq + 1:
            self.seq = self.seq if item.seq is None else item.seq
            return "next"
        return "again" if item.seq <= self.seq else "gap"

    def fail(self, error: WireError) -> None:
        """End the call with ``error`` after the frames already queued. When the queue is
        full (the caller is behind) those frames are dropped, the call failed anyway: the
        error must fit, or the caller would read them and then wait for its deadline."""
        if self.queue.full():
            while not self.queue.empty():
                self.queue.get_nowait()
        self.queue.put_nowait(error)


@dataclass
class _Incoming:
    """A call a peer sent us (to run here, or to pass on)."""

    handle: CallHandle | None
    window: FlowWindow = field(default_factory=lambda: FlowWindow(STREAM_WINDOW))
    moved: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None


def _reply(link: LinkSender, sid: str, frame: Frame) -> bytes:
    """One frame of a call's reply stream, back on the link the call came on."""
    data = StreamFrame(sid, frame.to_json()).encode()
    link.send_raw(data)
    return data


class RemoteProvider:
    """A node we can reach over the mesh, as a provider of capabilities."""

    is_local = False

    def __init__(self, calls: RemoteCalls, node_id: str, via: str, hops: int) -> None:
        self.calls = calls
        self.node_id = node_id
        self.via = via
        self.hops = hops
        self._descriptors: dict[str, list[CapabilityDescriptor]] = {}
        self.in_flight: dict[str, int] = {}

    def update(self, descriptors: list[CapabilityDescriptor]) -> None:
        """Replace what this provider offers."""
        table: dict[str, list[CapabilityDescriptor]] = {}
        for desc in descriptors:
            table.setdefault(desc.name, []).append(desc)
        for offered in table.values():
            offered.sort(key=lambda d: parse_version(d.version), reverse=True)
        self._descriptors = table

    def descriptors(self) -> list[CapabilityDescriptor]:
        """Everything offered."""
        return [d for offered in self._descriptors.values() for d in offered]

    def descriptor(self, name: str, version: str) -> CapabilityDescriptor | None:
        """The best offered version for the request."""
        for desc in self._descriptors.get(name, ()):
            if version_satisfies(desc.version, version):
                return desc
        return None

    def load(self, name: str, version: str) -> float:
        """Our own in-flight calls to it over its max_concurrent."""
        desc = self.descriptor(name, version)
        return self.in_flight.get(desc.key, 0) / desc.max_concurrent if desc else 1.0

    def acquire(self, descriptor: CapabilityDescriptor) -> None:
        """Count a call (the provider enforces its own limit too)."""
        used = self.in_flight.get(descriptor.key, 0)
        if used >= descriptor.max_concurrent:
            raise CapacityExceeded(
                f"{descriptor.key} on {self.node_id} is busy", retry_after_ms=100
            )
        self.in_flight[descriptor.key] = used + 1

    def release(self, descriptor: CapabilityDescriptor) -> None:
        """Give the slot back."""
        self.in_flight[descriptor.key] = max(0, self.in_flight.get(descriptor.key, 1) - 1)

    def run(
        self, call: VerifiedCall, ctx: CallContext, descriptor: CapabilityDescriptor
    ) -> AsyncIterator[Frame]:
        """Stream the call's frames back from the provider."""
        return self.calls.stream_to(self, call, ctx)


class RemoteCalls:
    """Calls over peer links, both directions, and the capability routes."""

    def __init__(
        self,
        *,
        node_id: str,
        authenticator: Authenticator,
        bus: Bus,
        router: Router,
        link_to: Callable[[str], LinkSender | None],
        spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]],
    ) -> None:
        self.node_id = node_id
        self.authenticator = authenticator
        self.bus = bus
        self.router = router
        self.link_to = link_to
        self.spawn = spawn
        self.outgoing: dict[str, _Outgoing] = {}
        self.incoming: dict[tuple[str, str], _Incoming] = {}
        # the node's signature checker (spec §11): a call's signature is checked there,
        # beside the event loop, when other calls are running or being checked
        self.signatures: SignatureWorker | None = None
        # routes[provider] = (hops, via neighbour, descriptors) learnt from each neighbour
        self.learnt: dict[str, dict[str, tuple[int, list[CapabilityDescriptor]]]] = {}
        # spec §8: what each end of a call sends again when the link under it changed (a
        # fall-back, a held sequence taken up: call_hold.py): a provider's reply frames
        # not yet acknowledged, a caller's openings, tool results and cancels; the call
        # openings taken (one sent again is dropped); whether a peer's sequence is held
        self.tails = ReplyTails()
        self.resends = CallerResends()
        self.seen = SeenCalls()
        self.is_held: Callable[[str], bool] = lambda node: False
        self.counts = ResendCounts()  # what went again, openings dropped, calls ended
        self.resent = 0  # call frames sent again after a path change, since start

    # --- routes -----------------------------------------------------------------------

    def announcement(self, exclude_via: str | None = None) -> list[dict[str, Any]]:
        """What we can reach, for a ``caps`` frame (split horizon: not back to its source)."""
        out = [
            {
                "node": self.node_id,
                "hops": 0,
                "descriptors": [d.to_json() for d in self.router.local.registry.descriptors()],
            }
        ]
        for provider_id, provider in self.router.remote.items():
            if (
                isinstance(provider, RemoteProvider)
                and provider.via != exclude_via
                and provider.hops + 1 <= MAX_HOPS
            ):
                out.append(
                    {
                        "node": provider_id,
                        "hops": provider.hops + 1,
                        "descriptors": [d.to_json() for d in provider.descriptors()],
                    }
                )
        return out

    def learn(self, via: str, providers: object) -> bool:
        """A neighbour's ``caps``: rebuild routes; True when our routes changed."""
        table: dict[str, tuple[int, list[CapabilityDescriptor]]] = {}
        if isinstance(providers, list):
            for entry in providers[:1024]:
                if not isinstance(entry, dict) or not is_node_id(entry.get("node")):
                    continue
                hops = entry.get("hops")
                if (
                    not isinstance(hops, int)
                    or not 0 <= hops < MAX_HOPS
                    or entry["node"] == self.node_id
                ):
                    continue
                descriptors = []
                for raw in entry.get("descriptors", [])[:256]:
                    with contextlib.suppress(BadRequest):
                        descriptors.append(descriptor_from_json(raw))
                table[entry["node"]] = (hops + 1, descriptors)
        self.learnt[via] = table
        return self._rebuild()

    def forget(self, via: str, why: str | None = None) -> bool:
        """A neighbour went away: drop its routes, end the calls with it (``why``: the
        error's message); True when our routes changed."""
        self.learnt.pop(via, None)
        self.tails.forget(via)
        self.resends.forget(via)
        for key, stream in list(self.outgoing.items()):
            if stream.via == via:
                stream.fail(Unavailable(why or f"the link to {via} went down mid-call"))
                self.outgoing.pop(key, None)
        for (peer, _), incoming in list(self.incoming.items()):
            if peer == via and incoming.task is not None:
                incoming.task.cancel()
        return self._rebuild()

    def resend(self, peer: str, *, openings: bool = True, handed: Collection[bytes] = ()) -> None:
        """``peer``'s direct link died and a relayed link took its place (a fall-back), or
        its sequence is held for the next link (spec §8; path_switch.py, path_hold.py):
        the calls with it go on. What the dead link may have lost unnumbered (it carried
        plain frames once its switch settled) is sent again on the peer's link now, in
        the sequence: our openings of calls not answered, tool results and cancels, our
        last ack of each call to it, and the reply frames it has not acknowledged
        (call_hold.py). The peer drops what it had. Openings go again only when the peer
        drops one it took (``openings``: its hello's ``call_resend``); else a call not
        answered ends now with ``unavailable``, unless its opening is among the frames
        the dead link never wrote (``handed``: the link in its place carries those)."""
        link = self.link_to(peer)
        if link is None:
            return
        frames, ended = self.resends.plan(peer, openings=openings, handed=handed)
        frames += [
            ("ack", Ack(s, o.seq).encode())
            for s, o in self.outgoing.items()
            if o.via == peer and o.seq
        ]
        frames += [("frame", data) for data in self.tails.again(peer)]
        for kind, data in frames:
            link.send_raw(data)
            self.counts.sent(kind)
        self.resent += len(frames)
        for sid in ended:  # its generator's end sends the cancel
            out = self.outgoing.pop(sid, None)
            if out is not None:
                self.counts.older_peer_ended += 1
                out.fail(
                    Unavailable(
                        f"the direct link to {peer} died before it answered; it runs an"
                        " older HearthNet that cannot take the call again (its hello lists"
                        " no 'call_resend'), so the call ended: call again",
                        retry_after_ms=1000,
                    )
                )

    def _rebuild(self) -> bool:
        best: dict[str, tuple[int, str, list[CapabilityDescriptor]]] = {}
        for via, table in self.learnt.items():
            for provider, (hops, descriptors) in table.items():
                current = best.get(provider)
                if current is None or (hops, via) < (current[0], current[1]):
                    best[provider] = (hops, via, descriptors)
        changed = False
        for provider_id in list(self.router.remote):
            if provider_id not in best:
                self.router.remove_remote(provider_id)
                changed = True
        for provider_id, (hops, via, descriptors) in best.items():
            existing = self.router.remote.get(provider_id)
            if not isinstance(existing, RemoteProvider) or (existing.via, existing.hops) != (
                via,
                hops,
            ):
                existing = RemoteProvider(self, provider_id, via, hops)
                self.router.add_remote(existing)
                changed = True
            before = {d.key for d in existing.descriptors()}
            existing.update(descriptors)
            changed = changed or before != {d.key for d in descriptors}
        return changed

    # --- caller side ------------------------------------------------------------------

    async def stream_to(
        self, provider: RemoteProvider, call: VerifiedCall, ctx: CallContext
    ) -> AsyncIterator[Frame]:
        """Send a call towards ``provider`` and yield its frames (acks go back as we go)."""
        link = self.link_to(provider.via)
        if link is None:
            raise Unavailable(f"no link towards {provider.node_id}", retry_after_ms=1000)
        sid = new_ulid()
        out = self.outgoing[sid] = _Outgoing(provider.via)
        remaining = max(1, int(ctx.remaining_s() * 1000))
        opening = Call(
            sid,
            provider.node_id,
            call.envelope.to_json(),
            call.signature,
            call.token,
            remaining,
            ctx.inline_tools,
        ).encode()
        self.resends.opened(provider.via, sid, opening)
        link.send_raw(opening)
        ctx.forward_tool_result = lambda tool_call_id, body: self._send(
            provider.via, ToolResult(sid, tool_call_id, body)
        )
        finished = False
        received = 0
        try:
            while True:
                item = await out.queue.get()
                if isinstance(item, WireError):
                    raise item
                received += 1
                if item.terminal:
                    finished = True
                    yield item
                    return
                yield item
                if received % ACK_EVERY == 0 and item.seq is not None:
                    self._send(provider.via, Ack(sid, item.seq))
        finally:
            self.outgoing.pop(sid, None)
            self.resends.ended(sid)
            if not finished:
                self._send(provider.via, Cancel(sid))

    def _send(self, node: str, frame: Ack | Cancel | ToolResult) -> None:
        data = frame.encode()
        if isinstance(frame, Cancel):  # sent again at a path change (call_hold.py)
            self.resends.cancelled(node, frame.sid, data)
        elif isinstance(frame, ToolResult):
            self.resends.tool_result(node, frame.sid, data)
        link = self.link_to(node)
        if link is not None:
            link.send_raw(data)

    def on_frame(self, link: LinkSender, frame: StreamFrame) -> None:
        """A ``frame`` reply for one of our outgoing calls."""
        out = self.outgoing.get(frame.sid)
        if out is None or out.via != link.node:
            return  # a late frame for a call that ended
        try:
            item = Frame.from_json(frame.f)
        except BadRequest as exc:
            item = Frame(
                "error",
                BadRequest(f"malformed frame from {link.node}: {exc.message}").to_frame_data(),
            )
        arrival = out.arrival(item)
        if arrival == "again":
            return
        if not out.answered:  # the provider has the call: its opening is not sent again
            out.answered = True
            self.resends.answered(frame.sid)
        if arrival == "gap":  # the stream ends with an error frame, never as if whole
            self.outgoing.pop(frame.sid, None)
            out.fail(
                Unavailable(
                    f"frames after {out.seq} of the reply from {link.node} were lost on "
                    f"the way (frame {item.seq} came next); the call ended"
                )
            )
            self._send(link.node, Cancel(frame.sid))
            return
        try:
            out.queue.put_nowait(item)
        except asyncio.QueueFull:
            # the provider ignored the window: end the call rather than buffer without bound
            self.outgoing.pop(frame.sid, None)
            out.fail(Unavailable(f"{link.node} sent past the stream window; the call ended"))
            self._send(link.node, Cancel(frame.sid))

    # --- provider side ----------------------------------------------------------------

    def on_call(self, link: LinkSender, frame: Call) -> None:
        """A call from a peer: verify the original caller, then run or pass it on."""
        sid = frame.sid
        key = (link.node, sid)
        if key in self.incoming or not self.seen.first(link.node, sid):
            self.counts.openings_dropped += 1
            return  # sent again after a path change (call_hold.py): taken already
        if sum(1 for p, _ in self.incoming if p == link.node) >= MAX_STREAMS_PER_LINK:
            self._refuse(link, sid, CapacityExceeded("too many calls on this link"))
            return
        target = frame.to
        pinned = target if target is not None and is_node_id(target) else self.node_id
        checks = self.signatures
        if checks is not None and frame.signature is not None and (self.incoming or checks.busy):
            # calls overlap: the signature goes to the checker (the slot is held meanwhile)
            incoming = self.incoming[key] = _Incoming(None)
            incoming.task = self.spawn(
                self._checked(link, frame, pinned, checks, incoming), f"remote-call-{sid}"
            )
            return
        try:
            call = self.authenticator.authenticate_call(
                frame.envelope,
                signature=frame.signature,
                token=frame.token,
                now_ms=now_ms(),
                target=pinned,
                deadline_ms=frame.deadline_ms,
            )
            handle = self.bus.open(call, inline_tools=frame.inline)
        except WireError as exc:
            self._refuse(link, sid, exc)
            return
        incoming = self.incoming[key] = _Incoming(handle)
        incoming.task = self.spawn(self._serve(link, sid, incoming), f"remote-call-{sid}")

    async def _checked(
        self,
        link: LinkSender,
        frame: Call,
        target: str,
        checks: SignatureWorker,
        incoming: _Incoming,
    ) -> None:
        """:meth:`on_call` with the signature checked by ``checks``: the same checks in
        the same order and the same refusals, then the call runs as there."""
        key = (link.node, frame.sid)
        try:
            call = await self.authenticator.authenticate_call_on(
                checks,
                frame.envelope,
                signature=frame.signature,
                token=frame.token,
                now_ms=now_ms(),
                target=target,
                deadline_ms=frame.deadline_ms,
            )
            incoming.handle = self.bus.open(call, inline_tools=frame.inline)
        except WireError as exc:
            self.incoming.pop(key, None)
            self._refuse(link, frame.sid, exc)
            return
        except BaseException:  # cancelled (the caller's cancel), or a bug
            self.incoming.pop(key, None)
            raise
        await self._serve(link, frame.sid, incoming)

    def _refuse(self, link: LinkSender, sid: str, error: WireError) -> None:
        """The call ends at once with ``error`` (its one frame kept to be sent again)."""
        self.tails.sent(
            link.node, sid, 1, _reply(link, sid, Frame("error", error.to_frame_data(), 1))
        )
        self.tails.ended(link.node, sid)

    async def _serve(self, link: LinkSender, sid: str, incoming: _Incoming) -> None:
        handle = incoming.handle
        assert handle is not None
        window = incoming.window

        async def emit(frame: Frame) -> None:
            while not window.open:
                try:
                    async with asyncio.timeout(ACK_TIMEOUT_S):
                        while not window.open:
                            incoming.moved.clear()
                            await incoming.moved.wait()
                except TimeoutError:
                    # a held sequence waits for the next link (its end ends the call)
                    if not self.is_held(link.node):
                        raise DeadlineExceeded("no ack over the mesh for 5 s") from None
            send(frame.with_seq(window.next_seq()))

        def send(frame: Frame) -> None:
            self.tails.sent(link.node, sid, frame.seq or 0, _reply(link, sid, frame))

        try:
            terminal = await handle.drive(emit)
            send(terminal.with_seq(window.next_seq(force=True)))
        except asyncio.CancelledError:
            handle.ctx.cancel()
        finally:
            self.incoming.pop((link.node, sid), None)
            self.tails.ended(link.node, sid)

    def on_ack(self, link: LinkSender, frame: Ack) -> None:
        """The caller side consumed frames up to ``upto``."""
        self.tails.acked(link.node, frame.sid, frame.upto)
        incoming = self.incoming.get((link.node, frame.sid))
        if incoming is not None and incoming.window.ack(frame.upto):
            incoming.moved.set()

    def on_tool_result(self, link: LinkSender, frame: ToolResult) -> None:
        """A client's tool result, forwarded along the call's path."""
        incoming = self.incoming.get((link.node, frame.sid))
        if incoming is None or incoming.handle is None:
            return
        try:
            incoming.handle.ctx.deliver_tool_result(frame.tool_call_id, frame.body)
        except WireError as exc:
            log.info("tool result from %s refused: %s", link.node, exc, extra={"peer": link.node})

    def on_cancel(self, link: LinkSender, frame: Cancel) -> None:
        """The caller cancelled (or went away): cancel the handler, its cleanup runs."""
        incoming = self.incoming.get((link.node, frame.sid))
        if incoming is not None and incoming.task is not None:
            incoming.task.cancel()
            if incoming.handle is None:  # still being checked, perhaps not yet started
                self.incoming.pop((link.node, frame.sid), None)
