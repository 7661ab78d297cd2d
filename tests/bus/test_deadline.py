"""within_deadline: a call's deadline, armed only when its handler waits (spec §2.3)."""

from __future__ import annotations

import asyncio

import pytest

from hearthnet.bus.calls import within_deadline


async def test_a_handler_that_never_waits_needs_no_timer() -> None:
    """An answer computed at once is returned even with the deadline already passed."""

    async def at_once() -> str:
        return "answer"

    assert "answer" == await within_deadline(at_once(), lambda: -1.0)


async def test_a_handler_that_waits_is_awaited_to_its_end() -> None:
    """Bare yields, results and exceptions of what it waits for pass through as with await."""
    loop = asyncio.get_running_loop()
    value: asyncio.Future[int] = loop.create_future()
    failure: asyncio.Future[int] = loop.create_future()
    seen: list[str] = []

    async def waits() -> int:
        await asyncio.sleep(0)
        got = await value
        try:
            await failure
        except KeyError:
            seen.append("KeyError")
        return got + 1

    task = loop.create_task(within_deadline(waits(), lambda: 5.0))
    await asyncio.sleep(0)
    value.set_result(41)
    await asyncio.sleep(0)
    failure.set_exception(KeyError("x"))
    assert (42, ["KeyError"]) == (await task, seen)


async def test_a_cancel_reaches_the_waiting_handler() -> None:
    """Cancelling the task cancels the handler where it waits; its cleanup runs."""
    loop = asyncio.get_running_loop()
    cleaned: list[str] = []

    async def waits() -> None:
        try:
            await loop.create_future()
        except asyncio.CancelledError:
            cleaned.append("cancelled")
            raise

    task = loop.create_task(within_deadline(waits(), lambda: 5.0))
    for _ in range(3):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ["cancelled"] == cleaned


async def test_the_deadline_ends_a_handler_that_waits_too_long() -> None:
    """Past the deadline the handler is cancelled (its cleanup runs) and TimeoutError is raised."""
    cleaned: list[bool] = []

    async def slow() -> str:
        try:
            await asyncio.sleep(30)
        finally:
            cleaned.append(True)
        return "late"

    with pytest.raises(TimeoutError):
        await within_deadline(slow(), lambda: 0.01)
    assert [True] == cleaned


async def test_a_waiting_handler_gets_its_result() -> None:
    """A handler that waits and then answers in time returns its answer."""
    loop = asyncio.get_running_loop()

    async def answers() -> str:
        await asyncio.sleep(0)
        fut: asyncio.Future[str] = loop.create_future()
        loop.call_soon(fut.set_result, "done")
        return await fut

    assert "done" == await within_deadline(answers(), lambda: 5.0)
