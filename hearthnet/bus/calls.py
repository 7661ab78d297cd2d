"""Running a verified call: routing, authorisation, limits, deadline, exactly one end.

:meth:`Bus.open` does every check that can refuse a call *before* anything is sent,
so HTTP can still answer with a status code; :meth:`CallHandle.drive` then runs the
provider and guarantees the stream ends with exactly one ``done`` or ``error``
(spec §2.4), whatever the handler does.
"""

from __future__ import annotations

import asyncio
import logging
import time
import types
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from hearthnet.bus.capability import CallContext
from hearthnet.bus.descriptor import CapabilityDescriptor
from hearthnet.bus.envelope import VerifiedCall
from hearthnet.bus.routing import LocalProvider, Provider, Router
from hearthnet.caller import Caller
from hearthnet.community import Level
from hearthnet.config import BusSection, LimitsSection
from hearthnet.errors import (
    DeadlineExceeded,
    Forbidden,
    InternalError,
    Unauthorized,
    WireError,
    error_from_wire,
)
from hearthnet.frames import Frame
from hearthnet.metrics import Counter, Histogram, LabelSet, MetricsRegistry
from hearthnet.ratelimit import RateLimiter

log = logging.getLogger("hearthnet.bus")

Emit = Callable[[Frame], Awaitable[None]]
T = TypeVar("T")


@types.coroutine
def _resume(coro: Coroutine[Any, Any, T], pending: Any) -> Generator[Any, Any, T]:
    """Go on awaiting ``coro``, whose first step has been taken and yielded ``pending``
    (what it waits for) to this task: the same as ``await coro`` from that point on."""
    while True:
        try:
            yield pending  # the task resumes here once what coro waits for is done
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as exc:  # a cancel (the deadline's, or the caller's)
            try:
                pending = coro.throw(exc)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            continue
        return (yield from coro)  # type: ignore[no-any-return]


async def within_deadline(coro: Coroutine[Any, Any, T], remaining_s: Callable[[], float]) -> T:
    """Await ``coro`` with a deadline ``remaining_s()`` seconds away, read when ``coro``
    first waits. A handler that finishes without waiting (echo, any answer computed at
    once) cannot be late, since no timer could fire while it runs, so it costs no timer:
    ``asyncio.timeout`` (a timer armed and cancelled on the event loop) is entered only
    around the rest of a call that waits."""
    try:
        pending = coro.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    async with asyncio.timeout(remaining_s()):
        return await _resume(coro, pending)


@dataclass(slots=True)
class BusMetrics:
    """The bus's series in ``/metrics`` (spec §9)."""

    calls: Counter
    duration: Histogram
    rate_limited: Counter
    streams_active: int = 0

    @classmethod
    def register(cls, registry: MetricsRegistry) -> BusMetrics:
        """Create the series on ``registry``."""
        metrics = cls(
            calls=registry.counter(
                "hearthnet_calls_total", "Capability calls by result.", ("capability", "result")
            ),
            duration=registry.histogram(
                "hearthnet_call_duration_seconds",
                "Capability call duration, open to end.",
                labelnames=("capability",),
            ),
            rate_limited=registry.counter(
                "hearthnet_rate_limited_total", "Requests refused by a rate limit.", ("kind",)
            ),
        )
        registry.gauge(
            "hearthnet_streams_active",
            "Streams currently running.",
            lambda: float(metrics.streams_active),
        )
        return metrics


def _refusal(caller: Caller, min_level: Level) -> str:
    """Why ``caller`` may not call a capability of ``min_level``, in words."""
    if caller.level < min_level:
        return f"it needs level {min_level.label}; this caller is {caller.level.label}"
    scopes = [s.pattern for s in caller.token.scopes if s.kind == "call"] if caller.token else []
    return f"the token's call scopes ({', '.join(scopes) or 'none'}) do not cover it"


class Bus:
    """The capability bus of one node."""

    def __init__(
        self,
        *,
        node_id: str,
        router: Router,
        limits: LimitsSection,
        bus: BusSection,
        metrics: BusMetrics,
    ) -> None:
        self.node_id = node_id
        self.router = router
        self.max_deadline_s = bus.max_deadline_s
        self.metrics = metrics
        # spec §9: calls are counted per capability, but only this node's registered
        # capabilities get their own series; any other name a caller sends is `other`
        self.capability_label = LabelSet(router.local.registry.__contains__)
        self._per_capability = RateLimiter(
            limits.calls_per_s_per_capability, max_keys=limits.rate_limit_callers_max
        )
        self._total = RateLimiter(limits.calls_per_s_total, max_keys=limits.rate_limit_callers_max)

    def open(self, call: VerifiedCall, *, inline_tools: bool) -> CallHandle:
        """Check and admit a call; the returned handle holds a concurrency slot.

        Raises (each counted in ``hearthnet_calls_total``):
            NotFound / Unavailable: no provider (or the pinned target is unreachable).
            Unauthorized: level too low or token scope does not cover the capability.
            RateLimited: over the caller's budget.
            SchemaMismatch: the input fails the request schema.
            CapacityExceeded: the provider is at ``max_concurrent``.
        """
        name = call.capability
        try:
            provider, desc = self.router.choose(name, call.version, call.target, time.monotonic())
            if not call.caller.may_call(name, desc.version, desc.min_level):
                if call.caller.kind == "federated":  # spec §8: what is not granted
                    raise Forbidden(f"{name}@{call.version} is not granted to your community")
                raise Unauthorized(
                    f"caller may not call {name}@{call.version}: "
                    + _refusal(call.caller, desc.min_level)
                )
            if call.caller.rate_limited:
                now = time.monotonic()
                try:
                    self._total.check(call.caller.identity, now)
                    self._per_capability.check((call.caller.identity, name), now)
                except WireError:
                    self.metrics.rate_limited.inc("call")
                    raise
            desc.validate_input(call.envelope.input)
            provider.acquire(desc)
        except WireError as exc:
            self.metrics.calls.inc(self.capability_label(name), exc.code)
            raise
        deadline_s = desc.timeout_s
        if call.deadline_ms is not None:
            deadline_s = min(call.deadline_ms / 1000, self.max_deadline_s)
        ctx = CallContext(
            call,
            node_id=self.node_id,
            deadline=time.monotonic() + deadline_s,
            inline_tools=inline_tools,
        )
        return CallHandle(self, call, provider, desc, ctx)


class CallHandle:
    """One admitted call. Run it once with :meth:`drive` or :meth:`result`; or
    :meth:`close` it unused (the slot is given back either way)."""

    def __init__(
        self,
        bus: Bus,
        call: VerifiedCall,
        provider: Provider,
        descriptor: CapabilityDescriptor,
        ctx: CallContext,
    ) -> None:
        self.bus = bus
        self.call = call
        self.provider = provider
        self.descriptor = descriptor
        self.ctx = ctx
        self.started = time.monotonic()
        self._closed = False

    def close(self, result: str = "unused") -> None:
        """Release the slot and record the outcome (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.provider.release(self.descriptor)
        elapsed = time.monotonic() - self.started
        metrics = self.bus.metrics
        label = self.bus.capability_label(self.call.capability)
        metrics.calls.inc(label, result)
        metrics.duration.observe(elapsed, label)
        self.bus.router.record(
            self.provider, result in ("ok", "cancelled"), elapsed, time.monotonic()
        )

    async def drive(self, emit: Emit) -> Frame:
        """Run the call, passing every non-terminal frame to ``emit``; return the one
        terminal frame (``done`` or ``error``) for the transport to send last.

        ``emit`` may block (flow control) and may raise a :class:`WireError` (an ack
        timeout, for instance), which ends the call with that error. Cancelling the task
        that runs ``drive`` cancels the handler (its cleanup runs) and propagates; the
        transport then sends ``error{cancelled}``.
        """
        metrics = self.bus.metrics
        metrics.streams_active += 1
        result = "cancelled"
        try:
            terminal = await self._run(emit)
            result = "ok" if terminal.event == "done" else str(terminal.data.get("code", "error"))
            return terminal
        finally:
            metrics.streams_active -= 1
            self.close(result)

    async def _run(self, emit: Emit) -> Frame:
        try:
            async with asyncio.timeout(self.ctx.remaining_s()):
                frames = self.provider.run(self.call, self.ctx, self.descriptor)
                try:
                    async for frame in frames:
                        if frame.terminal:
                            return frame
                        await emit(frame)
                finally:
                    await frames.aclose()  # type: ignore[attr-defined]
            return Frame("done", {"ms": int((time.monotonic() - self.started) * 1000)})
        except Exception as exc:  # every failure becomes the call's error
            return Frame("error", self._failure(exc).to_frame_data())

    def _failure(self, exc: Exception) -> WireError:
        """The wire error a call ends with when its handler raised ``exc``."""
        if isinstance(exc, TimeoutError):
            return DeadlineExceeded("the call's deadline passed")
        if isinstance(exc, WireError):
            return exc
        log.exception(
            "capability %s failed",
            self.descriptor.key,
            extra={"request_id": self.call.request_id},
            exc_info=exc,
        )
        return InternalError(f"capability failed; request id {self.call.request_id}")

    async def result(self) -> dict[str, Any]:
        """Run a unary call and return its output object.

        Raises:
            WireError: the call ended with an ``error`` frame.
        """
        if isinstance(self.provider, LocalProvider) and not self.descriptor.streaming:
            return await self._local_result(self.provider)
        outputs: list[dict[str, Any]] = []

        async def collect(frame: Frame) -> None:
            if frame.event == "output":
                outputs.append(frame.data)

        terminal = await self.drive(collect)
        if terminal.event == "error":
            raise error_from_wire(terminal.data, remote=False)
        if len(outputs) != 1:
            raise InternalError(f"{self.descriptor.key} produced {len(outputs)} outputs")
        return outputs[0]

    async def _local_result(self, provider: LocalProvider) -> dict[str, Any]:
        """:meth:`result` of a local unary call, without the frames :meth:`drive` passes
        on: the same deadline, outcomes, metrics and errors, less per-call work."""
        metrics = self.bus.metrics
        metrics.streams_active += 1
        result = "cancelled"
        try:
            try:
                output = await within_deadline(
                    provider.call_unary(self.call, self.ctx, self.descriptor), self.ctx.remaining_s
                )
            except Exception as exc:  # every failure becomes the call's error
                error = self._failure(exc)
                result = error.code
                raise error_from_wire(error.to_frame_data(), remote=False) from None
            result = "ok"
            return output
        finally:
            metrics.streams_active -= 1
            self.close(result)
