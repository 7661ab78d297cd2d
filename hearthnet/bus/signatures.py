"""Signature checks off the event loop (spec §1.4, §11): the ed25519 checks asked for in
one event-loop turn go to one worker thread together, and their outcomes come back to
the loop together.

A signed call's signature check (libsodium, ~50 µs on a quiet core, about a third of a
call's CPU) releases the GIL, so on a thread it runs beside the event loop's own work
(reading, parsing, routing, answering the other calls) on another core. Batching the
checks of one turn keeps the hand-offs (a queue put, a wake-up of the loop) to one pair
per turn instead of one per call; a turn with one check while the worker is idle (one
call at a time) checks it on the loop, where the hand-off would cost more than it saves.

Only the check moves (the JCS form of the signed object and the libsodium call): the
caller records the request id in the replay cache after it, on the loop, so the order of the checks
(membership, clock window, signature, replay) and what each refusal says are those of
:meth:`hearthnet.auth.Authenticator.authenticate_call`. Nothing is cached: every call's
signature is checked.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from typing import Any

from hearthnet.identity import verify_object

# Checks handed to the worker in one batch at most: a turn with more is split, so the
# first answers come back while the rest are checked.
MAX_BATCH = 64
_JOIN_S = 2.0  # how long close() waits for the batch being checked

_Check = tuple[str, dict[str, Any], object, "asyncio.Future[None]"]


def _outcome(node_id: str, obj: dict[str, Any], signature: object) -> Exception | None:
    try:
        verify_object(node_id, obj, signature)
    except Exception as exc:  # InvalidSignature, or a bug reported to the caller
        return exc
    return None


class SignatureWorker:
    """One worker thread checking signatures for one event loop (see the module doc)."""

    def __init__(self, max_batch: int = MAX_BATCH) -> None:
        self.max_batch = max_batch
        self._pending: list[_Check] = []
        self._queue: queue.SimpleQueue[tuple[asyncio.AbstractEventLoop, list[_Check]] | None]
        self._queue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._at_worker = 0  # batches handed to the worker and not back yet
        self._closed = False

    def check(self, node_id: str, obj: dict[str, Any], signature: object) -> asyncio.Future[None]:
        """A future that is done when ``signature`` by ``node_id`` over the JCS form of
        ``obj`` is checked: None, or :class:`~hearthnet.errors.InvalidSignature` raised
        (:func:`~hearthnet.identity.verify_object` on the worker). ``obj`` must not change
        until then."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        if self._closed:  # the node is stopping: check here
            error = _outcome(node_id, obj, signature)
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)
            return fut
        pending = self._pending
        pending.append((node_id, obj, signature, fut))
        if len(pending) == 1:
            loop.call_soon(self._flush, loop)
        elif len(pending) >= self.max_batch:
            self._flush(loop)
        return fut

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        batch = self._pending
        if not batch:
            return
        self._pending = []
        if len(batch) == 1 and not self._at_worker:
            # A lone check with the worker idle: the hand-off would cost more than the
            # overlap gains (one call at a time gets no other work done meanwhile).
            node_id, obj, signature, _ = batch[0]
            self._deliver(batch, [_outcome(node_id, obj, signature)])
            return
        self._at_worker += 1
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="hearthnet-signatures", daemon=True
            )
            self._thread.start()
        self._queue.put((loop, batch))

    def _run(self) -> None:
        """The worker thread: check each batch, hand the outcomes back to its loop."""
        while True:
            item = self._queue.get()
            if item is None:
                return
            loop, batch = item
            outcomes = [_outcome(n, m, s) for n, m, s, _ in batch]
            try:
                loop.call_soon_threadsafe(self._delivered, batch, outcomes)
            except RuntimeError:  # the loop is closed: nobody waits any more
                continue

    def close(self) -> None:
        """Stop the worker once the batches handed to it are checked; checks asked for
        after this run on the caller's thread."""
        if self._closed:
            return
        self._closed = True
        if self._pending:
            self._flush(asyncio.get_running_loop())
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(_JOIN_S)

    def _delivered(self, batch: list[_Check], outcomes: list[Exception | None]) -> None:
        """On the loop: a batch is back from the worker."""
        self._at_worker -= 1
        self._deliver(batch, outcomes)

    @staticmethod
    def _deliver(batch: list[_Check], outcomes: list[Exception | None]) -> None:
        for (_, _, _, fut), error in zip(batch, outcomes, strict=True):
            if fut.done():  # the call was cancelled (its client went away)
                continue
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)
