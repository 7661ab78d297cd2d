"""``hearthnet bridge``: a node's pub/sub and call frames over stdin/stdout (docs/bridge.md).

The asyncio side of :mod:`hearthnet.bridge.frames`: one pub/sub WebSocket session carries
every pub/sub frame; each call runs through :class:`~hearthnet.client.Client` (unary calls
over HTTP, streams over WebSocket with SSE as the fallback). Back-pressure both ways:

- input: at most ``max_publishes`` publishes wait for their answer and ``max_calls`` calls
  run at once; lines behind them wait in a backlog of ``max_calls`` lines, and past that
  stdin is not read. ``cancel`` and ``tool_result`` lines skip the backlog: they answer
  running calls, which may be what the waiting lines wait for;
- output: every frame is written to stdout before the next one is read from the node, and
  deliveries are acked once written, so a reader that stops reading stops the node's
  sending at its window (the node then reports what it had to drop as a ``gap``).

End of input ends the bridge once every publish is answered and every call has ended, or
after ``drain_timeout_s``, when what is left gets an ``error`` frame (``timeout``). When
the node closes the session, every call and publish read and not answered gets an
``error`` frame (``unavailable``) before the session's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import sys
from dataclasses import dataclass
from typing import IO, Any

import orjson
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from hearthnet.bridge.frames import (
    MAX_LINE_BYTES,
    AckPacer,
    CallCommand,
    CancelCommand,
    Command,
    PublishLedger,
    PubSubCommand,
    Refusal,
    ToolResultCommand,
    error_frame,
    parse_command,
    too_long,
)
from hearthnet.client import Client, Stream, split_capability
from hearthnet.errors import (
    BadRequest,
    Cancelled,
    DeadlineExceeded,
    HearthNetError,
    Unavailable,
    WireError,
)
from hearthnet.subscription import ACK_IDLE_S, open_session

log = logging.getLogger("hearthnet.bridge")

DEFAULT_WINDOW = 1024
DEFAULT_MAX_CALLS = 16
DEFAULT_MAX_PUBLISHES = 256
DEFAULT_DRAIN_TIMEOUT_S = 30.0
CLOSE_FLUSH_S = 5.0  # how long the last lines may take to leave at the end


class _TooLong:
    """What :meth:`LineSource.readline` returns for a line over ``MAX_LINE_BYTES``."""


TOO_LONG = _TooLong()


@dataclass(frozen=True, slots=True)
class BridgeLimits:
    """The bridge's bounds (``hearthnet bridge`` flags)."""

    window: int = DEFAULT_WINDOW
    max_calls: int = DEFAULT_MAX_CALLS
    max_publishes: int = DEFAULT_MAX_PUBLISHES
    drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S
    manual_ack: bool = False


class SessionLost(HearthNetError):
    """The node closed the pub/sub session (the bridge ends; restart it to resume)."""


def _own_copy(file: IO[bytes], mode: str) -> IO[bytes]:
    """A duplicate of ``file``'s descriptor for a pipe transport, which closes what it is
    given: stdin and stdout themselves stay open for the rest of the process."""
    return os.fdopen(os.dup(file.fileno()), mode, buffering=0)


class LineSource:
    """Lines of stdin: a pipe or terminal through asyncio, a regular file (or /dev/null)
    in a thread (a file never blocks for long). :meth:`readline` returns None at the end, and
    :data:`TOO_LONG` for a line over the limit (which is skipped)."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file
        self._reader: asyncio.StreamReader | None = None

    async def open(self) -> None:
        """Attach to the event loop (a pipe, socket or terminal)."""
        fd = self.file.fileno()
        mode = os.fstat(fd).st_mode
        # A character device other than a terminal (/dev/null) is read like a file: the
        # event loop's pipe transport cannot take it (uvloop aborts the process).
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or (stat.S_ISCHR(mode) and os.isatty(fd)):
            loop = asyncio.get_running_loop()
            reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
            await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), _own_copy(self.file, "rb")
            )
            self._reader = reader

    async def readline(self) -> bytes | _TooLong | None:
        """The next line (without its newline), :data:`TOO_LONG`, or None at the end."""
        if self._reader is None:
            return await asyncio.to_thread(self._read_file_line)
        try:
            return (await self._reader.readuntil(b"\n"))[:-1]
        except asyncio.IncompleteReadError as exc:
            return exc.partial or None
        except asyncio.LimitOverrunError as exc:
            await self._reader.readexactly(exc.consumed)
            await self._skip_rest()
            return TOO_LONG

    async def _skip_rest(self) -> None:
        assert self._reader is not None
        while True:
            try:
                await self._reader.readuntil(b"\n")
                return
            except asyncio.LimitOverrunError as exc:
                await self._reader.readexactly(exc.consumed)
            except asyncio.IncompleteReadError:
                return

    def _read_file_line(self) -> bytes | _TooLong | None:
        line = self.file.readline(MAX_LINE_BYTES + 1)
        if not line:
            return None
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            while (rest := self.file.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                pass
            return TOO_LONG
        return line.rstrip(b"\n")


class LineSink:
    """Lines to stdout, one JSON object each, in order, flushed before the next frame is
    taken from the node (a pipe through asyncio, so a slow reader slows the bridge; a
    file or anything else with plain writes)."""

    def __init__(self, file: IO[bytes]) -> None:
        self.file = file
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        """Attach to the event loop (a pipe, socket or terminal)."""
        mode = os.fstat(self.file.fileno()).st_mode
        if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
            loop = asyncio.get_running_loop()
            transport, protocol = await loop.connect_write_pipe(
                asyncio.streams.FlowControlMixin, _own_copy(self.file, "wb")
            )
            self._writer = asyncio.StreamWriter(transport, protocol, None, loop)

    async def close(self) -> None:
        """Flush and let go of the pipe."""
        if self._writer is not None:
            if not self._writer.transport.is_closing():
                # bounded: a reader that stopped reading must not keep us here
                with contextlib.suppress(ConnectionError, RuntimeError, TimeoutError):
                    async with asyncio.timeout(CLOSE_FLUSH_S):
                        await self._writer.drain()
            self._writer.transport.close()
            self._writer = None

    async def write(self, frame: dict[str, Any]) -> None:
        """Write one frame; returns once the pipe has taken it.

        Raises:
            BrokenPipeError: the reader of stdout went away.
        """
        line = orjson.dumps(frame) + b"\n"
        async with self._lock:
            if self._writer is None:
                self.file.write(line)
                self.file.flush()
                return
            if self._writer.transport.is_closing():
                raise BrokenPipeError("stdout was closed")
            try:
                self._writer.write(line)
                await self._writer.drain()
            except (ConnectionResetError, RuntimeError) as exc:
                # asyncio says ConnectionResetError, uvloop RuntimeError ("handler is closed")
                raise BrokenPipeError("stdout was closed") from exc


class Bridge:
    """One bridge between a script's pipes and a node."""

    def __init__(self, client: Client, out: LineSink, limits: BridgeLimits) -> None:
        self.client = client
        self.out = out
        self.limits = limits
        self.ledger = PublishLedger()
        self.pacer = AckPacer(limits.window)
        self._answered = asyncio.Event()
        self._calls: dict[str, asyncio.Task[None]] = {}
        self._streams: dict[str, Stream] = {}
        # lines read while calls wait for a slot: cancel and tool_result lines pass them
        self._backlog: asyncio.Queue[tuple[int, Command | Refusal] | None] = asyncio.Queue(
            limits.max_calls
        )
        self._waiting: dict[str, list[CallCommand]] = {}  # calls in the backlog, by id
        self._dropped: set[int] = set()  # id() of waiting calls cancelled before they ran
        self._slot_freed = asyncio.Event()
        self._held: dict[str, Any] | None = None  # a publish waiting for max_publishes
        self._streaming: dict[str, bool] | None = None
        self._ws: ClientConnection | None = None
        self._closing = False
        self._ending: WireError | None = None  # why running calls are cancelled, if not asked

    async def run(self, lines: LineSource) -> int:
        """Open the session, carry frames until the end of input and the drain; the exit
        code (0: everything answered, 1: the drain timed out or the node went away).

        Raises:
            Unavailable, WireError: the session could not be opened (no node, refused).
        """
        ws, accepted = await open_session(self.client, self.limits.window)
        self._ws = ws
        loop = asyncio.get_running_loop()
        reader = loop.create_task(self._read_session(ws))
        work = loop.create_task(self._work(lines, accepted))
        try:
            await asyncio.wait({reader, work}, return_when=asyncio.FIRST_COMPLETED)
            if reader.done():
                work.cancel()
                reader.result()  # SessionLost (the node closed the session), or a bug
                return 1
            drained = work.result()
            if not self.limits.manual_ack:
                await self._ack(self.pacer.idle())
            return 0 if drained else 1
        except SessionLost as exc:
            work.cancel()
            await asyncio.wait({work})  # nothing more is read or sent
            self._ending = Unavailable(f"no answer: {exc}")
            for ref in self.ledger.refs():  # sent, perhaps published: the node did not say
                await self.out.write(error_frame(self._ending, ref=ref))
            await self._drop_backlog(Unavailable(f"not sent: {exc}"))
            await self.out.write(error_frame(Unavailable(str(exc))))
            return 1
        finally:
            self._closing = True
            work.cancel()
            await self._close(ws, reading=not reader.done())
            with contextlib.suppress(asyncio.CancelledError, SessionLost, BrokenPipeError):
                await reader
            await self._end_calls()

    @staticmethod
    async def _close(ws: ClientConnection, *, reading: bool) -> None:
        """Close the session; quickly when nothing reads it any more (stdout went away):
        its unread frames would hold back the node's close frame."""
        try:
            async with asyncio.timeout(CLOSE_FLUSH_S if reading else 0.5):
                await ws.close()
        except TimeoutError:
            ws.transport.abort()

    async def _work(self, lines: LineSource, accepted: dict[str, Any]) -> bool:
        """Say the session is open, carry the script's lines, then drain."""
        await self.out.write({"event": "auth.ok", "data": accepted})
        loop = asyncio.get_running_loop()
        handler = loop.create_task(self._handle_commands())
        reading = loop.create_task(self._read_commands(lines))
        try:
            await asyncio.wait({handler, reading}, return_when=asyncio.FIRST_COMPLETED)
            if handler.done():
                handler.result()  # SessionLost, or a bug: it only ends after the input
            reading.result()
            deadline = loop.time() + self.limits.drain_timeout_s
            await self._backlog.put(None)
            await asyncio.wait({handler}, timeout=self.limits.drain_timeout_s)
            if handler.done():
                handler.result()
                return await self._drain(deadline)
        finally:
            handler.cancel()
            reading.cancel()
        await self._drain(deadline)
        await self._drop_backlog(
            DeadlineExceeded(
                f"not sent within the bridge's drain time ({self.limits.drain_timeout_s:g} s)"
            )
        )
        return False

    # --- input ----------------------------------------------------------------------

    async def _read_commands(self, lines: LineSource) -> None:
        """Read lines: a cancel or tool_result acts at once (it must reach a running call
        even while calls wait for a slot); anything else joins the backlog, in order, and
        when the backlog is full (``max_calls`` lines) stdin waits."""
        number = 0
        while (raw := await lines.readline()) is not None:
            number += 1
            if isinstance(raw, bytes) and not raw.strip():
                continue
            command = too_long(number) if isinstance(raw, _TooLong) else parse_command(raw, number)
            if isinstance(command, ToolResultCommand):
                await self._tool_result(command, number)
            elif isinstance(command, CancelCommand):
                await self._cancel(command, number)
            else:
                if isinstance(command, CallCommand):
                    self._waiting.setdefault(command.id, []).append(command)
                await self._backlog.put((number, command))

    async def _handle_commands(self) -> None:
        """The backlog, in order, until its end (None)."""
        while (item := await self._backlog.get()) is not None:
            number, command = item
            if isinstance(command, Refusal):
                await self.out.write(command.frame)
            elif isinstance(command, PubSubCommand):
                await self._send_pubsub(command.frame)
            elif isinstance(command, CallCommand):
                await self._start_call(command, number)

    async def _send_pubsub(self, frame: dict[str, Any]) -> None:
        assert self._ws is not None
        if frame["type"] == "publish":
            self._held = frame
            while self.ledger.outstanding >= self.limits.max_publishes:
                self._answered.clear()
                await self._answered.wait()
            self._held = None
            frame = self.ledger.sending(frame)
        try:
            await self._ws.send(orjson.dumps(frame).decode())
        except ConnectionClosed as exc:
            raise SessionLost("the node closed the session") from exc

    async def _start_call(self, command: CallCommand, line: int) -> None:
        while len(self._calls) >= self.limits.max_calls and id(command) not in self._dropped:
            self._slot_freed.clear()
            await self._slot_freed.wait()
        waiting = [c for c in self._waiting[command.id] if c is not command]
        if waiting:
            self._waiting[command.id] = waiting
        else:
            del self._waiting[command.id]
        if id(command) in self._dropped:
            self._dropped.discard(id(command))  # cancelled while it waited: answered then
            return
        if command.id in self._calls:
            await self.out.write(
                error_frame(
                    BadRequest("a call with this id is running"), call=command.id, line=line
                )
            )
            return
        task = asyncio.get_running_loop().create_task(self._call(command))
        self._calls[command.id] = task

    async def _tool_result(self, command: ToolResultCommand, line: int) -> None:
        stream = self._streams.get(command.call)
        try:
            if stream is None:
                raise BadRequest("no streaming call with this id is running")
            await stream.send_tool_result(command.tool_call_id, command.body)
        except (WireError, ConnectionClosed) as exc:
            error = exc if isinstance(exc, WireError) else Unavailable("the call's stream closed")
            await self.out.write(error_frame(error, call=command.call, line=line))

    async def _cancel(self, command: CancelCommand, line: int) -> None:
        stream = self._streams.get(command.call)
        task = self._calls.get(command.call)
        if stream is not None:
            await stream.cancel()  # the node ends the stream with error{cancelled}
        elif task is not None:
            task.cancel()  # a unary call: its task writes error{cancelled}
        elif waiting := [
            c for c in self._waiting.get(command.call, []) if id(c) not in self._dropped
        ]:
            self._dropped.add(id(waiting[0]))  # it never runs
            self._slot_freed.set()
            await self.out.write(
                error_frame(Cancelled("cancelled before it ran"), call=command.call)
            )
        else:
            await self.out.write(
                error_frame(
                    BadRequest("no call with this id is running"), call=command.call, line=line
                )
            )

    # --- calls ----------------------------------------------------------------------

    async def _call(self, command: CallCommand) -> None:
        try:
            streaming = command.stream
            if streaming is None:
                streaming = await self._streams_answer(command.capability)
            if streaming:
                await self._stream(command)
            else:
                result = await self.client.call_with_meta(
                    command.capability,
                    command.input,
                    params=command.params,
                    target=command.target,
                    deadline_ms=command.deadline_ms,
                )
                await self.out.write(
                    {"event": "output", "data": result["output"], "call": command.id}
                )
                await self.out.write({"event": "done", "data": result["meta"], "call": command.id})
        except asyncio.CancelledError:
            with contextlib.suppress(BrokenPipeError):
                error = self._ending or Cancelled("cancelled")
                await self.out.write(error_frame(error, call=command.id))
        except WireError as exc:
            with contextlib.suppress(BrokenPipeError):
                await self.out.write(error_frame(exc, call=command.id))
        except BrokenPipeError:
            pass  # stdout went away: nobody is left to tell; the bridge is ending
        finally:
            self._calls.pop(command.id, None)
            self._streams.pop(command.id, None)
            self._slot_freed.set()

    async def _stream(self, command: CallCommand) -> None:
        async with self.client.stream(
            command.capability,
            command.input,
            params=command.params,
            target=command.target,
            deadline_ms=command.deadline_ms,
        ) as stream:
            self._streams[command.id] = stream
            async for frame in stream:
                # acks go out as frames are read, and a frame is read once the last one
                # is written: the node's window (16) paces the stream to stdout
                await self.out.write({**frame.to_json(), "call": command.id})

    async def _streams_answer(self, capability: str) -> bool:
        """Whether the capability streams, by the mesh's descriptors (asked once)."""
        if self._streaming is None:
            offered = await self.client.get_json("/bus/v1/capabilities")
            self._streaming = {
                d["name"]: d.get("stream_schema") is not None for d in offered["capabilities"]
            }
        return self._streaming.get(split_capability(capability)[0], False)

    async def _end_calls(self) -> None:
        tasks = list(self._calls.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    # --- output ---------------------------------------------------------------------

    async def _read_session(self, ws: ClientConnection) -> None:
        """Frames from the node, written out in order; deliveries acked once written."""
        try:
            while True:
                raw = await self._recv(ws)
                frame = orjson.loads(raw)
                shown, answer = self.ledger.answered(frame)
                if answer:
                    self._answered.set()
                await self.out.write(shown)
                seq = frame.get("seq")
                if frame.get("event") == "message" and isinstance(seq, int):
                    if not self.limits.manual_ack:
                        await self._ack(self.pacer.wrote(seq))
                elif frame.get("event") == "auth.expiring" and self.client.token is not None:
                    auth = {"type": "auth", **await self.client.session_auth()}
                    await ws.send(orjson.dumps(auth).decode())
        except ConnectionClosed as exc:
            if self._closing:
                return
            code = exc.rcvd.code if exc.rcvd is not None else 1006
            reason = exc.rcvd.reason if exc.rcvd is not None else ""
            raise SessionLost(
                f"the node closed the session ({code}{': ' + reason if reason else ''}); "
                "restart the bridge and subscribe with since: {epoch, seq} to resume"
            ) from exc

    async def _recv(self, ws: ClientConnection) -> str | bytes:
        """The next frame; if none comes at once, ack what was written first."""
        if self.limits.manual_ack or not self.pacer.unacked:
            return await ws.recv()
        try:
            async with asyncio.timeout(ACK_IDLE_S):
                return await ws.recv()  # cancelling recv() loses nothing (websockets docs)
        except TimeoutError:
            await self._ack(self.pacer.idle())
        return await ws.recv()

    async def _ack(self, upto: int | None) -> None:
        if upto is not None and self._ws is not None:
            with contextlib.suppress(ConnectionClosed):
                await self._ws.send(b'{"type":"ack","upto":%d}'.decode() % upto)

    # --- end ------------------------------------------------------------------------

    async def _drop_backlog(self, error: WireError) -> None:
        """Lines read and never sent (the drain timed out, or the node went away, while
        calls waited for a slot or publishes for answers): each call and publish there gets
        ``error`` with its call id or ref."""
        publishes = [self._held] if self._held is not None else []
        while not self._backlog.empty():
            item = self._backlog.get_nowait()
            if item is not None and isinstance(item[1], PubSubCommand):
                publishes += [item[1].frame] if item[1].frame["type"] == "publish" else []
        for frame in publishes:
            ref = frame.get("ref")
            await self.out.write(error_frame(error, ref=ref if isinstance(ref, str) else None))
        for waiting in self._waiting.values():
            for call in waiting:
                if id(call) not in self._dropped:
                    await self.out.write(error_frame(error, call=call.id))

    async def _drain(self, deadline: float) -> bool:
        """After the end of input: wait until ``deadline`` for every publish to be answered
        and every call to end; what is left then gets an ``error{timeout}`` frame."""
        loop = asyncio.get_running_loop()
        while self.ledger.outstanding and loop.time() < deadline:
            self._answered.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, deadline - loop.time())):
                    await self._answered.wait()
        calls = list(self._calls.values())
        if calls:
            await asyncio.wait(calls, timeout=max(0.0, deadline - loop.time()))
        late_calls = [call_id for call_id, task in self._calls.items() if not task.done()]
        late_refs = self.ledger.refs()
        timeout = DeadlineExceeded(
            f"not answered within the bridge's drain time ({self.limits.drain_timeout_s:g} s)"
        )
        for ref in late_refs:
            await self.out.write(error_frame(timeout, ref=ref))
        self._ending = DeadlineExceeded(
            f"not done within the bridge's drain time ({self.limits.drain_timeout_s:g} s)"
        )
        late = [self._calls[call_id] for call_id in late_calls]
        for task in late:
            task.cancel()  # each writes its error{timeout}
        if late:
            await asyncio.wait(late, timeout=5)
        return not late_refs and not late_calls


async def run_bridge(client: Client, limits: BridgeLimits) -> int:
    """``hearthnet bridge`` on this process's stdin and stdout; the exit code."""
    lines = LineSource(sys.stdin.buffer)
    out = LineSink(sys.stdout.buffer)
    try:
        await lines.open()
        await out.open()
        async with client:
            return await Bridge(client, out, limits).run(lines)
    finally:
        await out.close()
        for stream in (sys.stdin, sys.stdout):
            # the pipe transports made them non-blocking; stderr may share stdout's pipe
            with contextlib.suppress(OSError, ValueError):
                os.set_blocking(stream.fileno(), True)
