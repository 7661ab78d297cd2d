"""``hearthnet bridge``: pub/sub and call frames as JSON lines over stdin and stdout."""

from __future__ import annotations

import argparse
from typing import Any

from hearthnet.commands.common import Parents, client_of, node_url, run
from hearthnet.commands.output import STREAM_JSON_HELP, add_json_flag


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"not a positive integer: {text!r}")
    return value


def _window(text: str) -> int:
    value = _positive(text)
    if value > 65536:  # spec §3.6
        raise argparse.ArgumentTypeError(f"a window is 1..65536, not {value}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise argparse.ArgumentTypeError(f"not a number of seconds >= 0: {text!r}")
    return value


def cmd_bridge(args: argparse.Namespace) -> int:
    """``hearthnet bridge``: until the end of stdin and the answers to what it asked."""
    from hearthnet.bridge.session import BridgeLimits, run_bridge
    from hearthnet.client import Client

    limits = BridgeLimits(
        window=args.window,
        max_calls=args.max_calls,
        max_publishes=args.max_publishes,
        drain_timeout_s=args.drain_timeout,
        manual_ack=args.manual_ack,
    )
    client = Client(node_url(args), token=args.token) if args.token else client_of(args)

    async def main() -> int:
        return await run_bridge(client, limits)

    code: int = run(main)
    return code


def add_parser(sub: Any, remote: Parents) -> None:
    """``hearthnet bridge`` and its flags."""
    bridge = sub.add_parser(
        "bridge",
        parents=remote,
        help="drive the node from any language: JSON frames on stdin, JSON frames on stdout",
        description="One JSON object per line each way: the pub/sub WebSocket frames "
        "(subscribe, publish, ack, ...) and call, tool_result and cancel frames in; the "
        "node's frames out. See docs/bridge.md.",
    )
    bridge.add_argument("--token", help="act as this capability token (hnt1:...), not the node")
    bridge.add_argument(
        "--window",
        type=_window,
        default=1024,
        help="deliveries in flight before an ack (1..65536, default 1024)",
    )
    bridge.add_argument(
        "--manual-ack",
        action="store_true",
        help="never ack deliveries: the script sends {type: ack, upto: seq} (at-least-once)",
    )
    bridge.add_argument(
        "--max-calls", type=_positive, default=16, help="calls running at once (default 16)"
    )
    bridge.add_argument(
        "--max-publishes",
        type=_positive,
        default=256,
        help="publishes waiting for their answer before stdin is read further (default 256)",
    )
    bridge.add_argument(
        "--drain-timeout",
        type=_seconds,
        default=30.0,
        help="at the end of stdin, seconds to wait for answers and calls (default 30)",
    )
    add_json_flag(bridge, STREAM_JSON_HELP)
    bridge.set_defaults(func=cmd_bridge)
