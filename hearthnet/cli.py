"""The ``hearthnet`` command (spec §9): the argument parser and the exit codes.

The commands live in :mod:`hearthnet.commands`, one module per group; this module builds
the parser from them and maps errors to exit codes: 0 ok, 1 error, 2 usage, 3 node not
running, 4 auth failure.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from hearthnet import __version__
from hearthnet.commands import common, output
from hearthnet.commands.admin import add_parsers as _add_admin_parsers
from hearthnet.commands.bridge import add_parser as _add_bridge_parser
from hearthnet.commands.common import (
    EXIT_AUTH,
    EXIT_ERROR,
    EXIT_NOT_RUNNING,
    EXIT_OK,
    EXIT_USAGE,
    parse_duration_ms,
    url_arg,
)
from hearthnet.commands.mesh import add_parsers as _add_mesh_parsers
from hearthnet.commands.node import add_chat_parser as _add_chat_parser
from hearthnet.commands.node import add_parsers as _add_node_parsers
from hearthnet.commands.pubsub import add_parsers as _add_pubsub_parsers
from hearthnet.errors import (
    REJOIN_ADVICE,
    ConfigError,
    Expired,
    Forbidden,
    HearthNetError,
    IdentityError,
    InvalidSignature,
    NodeNotRunning,
    Revoked,
    StorageError,
    Unauthorized,
    Unavailable,
    UsageError,
    WireError,
)

__all__ = [
    "EXIT_AUTH",
    "EXIT_ERROR",
    "EXIT_NOT_RUNNING",
    "EXIT_OK",
    "EXIT_USAGE",
    "build_parser",
    "main",
    "parse_duration_ms",
]

_AUTH_ERRORS = (InvalidSignature, Unauthorized, Revoked, Expired)

# Their names from before the commands moved to hearthnet.commands, for modules that
# register a command group here and still import the shared helpers from this module.
_client, _run, _print_json = common.client_of, common.run, output.print_json
_data_dir, _config, _node_url = common.data_dir_of, common.config_of, common.node_url
_existing_keys, _local_identity = common.existing_keys, common.local_identity
_status, _submit_record = common.status_of, common.submit_record


class _Parser(argparse.ArgumentParser):
    """An argument parser whose "required: COMMAND/ACTION" error names the choices (a
    bare ``hearthnet community`` says what may follow, not only that something must)."""

    def error(self, message: str) -> NoReturn:
        for action in self._actions if message.startswith("the following arguments") else ():
            if isinstance(action, argparse._SubParsersAction) and str(action.metavar) in message:
                choices = ", ".join(action.choices)
                message += f" (one of: {choices}; {self.prog} --help says what each does)"
                break
        extra = message.partition("unrecognized arguments: ")[2]
        if extra.lstrip().startswith(("{", "[")):  # a call's JSON body given bare
            message += (
                " (a call's JSON body goes after --body: hearthnet call CAPABILITY --body '{...}')"
            )
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir",
        help="data directory (default: $HEARTHNET_DATA_DIR or ~/.local/share/hearthnet)",
    )
    common.add_argument("--config", help="TOML config file (default: <data_dir>/hearthnet.toml)")
    remote = argparse.ArgumentParser(add_help=False)
    remote.add_argument(
        "--url",
        type=url_arg,
        help="node URL, http://host:port (default: from <data_dir>/run/node.json)",
    )

    parser = _Parser(prog="hearthnet", description="HearthNet mesh node")
    parser.add_argument("--version", action="version", version=f"hearthnet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_node_parsers(sub, [common], [common, remote])
    _add_pubsub_parsers(sub, [common, remote])
    _add_chat_parser(sub, [common, remote])
    _add_bridge_parser(sub, [common, remote])
    _add_mesh_parsers(sub, [common], [common, remote])
    _add_admin_parsers(sub, [common], [common, remote])
    from hearthnet.cli_federation import add_federation_parsers  # spec §8

    add_federation_parsers(sub, [common], [common, remote])
    from hearthnet.console.cli import add_console_parser

    add_console_parser(sub, [common, remote])
    _describe(parser)
    return parser


def _describe(parser: argparse.ArgumentParser) -> None:
    """Each subcommand's ``--help`` opens with what it does (its line in the parent's
    list), unless it has a description of its own."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, child in action.choices.items():
                if child.description is None and helps.get(name):
                    child.description = helps[name]
                _describe(child)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hearthnet`` console script."""
    words = sys.argv[1:] if argv is None else list(argv)
    if words[:1] == ["--json"]:  # `hearthnet --json peers`: the flag belongs to the command
        words = [*words[1:], "--json"]
    if words[:2] == ["mesh", "health"]:
        # its own parser (shared with spark-submit); PySpark is imported only once it runs
        from spark_federation.cli import main as mesh_health

        return mesh_health(words[2:])
    parser = build_parser()
    args = parser.parse_args(words)
    try:
        code: int = args.func(args)
        return code
    except HearthNetError as exc:
        exit_code, error, message = failure(args, exc)
        output.print_error(args, error, message, sys.stderr)
        return exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader of our stdout went away (| head): not an error of ours
        with contextlib.suppress(OSError, ValueError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


_LOCAL_CODES: tuple[tuple[type[HearthNetError], str], ...] = (
    (ConfigError, "config_error"),
    (IdentityError, "identity_error"),
    (StorageError, "storage_error"),
)


def _self_signed(cause: BaseException | None) -> bool:
    """Whether a connection failed on a certificate that does not verify (aiohttp's
    certificate error carries the ``ssl`` one)."""
    import ssl

    return isinstance(getattr(cause, "certificate_error", None), ssl.SSLCertVerificationError)


def failure(args: argparse.Namespace, exc: HearthNetError) -> tuple[int, str, str]:
    """The exit code (spec §9), error code and message, saying what to do, for ``exc``.

    Wire errors keep their code (spec §2.4); errors of this machine get
    ``node_not_running``, ``usage``, ``config_error``, ``identity_error`` or
    ``storage_error``.
    """
    if isinstance(exc, NodeNotRunning):
        return EXIT_NOT_RUNNING, "node_not_running", str(exc)
    if isinstance(exc, UsageError):
        return EXIT_USAGE, "usage", str(exc)
    if isinstance(exc, Unavailable):
        cause = exc.__cause__
        if isinstance(cause, OSError) and cause.errno == errno.ECONNREFUSED:
            # nothing listens at the node's address (spec §9: exit 3, node not running)
            return (
                EXIT_NOT_RUNNING,
                "node_not_running",
                f"no node answers ({exc.message}); start one with: hearthnet node start, "
                "or pass the --url of a running node",
            )
        if _self_signed(cause):
            # https:// to a node itself: its certificate, made from its key, is for peers
            return (
                EXIT_ERROR,
                exc.code,
                f"{exc.message} (a node's own TLS certificate is for its peer links, checked"
                " against its NodeID: talk to the node with http://host:port, as its ready"
                " line prints it; https:// is for a node behind a proxy with a certificate"
                " of its own)",
            )
    as_token = getattr(args, "command", None) == "bridge" and getattr(args, "token", None)
    if isinstance(exc, _AUTH_ERRORS) and as_token:
        # it spoke as the token, not as this data dir's key
        why = {
            "expired": "the --token's lifetime is over: issue a fresh one on a member's node",
            "revoked": "the --token was revoked: issue a new one on a member's node",
        }.get(
            exc.code,
            "the node refused the --token: use a token it issued, whole, or issue one there",
        )
        return (
            EXIT_AUTH,
            exc.code,
            f"{exc.message} ({why}: hearthnet token issue --scope sub:PATTERN --ttl 1h)",
        )
    if isinstance(exc, InvalidSignature) and getattr(args, "join", None):
        return (
            EXIT_AUTH,
            exc.code,
            f"{exc.message} (give --join the whole hn1:... that hearthnet community invite"
            " printed on the inviting node, in quotes, unchanged)",
        )
    if isinstance(exc, Revoked) and hasattr(args, "url"):
        return (
            EXIT_AUTH,
            exc.code,
            f"{exc.message} (this command signs with the node key in"
            f" {common.data_dir_of(args)}, which its community revoked: that key can no"
            f" longer act in it; {REJOIN_ADVICE})",
        )
    if isinstance(exc, Unauthorized | InvalidSignature) and hasattr(args, "url"):
        data_dir = common.data_dir_of(args)
        return (
            EXIT_AUTH,
            exc.code,
            f"{exc.message} (this command signs with the node key in {data_dir}: use the "
            "--data-dir of a member of that node's community, or join it with an invite: "
            "hearthnet community invite there, then hearthnet node start --join hn1:..."
            + (
                "; a node of another community answers our members only under a federation "
                "agreement in force: hearthnet federation list)"
                if getattr(args, "url", None)
                else ")"
            ),
        )
    action = getattr(args, "community_command", None) or getattr(args, "topic_command", None)
    if isinstance(exc, Forbidden) and action in ("revoke", "level", "rules", "rotate"):
        return (
            EXIT_ERROR,
            exc.code,
            f"{exc.message} (anchors only: run it with the --data-dir of an anchor's node;"
            " hearthnet community show lists each member's level)",
        )
    if isinstance(exc, _AUTH_ERRORS):
        return EXIT_AUTH, exc.code, exc.message
    if isinstance(exc, WireError):
        retry = f" (retry after {exc.retry_after_ms} ms)" if exc.retry_after_ms else ""
        return EXIT_ERROR, exc.code, exc.message + retry
    code = next((c for cls, c in _LOCAL_CODES if isinstance(exc, cls)), "error")
    return EXIT_ERROR, code, str(exc)


if __name__ == "__main__":
    sys.exit(main())
