"""``hearthnet peers forget NODEID|ADDRESS``: stop dialling a machine that left for good.

The address book lives in the running node (``<data_dir>/mesh/peers.json`` is its saved
copy): with the node running the command asks it (``POST /mesh/v1/peers/forget``, signed
with the node's key), so it stops dialling at once and saves the book; with the node
stopped it edits the saved book, holding the data dir's lock so that no node starts
meanwhile.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hearthnet.commands.common import (
    EXIT_OK,
    Parents,
    client_of,
    config_of,
    data_dir_of,
    existing_keys,
    run,
)
from hearthnet.commands.output import emit
from hearthnet.errors import BadRequest, NodeNotRunning


def target_arg(text: str) -> str:
    """A NodeID or a peer address (``host:port`` is ``http://host:port``), checked now."""
    from hearthnet.mesh.addresses import forget_target

    try:
        return forget_target(text)
    except BadRequest as exc:
        raise argparse.ArgumentTypeError(exc.message) from exc


def cmd_peers_forget(args: argparse.Namespace) -> int:
    """``hearthnet peers forget NODEID|ADDRESS``: forget known addresses (exit 1 when
    none matched)."""
    from hearthnet.mesh.forget import forget_notes

    if getattr(args, "url", None):
        answer = _ask_node(args)
    else:
        from hearthnet.client import find_running_node

        try:
            find_running_node(data_dir_of(args))
        except NodeNotRunning:
            answer = _edit_saved(args)
        else:
            answer = _ask_node(args)

    def for_people() -> None:
        urls = answer["forgotten"]
        print(
            f"forgot {len(urls)} address{'es' if len(urls) > 1 else ''} of {answer['target']}:"
            f" {', '.join(urls)}; no longer dialled"
        )
        for note in forget_notes(answer):
            print(f"hearthnet: note: {note}", file=sys.stderr)

    emit(args, answer, for_people)
    return EXIT_OK


def _ask_node(args: argparse.Namespace) -> Any:
    from hearthnet.mesh.forget import FORGET_PATH

    async def main() -> Any:
        async with client_of(args) as client:
            return await client.request_json("POST", FORGET_PATH, {"target": args.target})

    return run(main)


def _edit_saved(args: argparse.Namespace) -> dict[str, Any]:
    """Forget in the saved book of a stopped node (no link is up)."""
    from hearthnet.datadir import DataDirLock
    from hearthnet.mesh.addresses import PeerBook
    from hearthnet.mesh.forget import forget

    data_dir = data_dir_of(args)
    existing_keys(data_dir)  # a mistyped --data-dir is not a node that knows nobody
    mesh = config_of(args).mesh
    lock = DataDirLock(data_dir)
    lock.acquire()  # a node starting now would load the book we are editing
    try:
        book = PeerBook(data_dir / "mesh" / "peers.json")
        book.load()
        answer = forget(
            book,
            args.target,
            links={},
            configured=(*mesh.peers, *mesh.relay_urls, *mesh.relay_peers),
        )
        book.save()
    finally:
        lock.release()
    return answer


def add_forget_parser(peers: argparse.ArgumentParser, remote: Parents) -> None:
    """``hearthnet peers forget`` under ``hearthnet peers`` (which alone still lists)."""
    actions = peers.add_subparsers(dest="peers_command", required=False, metavar="[ACTION]")
    forget = actions.add_parser(
        "forget", help="forget a node's known addresses, or one address, so it is no longer dialled"
    )
    # The options of ``peers`` again, without defaults: a subcommand's defaults would
    # overwrite what was given before it (``peers --data-dir D forget X``).
    for action in (a for parent in remote for a in parent._actions if a.option_strings):
        if action.dest != "help":
            typed = {} if action.type is None else {"type": action.type}
            forget.add_argument(
                *action.option_strings,
                dest=action.dest,
                metavar=action.metavar,
                help=action.help,
                default=argparse.SUPPRESS,
                **typed,  # type: ignore[arg-type]
            )
    forget.add_argument(
        "target",
        type=target_arg,
        metavar="NODEID|ADDRESS",
        help="ed25519:... (every address of that node) or http://host:port (host:port)",
    )
    forget.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print {target, forgotten, linked, configured}",
    )
    forget.set_defaults(func=cmd_peers_forget)
