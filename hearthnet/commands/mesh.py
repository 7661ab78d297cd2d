"""``hearthnet peers``, ``hearthnet community ...`` and ``hearthnet heartbeat export``."""

from __future__ import annotations

import argparse
import json
import os
import tomllib
from pathlib import Path
from typing import Any

from hearthnet.clock import now_ms
from hearthnet.commands.common import (
    EXIT_OK,
    Parents,
    client_of,
    config_of,
    data_dir_of,
    existing_keys,
    local_identity,
    parse_duration_ms,
    print_json,
    run,
    status_of,
    submit_record,
)
from hearthnet.errors import ConfigError, NodeNotRunning


def cmd_peers(args: argparse.Namespace) -> int:
    """``hearthnet peers``: linked peers and known addresses."""

    async def main() -> Any:
        async with client_of(args) as client:
            return await client.request_json("GET", "/mesh/v1/peers")

    result = run(main)
    if args.json:
        print_json(result)
        return EXIT_OK
    print(f"{'node':52} {'name':16} {'state':9} {'rtt ms':>8} {'loss %':>6}  path / url")
    for peer in result["peers"]:
        rtt = peer.get("rtt_ms_p50")
        loss = peer.get("loss_pct")
        state = peer.get("direction", "known") if peer["linked"] else "known"
        rtt_text = f"{rtt:.1f}" if rtt is not None else "-"
        loss_text = f"{loss:.0f}" if loss is not None else "-"
        name = str(peer.get("name") or "-")[:16]
        # spec §8: direct, relayed via <relay>, or upgrading
        path = peer.get("path")
        where = f"{path} via {peer['via']}" if peer.get("via") else path or ""
        print(
            f"{peer.get('node') or '?'!s:52} {name:16} {state:9} {rtt_text:>8} {loss_text:>6}"
            f"  {where + ' ' if where else ''}{peer.get('url') or '-'}"
        )
    return EXIT_OK


def cmd_community_create(args: argparse.Namespace) -> int:
    """``hearthnet community create NAME``: found a community with this node as anchor."""
    from hearthnet.client import find_running_node
    from hearthnet.community import MembershipRecord

    data_dir = data_dir_of(args)
    try:
        find_running_node(data_dir)
    except NodeNotRunning:
        pass
    else:
        raise ConfigError("stop the node first: a community is created while the node is stopped")
    keys, store, membership = local_identity(args, create=True)
    others = set(membership.members) - {keys.node_id}
    if (membership.community_id != keys.node_id or others) and not args.force:
        raise ConfigError(
            f"this node belongs to community {membership.community_id} with "
            f"{len(membership.members)} members; use --force to leave it"
        )
    genesis = MembershipRecord.create(
        keys,
        "community.created",
        keys.node_id,
        keys.node_id,
        now_ms=now_ms(),
        name=args.name,
        signer_seq=1,
        prev=None,
    )
    store.replace([genesis])
    print(json.dumps({"community": keys.node_id, "name": args.name, "anchor": keys.node_id}))
    return EXIT_OK


def cmd_community_invite(args: argparse.Namespace) -> int:
    """``hearthnet community invite [--level member|trusted] [--ttl 24h]``: prints hn1:..."""
    from hearthnet.community import Level
    from hearthnet.mesh.admission import Invite

    keys, _, membership = local_identity(args)
    bootstrap = list(args.bootstrap or [])
    if not bootstrap:
        try:
            bootstrap = [status_of(args)["mesh_url"]]
        except NodeNotRunning as exc:
            raise ConfigError("pass --bootstrap URL (the node is not running to ask it)") from exc
    own = membership.level_of(keys.node_id)
    level = Level.parse(args.level)
    if own is None or own < Level.TRUSTED or level > own:
        raise ConfigError("only anchor and trusted members invite, at most at their own level")
    invite = Invite.issue(
        keys,
        community=membership.community_id,
        level=level,
        ttl_ms=args.ttl,
        now_ms=now_ms(),
        bootstrap=bootstrap,
        nonce=os.urandom(12).hex(),
        relays=list(args.relay_url or config_of(args).mesh.relay_urls),  # spec §8
    )
    print(invite.encode())
    return EXIT_OK


def cmd_community_revoke(args: argparse.Namespace) -> int:
    """``hearthnet community revoke NODEID``: sign a revocation and hand it to the node."""

    keys, _, membership = local_identity(args)
    record = membership.sign(keys, "member.revoked", args.node, now_ms=now_ms())
    submit_record(args, record, "only anchors revoke; the founder stays")
    print(json.dumps({"revoked": args.node}))
    return EXIT_OK


def _rules_file(path: str) -> tuple[tuple[str, str, str], ...]:
    """Access rules from a TOML file's ``[[pubsub.rules]]`` tables (a node's config file
    will do) or from a JSON list of ``{pattern, subscribe, publish}``."""
    from hearthnet.pubsub.access import AccessRule

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from exc
    try:
        tables: Any = json.loads(text) if path.endswith(".json") else tomllib.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(
            f"{path} is not valid {'JSON' if path.endswith('.json') else 'TOML'}: {exc}"
        ) from exc
    if isinstance(tables, dict):
        section = tables.get("pubsub")
        tables = section.get("rules") if isinstance(section, dict) else None
    if not isinstance(tables, list) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{path} has no [[pubsub.rules]] tables (or JSON list of rules)")
    rules = [AccessRule.from_config(t) for t in tables]
    return tuple((r.pattern, r.subscribe, r.publish) for r in rules)


def cmd_community_rules(args: argparse.Namespace) -> int:
    """``hearthnet community rules FILE|--clear``: sign the community's pub/sub access
    rules (anchors only) and hand them to the node, which gossips them (spec §6.9)."""

    if args.clear == (args.file is not None):
        raise ConfigError("give a rules file, or --clear")
    rules = () if args.clear else _rules_file(args.file)
    if not args.clear and not rules:
        raise ConfigError("no rules in the file (use --clear to hand rules back to each node)")
    keys, _, membership = local_identity(args)
    record = membership.sign(
        keys,
        "pubsub.rules",
        membership.community_id,
        now_ms=now_ms(),
        rules=rules,
    )
    submit_record(args, record, "only anchors set the rules")
    print_json({"pubsub_rules": record.to_json()["rules"]})
    return EXIT_OK


def cmd_community_show(args: argparse.Namespace) -> int:
    """``hearthnet community show``: the community and its members."""
    _, _, membership = local_identity(args)
    info = {
        "community": membership.community_id,
        "name": membership.name,
        "members": [
            {"node": n, "level": m.level.label, "role": m.role, "name": m.name}
            for n, m in sorted(membership.members.items())
        ],
        "revoked": sorted(membership.revoked),
        "pubsub_rules": (
            None
            if membership.pubsub_rules is None
            else [
                {"pattern": p, "subscribe": sub, "publish": pub}
                for p, sub, pub in membership.pubsub_rules
            ]
        ),
    }
    print_json(info)
    return EXIT_OK


def cmd_heartbeat_export(args: argparse.Namespace) -> int:
    """``hearthnet heartbeat export --out DIR [--since 24h] [--format jsonl|parquet]``."""
    from hearthnet.mesh.heartlog import export

    data_dir = data_dir_of(args)
    keys = existing_keys(data_dir)
    counts = export(
        data_dir, Path(args.out), node=keys.node_id, since_ms=now_ms() - args.since, fmt=args.format
    )
    print(json.dumps(counts))
    return EXIT_OK


def add_parsers(sub: Any, local: Parents, remote: Parents) -> None:
    peers = sub.add_parser("peers", parents=remote, help="linked peers and known addresses")
    peers.add_argument("--json", action="store_true")
    peers.set_defaults(func=cmd_peers)

    community = sub.add_parser("community", help="community membership")
    csub = community.add_subparsers(dest="community_command", required=True, metavar="ACTION")
    create = csub.add_parser("create", parents=local, help="found a community (node stopped)")
    create.add_argument("name")
    create.add_argument("--force", action="store_true", help="leave the current community")
    create.set_defaults(func=cmd_community_create)
    invite = csub.add_parser("invite", parents=remote, help="print an invite token (hn1:...)")
    invite.add_argument("--level", choices=["member", "trusted"], default="member")
    invite.add_argument("--ttl", type=parse_duration_ms, default=parse_duration_ms("24h"))
    invite.add_argument(
        "--bootstrap",
        action="append",
        metavar="URL",
        help="where the new node joins (default: this node's mesh URL)",
    )
    invite.add_argument(
        "--relay-url",
        action="append",
        metavar="URL",
        help="relay the new node attaches to (repeatable; default: this node's mesh.relay_urls)",
    )
    invite.set_defaults(func=cmd_community_invite)
    revoke = csub.add_parser("revoke", parents=remote, help="revoke a member (anchors only)")
    revoke.add_argument("node", help="the NodeID to revoke")
    revoke.set_defaults(func=cmd_community_revoke)
    rules = csub.add_parser(
        "rules", parents=remote, help="set the community's pub/sub access rules (anchors only)"
    )
    rules.add_argument(
        "file", nargs="?", help="TOML with [[pubsub.rules]] tables, or a .json list of rules"
    )
    rules.add_argument(
        "--clear", action="store_true", help="drop them: each node uses its own config again"
    )
    rules.set_defaults(func=cmd_community_rules)
    show = csub.add_parser("show", parents=local, help="the community and its members")
    show.set_defaults(func=cmd_community_show)

    mesh = sub.add_parser("mesh", help="community-wide analysis")
    msub = mesh.add_subparsers(dest="mesh_command", required=True, metavar="ACTION")
    # `main` hands `mesh health ...` to spark_federation.cli before parsing; this entry
    # lists the command in --help.
    msub.add_parser(
        "health",
        add_help=False,
        help="mesh-health report from heartbeat exports (PySpark; --help for options)",
    )

    heartbeat = sub.add_parser("heartbeat", help="heartbeat logs")
    hsub = heartbeat.add_subparsers(dest="heartbeat_command", required=True, metavar="ACTION")
    exp = hsub.add_parser("export", parents=local, help="export heartbeats, beacons and traces")
    exp.add_argument("--out", required=True, help="output directory")
    exp.add_argument("--since", type=parse_duration_ms, default=parse_duration_ms("24h"))
    exp.add_argument("--format", choices=["jsonl", "parquet"], default="jsonl")
    exp.set_defaults(func=cmd_heartbeat_export)
