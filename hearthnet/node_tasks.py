"""The node's background tasks (STYLE: one composition root owns an ``asyncio.TaskGroup``;
no bare ``create_task`` without an owner): the log's flush loop, retention, the session
sweeper, the mesh, federation, and whatever those start through :meth:`NodeTasks.spawn`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

TASK_STOP_S = 2.0  # how long shutdown waits for a cancelled background task to end


class NodeTasks:
    """The task group a running node's background work belongs to."""

    def __init__(self) -> None:
        self._group: asyncio.TaskGroup | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    @property
    def running(self) -> bool:
        """Between :meth:`open` and :meth:`close`."""
        return self._group is not None

    async def open(self) -> None:
        """Enter the task group (the node is starting)."""
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        """Start a background task owned by the node's task group.

        Raises:
            RuntimeError: the node is not running.
        """
        if self._group is None:
            raise RuntimeError("the node is not running")
        task = self._group.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def cancel(self, *names: str) -> None:
        """Cancel the named background tasks and wait (bounded) until they have ended."""
        tasks = [t for t in self._tasks if t.get_name() in names]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=TASK_STOP_S)

    async def close(self) -> None:
        """Cancel every background task and leave the task group."""
        group, self._group = self._group, None
        if group is None:
            return
        for task in list(self._tasks):
            task.cancel()
        await group.__aexit__(None, None, None)
