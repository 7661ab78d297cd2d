"""``hearthnet console``: print a login URL for the running node's console (like Jupyter's).

The URL carries a short-lived console token (:mod:`hearthnet.console.access`) in its
fragment (``/#token=hnt1:...``), which browsers do not send to servers or put in
``Referer``; the page trades it at once for a session token and drops it from the
address bar. Needs the node's keys, so it runs on the node's machine (as its user).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

from hearthnet.clock import now_ms
from hearthnet.commands.output import add_json_flag, print_json
from hearthnet.config import default_data_dir
from hearthnet.console.access import LOGIN_TTL_MS
from hearthnet.errors import IdentityError, NodeNotRunning, Unavailable

_STATUS_TIMEOUT_S = 5.0


def add_console_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
    """Add ``hearthnet console`` to the subcommands (``parents``: --data-dir, --url...)."""
    console = sub.add_parser(
        "console", parents=parents, help="print a login URL for the node's web console"
    )
    console.add_argument(
        "--ttl-min",
        type=int,
        default=LOGIN_TTL_MS // 60_000,
        help=f"minutes the login URL stays valid (default {LOGIN_TTL_MS // 60_000})",
    )
    add_json_flag(console)
    console.set_defaults(func=cmd_console)


def _status(url: str) -> dict[str, Any]:
    """The node's public ``/status`` (for its community, when only --url is known)."""
    try:
        with urllib.request.urlopen(  # noqa: S310 - the operator's own node URL
            url.rstrip("/") + "/status", timeout=_STATUS_TIMEOUT_S
        ) as resp:
            status: dict[str, Any] = json.loads(resp.read())
    except OSError as exc:
        if isinstance(getattr(exc, "reason", exc), ConnectionRefusedError):
            # as every command: nothing listens there, exit 3
            raise NodeNotRunning(
                f"no node answers at {url}; start one with: hearthnet node start, or pass"
                " the --url of a running node"
            ) from exc
        raise Unavailable(f"cannot reach {url}: {exc}") from exc
    return status


def cmd_console(args: argparse.Namespace) -> int:
    """Issue a console login token with the node's key and print the URL that uses it."""
    from hearthnet.client import find_running_node
    from hearthnet.console.access import login_token
    from hearthnet.identity import load_or_create_keys
    from hearthnet.issued_tokens import IssuedTokens
    from hearthnet.tokens import CapabilityToken

    data_dir = Path(args.data_dir).expanduser() if args.data_dir else default_data_dir()
    if not (data_dir / "keys").exists():
        raise IdentityError(
            f"no keys in {data_dir}: run this on the node's machine, with its --data-dir"
        )
    keys = load_or_create_keys(data_dir)
    if getattr(args, "url", None):
        url = str(args.url).rstrip("/")
        status = _status(url)
        node, community = status["node"], status["community"]
    else:
        info = find_running_node(data_dir)
        url, node, community = str(info["url"]).rstrip("/"), info["node"], info["community"]
    if node != keys.node_id:
        raise IdentityError(f"{url} is node {node}, not the one whose keys are in {data_dir}")
    ttl_min = max(1, args.ttl_min)
    now = now_ms()
    token = login_token(keys, community, now, ttl_ms=ttl_min * 60_000)
    # recorded as every token this node issues (token list; its session keeps the jti)
    IssuedTokens(data_dir).record(CapabilityToken.decode(token), "console", now)
    login = f"{url}/#token={token}"
    if args.json:
        print_json({"url": login, "node": node, "valid_min": ttl_min})
        return 0
    print(login)
    print(f"open the URL above within {ttl_min} min to log in to the console", file=sys.stderr)
    return 0
