"""``hearthnet keys show``, ``hearthnet config show`` and ``hearthnet topic rotate``
(``hearthnet token ...`` is in :mod:`hearthnet.commands.tokens`)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from hearthnet.clock import now_ms
from hearthnet.commands.common import (
    EXIT_OK,
    Parents,
    config_of,
    data_dir_of,
    existing_keys,
    pattern_arg,
    submit_record,
)
from hearthnet.commands.output import add_json_flag, emit, print_fields
from hearthnet.commands.tokens import add_token_parsers
from hearthnet.config import Config, sections, stray_environment, to_toml


def cmd_keys_show(args: argparse.Namespace) -> int:
    """``hearthnet keys show``: NodeID and short id (never the private seed)."""
    data_dir = data_dir_of(args)
    keys = existing_keys(data_dir)
    info = {
        "node": keys.node_id,
        "short_id": keys.short_id,
        "seed_file": str(data_dir / "keys" / "node.ed25519"),
    }
    emit(args, info, lambda: print_fields(info))
    return EXIT_OK


def cmd_config_show(args: argparse.Namespace) -> int:
    """``hearthnet config show``: the effective configuration as TOML (``--json``: one
    object per section, the keys of docs/configuration.md). A configuration a node would
    refuse at start is refused here too (exit 1), so this command checks one."""
    from hearthnet.pubsub.access import AccessRule
    from hearthnet.pubsub.retention import RetentionRule

    config = config_of(args)
    # the tables' contents are checked where a starting node builds its rules from them
    for rule in config.pubsub.rules:
        AccessRule.from_config(rule)
    for table in config.pubsub.retention:
        RetentionRule.from_config(table)
    emit(args, config_json(config), lambda: print(to_toml(config), end=""))
    for sentence in stray_environment(config):
        print(f"hearthnet: note: {sentence}", file=sys.stderr)
    return EXIT_OK


def config_json(config: Config) -> dict[str, dict[str, Any]]:
    """``{section: {key: value}}`` of every key (tables as lists of objects)."""
    return {name: dataclasses.asdict(getattr(config, name)) for name in sections()}


def cmd_topic_rotate(args: argparse.Namespace) -> int:
    """``hearthnet topic rotate PATTERN``: void every token for topics PATTERN matches that
    was issued until now, on every node (anchors only); live sessions on such tokens get
    ``auth.expiring`` and must re-authenticate with a fresh token."""
    from hearthnet.pubsub.topics import TopicPattern

    TopicPattern.parse(args.pattern)
    record = submit_record(
        args,
        lambda k, m: m.sign(k, "topic.rotated", args.pattern, now_ms=now_ms()),
        "only anchors rotate topic keys",
    )
    emit(
        args,
        {"rotated": args.pattern, "ts": record.ts},
        lambda: print(
            f"rotated {args.pattern}: every token for it issued until now is void on every node"
        ),
    )
    return EXIT_OK


def add_parsers(sub: Any, local: Parents, remote: Parents) -> None:
    """``hearthnet keys``, ``config``, ``token`` and ``topic``."""
    keys = sub.add_parser("keys", help="node identity")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    show = keys_sub.add_parser("show", parents=local, help="show NodeID and short id")
    add_json_flag(show)
    show.set_defaults(func=cmd_keys_show)

    config = sub.add_parser("config", help="configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    cshow = config_sub.add_parser("show", parents=local, help="print the effective configuration")
    add_json_flag(cshow)
    cshow.set_defaults(func=cmd_config_show)

    add_token_parsers(sub, local, remote)
    topic = sub.add_parser("topic", help="topic keys")
    topic_sub = topic.add_subparsers(dest="topic_command", required=True, metavar="ACTION")
    rotate = topic_sub.add_parser(
        "rotate",
        parents=remote,
        help="void every token issued so far for topics PATTERN matches (anchors only)",
    )
    rotate.add_argument(
        "pattern", type=pattern_arg, help="topic pattern, e.g. chat.** or sensors.kitchen.*"
    )
    add_json_flag(rotate)
    rotate.set_defaults(func=cmd_topic_rotate)
