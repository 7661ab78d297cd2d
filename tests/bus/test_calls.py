"""Running calls through the bus: checks before anything is sent, exactly one end (spec §2.4)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from capabilities.echo import Echo, EchoStream
from hearthnet.auth import Authenticator
from hearthnet.bus.calls import Bus, BusMetrics
from hearthnet.bus.capability import CallContext
from hearthnet.bus.descriptor import CapabilityDescriptor
from hearthnet.bus.envelope import VerifiedCall
from hearthnet.bus.registry import CapabilityRegistry
from hearthnet.bus.routing import LocalProvider, Router
from hearthnet.community import Level
from hearthnet.config import BusSection, LimitsSection
from hearthnet.errors import (
    InvalidSignature,
    NotFound,
    RateLimited,
    SchemaMismatch,
    Unauthorized,
    WireError,
)
from hearthnet.frames import Frame
from hearthnet.identity import KeyPair
from hearthnet.ids import new_ulid
from hearthnet.membership import Membership
from hearthnet.metrics import MetricsRegistry
from hearthnet.replay import ReplayCache
from hearthnet.tokens import CapabilityToken, Scope

NODE = KeyPair.from_seed(b"\x20" * 32)
MEMBER = KeyPair.from_seed(b"\x21" * 32)


class Broken:
    """A streaming capability that crashes after one frame."""

    descriptor = CapabilityDescriptor(name="broken", version="1.0", stream_schema={})

    async def stream(self, ctx: CallContext, value: Any) -> AsyncIterator[Frame]:
        """One token, then a bug."""
        yield Frame("token", {"text": "a"})
        raise ZeroDivisionError("bug")


class Anchored:
    """A capability only anchors may call."""

    descriptor = CapabilityDescriptor(name="admin", version="1.0", min_level=Level.ANCHOR)

    async def call(self, ctx: CallContext, value: Any) -> dict[str, Any]:
        """Nothing."""
        return {}


class Unary:
    """A unary capability whose input picks a failure: crash, a list, or too slow."""

    descriptor = CapabilityDescriptor(name="unary", version="1.0")

    async def call(self, ctx: CallContext, value: Any) -> Any:
        """``crash`` raises, ``list`` returns a non-object, ``slow`` outlives its deadline."""
        if value == "crash":
            raise ZeroDivisionError("bug")
        if value == "slow":
            await asyncio.sleep(30)
        return [] if value == "list" else {"ok": value}


def setup(limits: LimitsSection | None = None) -> tuple[Bus, Authenticator, MetricsRegistry]:
    """A bus with echo, echo.stream, broken and admin, and MEMBER in the community."""
    view = Membership(NODE.node_id)
    view.add(view.sign(NODE, "community.created", NODE.node_id, now_ms=1))
    view.add(view.sign(NODE, "member.added", MEMBER.node_id, now_ms=2))
    reg = CapabilityRegistry()
    for cap in (Echo(), EchoStream(), Broken(), Anchored(), Unary()):
        reg.register(cap)
    metrics = MetricsRegistry()
    bus = Bus(
        node_id=NODE.node_id,
        router=Router(LocalProvider(NODE.node_id, reg)),
        limits=limits or LimitsSection(),
        bus=BusSection(),
        metrics=BusMetrics.register(metrics),
    )
    auth = Authenticator(node_id=NODE.node_id, membership=view, replay=ReplayCache())
    return bus, auth, metrics


def verified(
    auth: Authenticator, keys: KeyPair, cap: str, value: Any, version: str = "1.0", **kw: Any
) -> VerifiedCall:
    """Sign and verify a call."""
    now = int(time.time() * 1000)
    env = {
        "body": {"input": value},
        "capability": cap,
        "version": version,
        "request_id": new_ulid(),
        "from": keys.node_id,
        "community": NODE.node_id,
        "ts": now,
    }
    return auth.authenticate_call(
        env, signature=keys.sign_object(env), token=None, now_ms=now, **kw
    )


async def test_unary_call_returns_output() -> None:
    """echo answers {"echo": input}."""
    bus, auth, _ = setup()
    handle = bus.open(verified(auth, MEMBER, "echo", {"a": [1]}), inline_tools=False)
    assert {"echo": {"a": [1]}} == await handle.result()


async def test_stream_ends_with_exactly_one_done() -> None:
    """echo.stream yields count tokens and one done, nothing after."""
    bus, auth, _ = setup()
    frames: list[Frame] = []

    async def emit(frame: Frame) -> None:
        frames.append(frame)

    terminal = await bus.open(
        verified(auth, MEMBER, "echo.stream", {"count": 3}), inline_tools=True
    ).drive(emit)
    assert (["token"] * 3, [1, 2, 3], Frame("done", {"count": 3})) == (
        [f.event for f in frames],
        [f.data["i"] for f in frames],
        terminal,
    )


async def test_handler_crash_becomes_internal_error_frame() -> None:
    """A crashing handler ends its stream with error{internal_error}; the bus goes on."""
    bus, auth, metrics = setup()

    async def emit(frame: Frame) -> None:
        pass

    terminal = await bus.open(verified(auth, MEMBER, "broken", None), inline_tools=True).drive(emit)
    assert ("error", "internal_error", 1.0) == (
        terminal.event,
        terminal.data["code"],
        metrics.counter("hearthnet_calls_total", "", ("capability", "result")).get(
            "broken", "internal_error"
        ),
    )


async def test_deadline_ends_stream_with_timeout() -> None:
    """A stream past its deadline ends with error{timeout}."""
    bus, auth, _ = setup()

    async def emit(frame: Frame) -> None:
        pass

    call = verified(auth, MEMBER, "echo.stream", {"count": 1000, "interval_ms": 10}, deadline_ms=50)
    terminal = await bus.open(call, inline_tools=True).drive(emit)
    assert ("error", "timeout") == (terminal.event, terminal.data["code"])


async def test_local_unary_failures_end_as_a_stream_would() -> None:
    """A local unary call's result() raises what its error frame would carry, counts the
    outcome and gives the slot back: crash and non-object output are internal_error, a
    passed deadline is timeout."""
    bus, auth, metrics = setup()
    codes = []
    for value, deadline in (("crash", None), ("list", None), ("slow", 50), ("fine", None)):
        call = verified(auth, MEMBER, "unary", value, deadline_ms=deadline)
        try:
            await bus.open(call, inline_tools=False).result()
        except WireError as exc:
            codes.append(exc.code)
    calls = metrics.counter("hearthnet_calls_total", "", ("capability", "result"))
    assert (["internal_error", "internal_error", "timeout"], 2.0, 1.0, 1.0, 0) == (
        codes,
        calls.get("unary", "internal_error"),
        calls.get("unary", "timeout"),
        calls.get("unary", "ok"),
        bus.router.local.in_flight["unary@1.0"],
    )


async def test_cancelling_the_driver_runs_handler_cleanup() -> None:
    """Cancelling the task that drives a stream cancels the handler and frees its slot."""
    bus, auth, _ = setup()
    started = asyncio.Event()

    async def emit(frame: Frame) -> None:
        started.set()

    handle = bus.open(
        verified(auth, MEMBER, "echo.stream", {"count": 1000, "interval_ms": 50}), inline_tools=True
    )
    task = asyncio.get_running_loop().create_task(handle.drive(emit))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert 0 == bus.router.local.in_flight["echo.stream@1.0"]


async def test_checks_before_anything_runs() -> None:
    """Level, token scope and schema are refused at open()."""
    bus, auth, _ = setup()
    with pytest.raises(Unauthorized):
        bus.open(verified(auth, MEMBER, "admin", None), inline_tools=False)
    with pytest.raises(SchemaMismatch):
        bus.open(verified(auth, MEMBER, "echo.stream", {"count": "lots"}), inline_tools=False)
    token = CapabilityToken.issue(
        MEMBER,
        community=NODE.node_id,
        scopes=[Scope.parse("call:echo")],
        ttl_ms=60_000,
        now_ms=int(time.time() * 1000),
    )
    env = {
        "body": {"input": {}},
        "capability": "echo.stream",
        "version": "1.0",
        "request_id": new_ulid(),
        "community": NODE.node_id,
        "ts": 0,
    }
    call = auth.authenticate_call(
        env, signature=None, token=token.encode(), now_ms=int(time.time() * 1000)
    )
    with pytest.raises(Unauthorized):
        bus.open(call, inline_tools=False)
    with pytest.raises(InvalidSignature):
        auth.authenticate_call(
            env, signature=None, token=token.encode()[:-4] + "AAAA", now_ms=int(time.time() * 1000)
        )


async def test_rate_limit_per_capability_but_not_for_the_node_itself() -> None:
    """A member over its per-capability budget gets rate_limited; the node's own key does not."""
    bus, auth, metrics = setup(LimitsSection(calls_per_s_per_capability=3))
    for _ in range(3):
        bus.open(verified(auth, MEMBER, "echo", 1), inline_tools=False).close()
    with pytest.raises(RateLimited) as info:
        bus.open(verified(auth, MEMBER, "echo", 1), inline_tools=False)
    assert info.value.retry_after_ms is not None
    assert info.value.retry_after_ms > 0
    for _ in range(10):
        bus.open(verified(auth, NODE, "echo", 1), inline_tools=False).close()
    assert 1.0 == metrics.counter("hearthnet_rate_limited_total", "", ("kind",)).get("call")


async def test_calls_are_labelled_by_registered_capability_or_other() -> None:
    """Calls for names this node does not offer count under `other`, so invented names
    add no series; offered ones keep their name in the counter and the histogram."""
    bus, auth, metrics = setup()
    await bus.open(verified(auth, MEMBER, "echo", 1), inline_tools=False).result()
    for n in range(5):
        with pytest.raises(NotFound):
            bus.open(verified(auth, MEMBER, f"made.up.{n}", 1), inline_tools=False)
    calls = metrics.counter("hearthnet_calls_total", "", ("capability", "result"))
    duration = metrics.histogram("hearthnet_call_duration_seconds", "")
    assert ({("echo", "ok"): 1.0, ("other", "not_found"): 5.0}, [("echo",)]) == (
        calls.values,
        list(duration.series),
    )
