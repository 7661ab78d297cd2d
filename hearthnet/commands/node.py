"""``hearthnet node start|status|stop``, ``hearthnet call`` and ``hearthnet chat``."""

from __future__ import annotations

import argparse
import gc
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hearthnet.commands.common import (
    EXIT_OK,
    Parents,
    client_of,
    config_of,
    data_dir_of,
    federation_peer_arg,
    json_arg,
    node_id_arg,
    node_url_arg,
    port_arg,
    run,
    status_of,
)
from hearthnet.commands.output import (
    add_json_flag,
    emit,
    print_fields,
    print_json,
    print_json_line,
)
from hearthnet.errors import (
    BadRequest,
    HearthNetError,
    NodeNotRunning,
    NotFound,
    Unavailable,
    UsageError,
    WireError,
)

if TYPE_CHECKING:
    from hearthnet.config import Config


def cmd_node_start(args: argparse.Namespace) -> int:
    """``hearthnet node start``: the ready line (spec §9), or with ``--json`` the same as
    one JSON object ``{"url", "node", "community", "pid"}``."""
    # No automatic collections while the node starts: what start-up makes (modules, the
    # node's parts) lives as long as the process, so the ~150 collections it would run
    # free next to nothing; collect_after_start() runs one and turns collection back on.
    # What the command line loaded (~45 % of the objects then) is frozen already: that
    # collection need not walk it.
    gc.disable()
    gc.freeze()
    try:
        _start_node(args)
    finally:
        gc.enable()  # also after a start that failed before its ready line
    return EXIT_OK


def warn_stray_environment(config: Config) -> None:
    """Log a warning for each ``HEARTHNET_*`` variable that names no key (a typo would
    otherwise be ignored without a word)."""
    import logging

    from hearthnet.config import stray_environment

    for sentence in stray_environment(config):
        logging.getLogger("hearthnet.config").warning(sentence)


def _start_node(args: argparse.Namespace) -> None:
    from hearthnet import logs
    from hearthnet.node import Node

    config = config_of(args)
    logs.configure(config.node.log_level)
    warn_stray_environment(config)

    def ready(node: Node) -> None:
        logs.configure(config.node.log_level, node.keys.node_id)
        # before the ready line: after it, this one collection would delay the first
        # requests instead
        collect_after_start()
        if args.json:
            print_json_line(
                {
                    "url": node.url,
                    "node": node.keys.node_id,
                    "community": node.membership.community_id,
                    "pid": os.getpid(),
                }
            )
        else:
            print(node.ready_line(), flush=True)

    async def main() -> None:
        await Node(config, join=args.join).serve_forever(on_ready=ready)

    run(main)


GC_YOUNG_THRESHOLD = 10_000  # allocations between collections of the youngest generation


def collect_after_start() -> None:
    """The node process's garbage collector once it is ready (spec §11: p99 of delivery).

    What start-up made (modules, configuration, keys, the membership view) lives as long as
    the process: frozen, it is no longer walked by every full collection, whose pause grew
    with it. Fan-out makes many short-lived lists and tuples per committed batch; a larger
    young generation lets most of them die before a collection looks at them, so fewer
    survive into the older generations and fewer collections run. Automatic collection,
    off while the node started, is on again from here.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)
    gc.enable()


def cmd_node_status(args: argparse.Namespace) -> int:
    """``hearthnet node status [--json]``: /status is public, so no keys are needed."""
    status = status_of(args)
    emit(args, status, lambda: print_fields(status))
    return EXIT_OK


STOP_WAIT_S = 10.0  # SIGTERM ends a node within 5 s (docs/operations.md); twice that here


def cmd_node_stop(args: argparse.Namespace) -> int:
    """``hearthnet node stop``: SIGTERM to the node running on this data dir (the PID in
    ``run/node.json``), then wait until the process is gone (``--json``: ``{"stopped",
    "pid"}``)."""
    from hearthnet.client import find_running_node

    data_dir = data_dir_of(args)
    info = find_running_node(data_dir)  # exit 3 when nothing runs there
    pid = int(info["pid"])
    run_file = data_dir / "run" / "node.json"
    if not _is_node_process(pid):
        raise NodeNotRunning(
            f"process {pid} named in {run_file} is not a hearthnet node (stale run file)"
        )
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_WAIT_S
    while _is_node_process(pid):
        if time.monotonic() > deadline:
            raise HearthNetError(
                f"node {info.get('node')} (pid {pid}) did not stop within {STOP_WAIT_S:.0f} s;"
                f" see its log, or end it with: kill -9 {pid}"
            )
        time.sleep(0.05)
    emit(
        args,
        {"stopped": info.get("node"), "pid": pid},
        lambda: print(f"stopped node {info.get('node')} (pid {pid})"),
    )
    return EXIT_OK


def _is_node_process(pid: int) -> bool:
    """``pid`` runs a ``hearthnet`` command now (not exited, not a zombie, not a PID that
    another program got since)."""
    proc = Path("/proc") / str(pid)
    try:
        stat = (proc / "stat").read_text()
        cmdline = (proc / "cmdline").read_bytes()
    except OSError:
        return False
    state = stat.rpartition(")")[2].split()[0]  # the field after the command name
    return state not in ("Z", "X") and b"hearthnet" in cmdline


async def _offered(client: Any) -> list[dict[str, Any]]:
    listed: list[dict[str, Any]] = (await client.get_json("/bus/v1/capabilities"))["capabilities"]
    return listed


async def _call_refused(client: Any, capability: str, exc: WireError) -> WireError | UsageError:
    """The error to show for a refused unary call: what to type instead when it can tell."""
    from hearthnet.client import split_capability

    name = split_capability(capability)[0]
    try:
        offered = await _offered(client)
    except WireError:
        return exc
    same = [d for d in offered if d["name"] == name]
    if isinstance(exc, BadRequest) and any(d.get("stream_schema") is not None for d in same):
        return UsageError(
            f"{capability} streams its answer: add --stream "
            f"(hearthnet call {capability} --stream --body JSON)"
        )
    if isinstance(exc, NotFound):
        keys = sorted({f"{d['name']}@{d['version']}" for d in offered})
        return NotFound(f"{exc.message}; the mesh offers: {', '.join(keys) or 'nothing'}")
    return exc


async def _target_row(client: Any, args: argparse.Namespace, exc: Unavailable) -> Any:
    """``hearthnet peers``' row of ``--target``, which the mesh had no route to; when it
    is not linked, the error to show instead of ``exc`` (what to look at)."""
    peers = (await client.request_json("GET", "/mesh/v1/peers"))["peers"]
    row = next((p for p in peers if p.get("node") == args.target and p.get("linked")), None)
    if row is None:
        raise Unavailable(
            f"{exc.message}: this node has no link to it (hearthnet peers lists the nodes "
            "it reaches; a node of a federated community only once it is linked through a "
            "relay, docs/federation.md)",
            retry_after_ms=exc.retry_after_ms,
        ) from exc
    return row


async def _call_federated(client: Any, args: argparse.Namespace, exc: Unavailable) -> Any:
    """A call the mesh has no route for, to ``--target``: when the target is a node of a
    federated community linked through a relay (``hearthnet peers``: its ``community``),
    the call is carried to it (docs/federation.md, "Through a relay"); else ``exc``."""
    from hearthnet.federation.carried_client import carried_by

    if not (await _target_row(client, args, exc)).get("community"):
        raise exc
    own = await client.http.community_id()
    async with carried_by(client, args.target, keys=client.keys, community=own) as carried:
        return await carried.call_with_meta(args.capability, args.body)


async def _stream_unrouted(client: Any, args: argparse.Namespace, exc: Unavailable) -> None:
    """A stream the mesh has no route for, to ``--target``: what to say instead."""
    if (await _target_row(client, args, exc)).get("community"):
        raise UsageError(
            f"{args.target} is a node of another community, reached through a relay: "
            "streams are not carried there yet; call it without --stream for a single answer"
        ) from exc
    raise exc


def cmd_call(args: argparse.Namespace) -> int:
    """``hearthnet call CAP --body JSON [--stream]``: the output (``--json``: ``{"output",
    "meta"}``), or with ``--stream`` each frame as a JSON line."""
    from hearthnet.client import raise_for_terminal

    async def main() -> int:
        async with client_of(args) as client:
            if not args.stream:
                try:
                    result = await client.call_with_meta(
                        args.capability, args.body, target=args.target
                    )
                except (BadRequest, NotFound) as exc:
                    raise await _call_refused(client, args.capability, exc) from exc
                except Unavailable as exc:
                    if args.target is None:
                        raise
                    result = await _call_federated(client, args, exc)
                print_json(result if args.json else result["output"])
                return EXIT_OK
            started = False  # a frame other than an error came
            try:
                async with client.stream(
                    args.capability,
                    args.body,
                    prefer_ws=not args.sse,
                    cbor=args.cbor,
                    target=args.target,
                ) as stream:
                    async for frame in stream:
                        print_json_line(frame.to_json())
                        started = started or frame.event != "error"
                        raise_for_terminal(frame)  # main() maps the error to its exit code
                    return EXIT_OK
            except Unavailable as exc:
                if started or args.target is None:
                    raise
                await _stream_unrouted(client, args, exc)
                raise

    result: int = run(main)
    return result


def cmd_chat(args: argparse.Namespace) -> int:
    """``hearthnet chat``: interactive llm.chat with tools (hearthnet.chat_cli)."""
    from hearthnet.chat_cli import chat_command

    return chat_command(args, lambda: client_of(args), run)


def add_chat_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """``hearthnet chat`` and its flags."""
    chat = sub.add_parser("chat", parents=parents, help="chat with llm.chat; tools run as you")
    chat.add_argument("-m", "--message", help="send this one message, print the answer, exit")
    chat.add_argument("--system", help="a system message to start the conversation with")
    chat.add_argument("--model", help="model name (default: the node's [llm] model)")
    chat.add_argument("--backend", choices=["openai", "demo"], help="backend on the node")
    chat.add_argument(
        "--tools", help="JSON file: more tools [{name, description, parameters, capability}]"
    )
    chat.add_argument("--no-tools", action="store_true", help="offer no built-in tools")
    chat.add_argument("--max-tokens", type=int, help="cap each model turn at this many tokens")
    chat.add_argument("--sse", action="store_true", help="use SSE re-calls instead of WebSocket")
    chat.add_argument("--json", action="store_true", help="events as JSON lines")
    chat.set_defaults(func=cmd_chat)


def add_parsers(sub: Any, local: Parents, remote: Parents) -> None:
    """``hearthnet node start|status|stop`` and ``hearthnet call``."""
    node = sub.add_parser("node", help="run and inspect the node")
    node_sub = node.add_subparsers(dest="node_command", required=True, metavar="ACTION")
    start = node_sub.add_parser("start", parents=local, help="start a node in the foreground")
    start.add_argument("--host", help="listen address (default 0.0.0.0)")
    start.add_argument("--port", type=port_arg, help="port (default 7080; 0 picks a free port)")
    start.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="JSON log lines on stderr from this level on (default info)",
    )
    start.add_argument(
        "--name",
        help="human name of this node, kept in the data dir for later starts (default: the"
        " name given last, else host name and short id, e.g. vm-kx3q)",
    )
    start.add_argument(
        "--llm-url", help="offer llm.chat from this OpenAI-compatible server (e.g. Ollama's .../v1)"
    )
    start.add_argument("--llm-model", help="model name to ask that server for")
    start.add_argument(
        "--llm-demo",
        action="store_true",
        default=None,
        help="offer llm.chat from the built-in demo model (no model server needed)",
    )
    start.add_argument(
        "--peer",
        action="append",
        type=node_url_arg,
        metavar="URL",
        help="bootstrap peer http://host:port (repeatable)",
    )
    start.add_argument("--join", metavar="TOKEN", help="join a community with an invite (hn1:...)")
    start.add_argument("--heartbeat-s", type=float, help="ping interval per peer link (default 5)")
    start.add_argument(
        "--no-zeroconf",
        dest="zeroconf",
        action="store_false",
        default=None,
        help="do not announce or browse on the LAN",
    )
    start.add_argument(
        "--advertise-url", type=node_url_arg, help="URL peers should dial to reach this node"
    )
    start.add_argument(
        "--relay",
        action="store_true",
        default=None,
        help="serve as a relay for members that cannot be dialled (spec §8)",
    )
    start.add_argument(
        "--relay-url",
        action="append",
        type=node_url_arg,
        metavar="URL",
        help="relay to attach to when peers cannot be dialled (repeatable)",
    )
    start.add_argument(
        "--relay-peer",
        action="append",
        type=node_url_arg,
        metavar="URL",
        help="with --relay: another relay to federate with; it must name this one too (repeatable)",
    )
    start.add_argument(
        "--federation-peer",
        action="append",
        type=federation_peer_arg,
        metavar="URL",
        help="a node of a federated community to bridge to: its URL, or mesh:NODEID through"
        " a relay of its community (repeatable; docs/federation.md)",
    )
    add_json_flag(start, "print the ready line as JSON {url, node, community, pid}")
    start.set_defaults(func=cmd_node_start)
    status = node_sub.add_parser("status", parents=remote, help="show the running node")
    add_json_flag(status)
    status.set_defaults(func=cmd_node_status)
    stop = node_sub.add_parser(
        "stop", parents=local, help="stop the node running on this data dir (SIGTERM, then wait)"
    )
    add_json_flag(stop)
    stop.set_defaults(func=cmd_node_stop)

    call = sub.add_parser("call", parents=remote, help="call a capability")
    call.add_argument("capability", help="NAME[@MAJOR.MINOR], e.g. echo@1.0")
    call.add_argument(
        "--body", type=json_arg, default={}, help="input as JSON ('-': read from stdin; default {})"
    )
    call.add_argument("--stream", action="store_true", help="stream frames (WS, SSE fallback)")
    call.add_argument("--sse", action="store_true", help="with --stream: use SSE, not WebSocket")
    call.add_argument("--cbor", action="store_true", help="with --stream: CBOR WebSocket frames")
    call.add_argument(
        "--target", type=node_id_arg, help="run on this NodeID (hearthnet peers lists them)"
    )
    add_json_flag(call, "print {output, meta} (with --stream: frames, one JSON object a line)")
    call.set_defaults(func=cmd_call)
