"""Signature checks in a child process (spec §1.4, §11): the ed25519 checks asked for in
one event-loop turn go to one checker process in batches of a few, and each batch's
outcomes come back to the loop together as soon as it is checked.

A signed call's ed25519 check (libsodium, ~50 µs on a quiet core) is a third or more of
the CPU the node spends on a call. Done in another process it runs on the other core
beside the event loop. A thread cannot do this: it needs the GIL before and after each
check, and uvloop releases and takes the GIL around every callback, so with the two
threads on two cores each check cost ~4 futex calls and context switches, more than the
check itself (docs/benchmarks-log.md, "The signature check in a process, not a thread").

The loop makes the bytes to check (the JCS form of the signed object, the public key
and the signature, so every refusal for a malformed input is the one
:func:`~hearthnet.identity.verify_object` gives) and writes a batch to the checker's
stdin; the checker (:mod:`hearthnet.bus.sigchild`, the libsodium call only) answers one
byte per check, in order, on its stdout, which the loop reads with ``add_reader``. The
caller records the request id in the replay cache after the outcome, on the loop, so the
order of the checks (membership, clock window, signature, replay) and what each refusal
says are those of :meth:`hearthnet.auth.Authenticator.authenticate_call`. Nothing is
cached: every call's signature is checked.

A lone check while nothing is at the checker (one call at a time) is made on the loop,
where the hand-off would only add latency. Bounded: at most ``max_in_flight`` checks
wait on the checker; more are made on the loop. If the checker dies or answers out of
shape, the checks it held are made on the loop and the next batch starts a new checker;
after ``MAX_STARTS`` checkers every check is made on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections import deque
from typing import Any

from hearthnet.canonical import canonicalize
from hearthnet.errors import BadRequest, InvalidSignature
from hearthnet.identity import verify_object
from hearthnet.ids import public_key_from_node_id, signature_from_str

# Checks written to the checker in one batch at most: a turn with more is split, and the
# checker answers batch by batch, so the loop answers the first calls (and their clients
# send their next ones) while the rest are checked. With one batch per turn the loop and
# the checker took turns instead of working at once (docs/benchmarks-log.md, "Bus: checks
# in batches of 4, the event loop and the checker at work together"). Batches of 2 cost
# more CPU per call; of 8, 8 connections' calls went as one batch again.
MAX_BATCH = 4
MAX_IN_FLIGHT = 1024  # checks at the checker at once; past this, checked on the loop
MAX_STARTS = 3  # checker processes started at most over the node's life
_STOP_S = 2.0  # how long close() waits for the checker to exit before killing it
_READ_BYTES = 1 << 16

_Check = tuple[str, dict[str, Any], object, "asyncio.Future[None]"]


def _outcome(node_id: str, obj: dict[str, Any], signature: object) -> Exception | None:
    try:
        verify_object(node_id, obj, signature)
    except Exception as exc:  # InvalidSignature, or a bug reported to the caller
        return exc
    return None


def _settle(fut: asyncio.Future[None], error: Exception | None) -> None:
    if fut.done():  # the call was cancelled (its client went away)
        return
    if error is None:
        fut.set_result(None)
    else:
        fut.set_exception(error)


def check_bytes(node_id: str, obj: dict[str, Any], signature: object) -> bytes:
    """What the checker checks for one signature: public key (32 bytes), signature (64),
    message length (4, big-endian) and the JCS form of ``obj``.

    Raises:
        InvalidSignature: as :func:`~hearthnet.identity.verify_object` raises it for a
            value without canonical form, a malformed signature or NodeID.
    """
    try:
        message = canonicalize(obj)
    except BadRequest as exc:
        raise InvalidSignature(f"cannot canonicalize signed object: {exc.message}") from exc
    try:
        raw = signature_from_str(signature)
        key = public_key_from_node_id(node_id)
    except BadRequest as exc:
        raise InvalidSignature(exc.message) from exc
    return key + raw + len(message).to_bytes(4, "big") + message


class SignatureWorker:
    """One checker process for one event loop (see the module doc)."""

    def __init__(self, max_batch: int = MAX_BATCH, max_in_flight: int = MAX_IN_FLIGHT) -> None:
        self.max_batch = max_batch
        self.max_in_flight = max_in_flight
        self.starts = 0
        self._pending: list[_Check] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sent: deque[list[_Check]] = deque()  # batches at the checker, in order
        self._in_flight = 0
        self._out = bytearray()  # written to the checker when its pipe takes it
        self._in = bytearray()  # read from the checker, not yet a whole answer
        self._closed = False

    @property
    def checker_pid(self) -> int | None:
        """The checker process's id; None while none runs."""
        return None if self._proc is None else self._proc.pid

    @property
    def batches_at_checker(self) -> list[int]:
        """How many checks each batch written to the checker and not yet answered holds,
        oldest first."""
        return [len(batch) for batch in self._sent]

    @property
    def busy(self) -> bool:
        """Checks are waiting for this turn's batch or at the checker."""
        return bool(self._pending or self._in_flight)

    def check(self, node_id: str, obj: dict[str, Any], signature: object) -> asyncio.Future[None]:
        """A future that is done when ``signature`` by ``node_id`` over the JCS form of
        ``obj`` is checked: None, or :class:`~hearthnet.errors.InvalidSignature` raised.
        ``obj`` must not change until then."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        if self._closed or (self.starts >= MAX_STARTS and self._proc is None):
            _settle(fut, _outcome(node_id, obj, signature))
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
        if (len(batch) == 1 and not self._in_flight) or (
            self._in_flight + len(batch) > self.max_in_flight
        ):
            # A lone check with the checker idle gains nothing from the hand-off; past
            # the bound, checks wait for nobody.
            self._on_loop(batch)
            return
        if self._proc is None and not self._start(loop):
            self._on_loop(batch)
            return
        sent: list[_Check] = []
        parts: list[bytes] = []
        for check in batch:
            try:
                parts.append(check_bytes(*check[:3]))
            except InvalidSignature as exc:
                _settle(check[3], exc)
                continue
            sent.append(check)
        if not sent:
            return
        blob = b"".join(parts)
        self._sent.append(sent)
        self._in_flight += len(sent)
        self._write(len(blob).to_bytes(4, "big") + blob)

    @staticmethod
    def _on_loop(batch: list[_Check]) -> None:
        for node_id, obj, signature, fut in batch:
            if not fut.done():
                _settle(fut, _outcome(node_id, obj, signature))

    def _start(self, loop: asyncio.AbstractEventLoop) -> bool:
        if self.starts >= MAX_STARTS:
            return False
        self.starts += 1
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "hearthnet.bus.sigchild"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
        except OSError:
            return False
        assert proc.stdin is not None
        assert proc.stdout is not None
        os.set_blocking(proc.stdin.fileno(), False)
        os.set_blocking(proc.stdout.fileno(), False)
        loop.add_reader(proc.stdout.fileno(), self._readable)
        self._proc = proc
        self._loop = loop
        return True

    def _write(self, data: bytes) -> None:
        proc = self._proc
        assert proc is not None
        assert proc.stdin is not None
        assert self._loop is not None
        if self._out:  # earlier bytes still wait for the pipe
            self._out += data
            return
        try:
            written = os.write(proc.stdin.fileno(), data)
        except BlockingIOError:
            written = 0
        except OSError:  # the checker is gone
            self._broken()
            return
        if written < len(data):
            self._out += data[written:]
            self._loop.add_writer(proc.stdin.fileno(), self._writable)

    def _writable(self) -> None:
        proc = self._proc
        assert proc is not None
        assert proc.stdin is not None
        assert self._loop is not None
        try:
            written = os.write(proc.stdin.fileno(), self._out)
        except BlockingIOError:
            return
        except OSError:
            self._broken()
            return
        del self._out[:written]
        if not self._out:
            self._loop.remove_writer(proc.stdin.fileno())

    def _readable(self) -> None:
        """Answers from the checker: 4 bytes of count, then one byte per check."""
        proc = self._proc
        assert proc is not None
        assert proc.stdout is not None
        try:
            data = os.read(proc.stdout.fileno(), _READ_BYTES)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the checker exited
            self._broken()
            return
        buf = self._in
        buf += data
        while len(buf) >= 4:
            count = int.from_bytes(buf[:4], "big")
            if len(buf) < 4 + count:
                break
            answers = bytes(buf[4 : 4 + count])
            del buf[: 4 + count]
            if not self._sent or len(self._sent[0]) != count or answers.strip(b"\0\1"):
                self._broken()  # out of shape: trust none of it
                return
            batch = self._sent.popleft()
            self._in_flight -= count
            for (_, _, _, fut), ok in zip(batch, answers, strict=True):
                _settle(fut, None if ok == 1 else InvalidSignature("signature does not verify"))

    def _broken(self) -> None:
        """The checker died or answered out of shape: it is stopped at once (not waited
        for), and what it held is checked here."""
        held = [c for batch in self._sent for c in batch]
        self._sent.clear()
        self._in_flight = 0
        if self._proc is not None:
            with contextlib.suppress(OSError):
                self._proc.kill()
        self._stop()
        self._on_loop(held)

    def _stop(self) -> None:
        """Close the pipes and reap the checker (it exits at the end of its input)."""
        proc, self._proc = self._proc, None
        self._out.clear()
        self._in.clear()
        if proc is None:
            return
        assert proc.stdin is not None
        assert proc.stdout is not None
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(proc.stdout.fileno())
            self._loop.remove_writer(proc.stdin.fileno())
        with contextlib.suppress(OSError):
            proc.stdin.close()
        try:
            proc.wait(_STOP_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(_STOP_S)
        proc.stdout.close()

    def close(self) -> None:
        """Stop the checker; checks it still held and checks asked for after this are
        made on the caller's thread."""
        if self._closed:
            return
        self._closed = True
        pending, self._pending = self._pending, []
        self._on_loop(pending)
        held = [c for batch in self._sent for c in batch]
        self._sent.clear()
        self._in_flight = 0
        self._stop()
        self._on_loop(held)
