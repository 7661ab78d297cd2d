"""``hearthnet peers``, ``hearthnet community ...`` and ``hearthnet heartbeat export``."""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import tomllib
from collections.abc import Mapping, Sequence
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
    invite_lifetime_ms,
    local_identity,
    node_id_arg,
    node_url,
    node_url_arg,
    parse_duration_ms,
    run,
    submit_record,
)
from hearthnet.commands.output import Column, add_json_flag, emit, key, print_fields, print_table
from hearthnet.commands.peers import add_forget_parser
from hearthnet.datadir import NameFile
from hearthnet.errors import ConfigError, NodeNotRunning, NotFound, Unavailable


def _path(peer: Mapping[str, Any]) -> str | None:
    """spec §8: direct, relayed via <relay>, or upgrading; ``(relay)`` after the path of a
    relay of ours (a federated one says so in its own column)."""
    path = peer.get("path")
    if peer.get("via"):
        return f"{path} via {peer['via']}"
    return f"{path} (relay)" if peer.get("relay") and not peer.get("community") else path


def _federated(peer: Mapping[str, Any]) -> str | None:
    """A node of a federated community (spec §8): ``bridge``, ``relay`` (of theirs, that
    we attached to) or ``member``, and the community; nothing for one of ours."""
    community = peer.get("community")
    if not community:
        return None
    role = "bridge" if peer.get("bridge") else "relay" if peer.get("relay") else "member"
    return f"{role} {community}"


def with_relay_names(peers: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """For the table: ``via`` as the relay's name where the list names it (``--json``
    keeps the NodeID)."""
    names = {p["node"]: p["name"] for p in peers if p.get("node") and p.get("name")}
    return [{**p, "via": names.get(p["via"], p["via"])} if p.get("via") else p for p in peers]


def _address(peer: Mapping[str, Any]) -> str | None:
    """The address used (or last worked), and how many more are known."""
    more = len(peer.get("urls") or ()) - 1
    url = peer.get("url")
    return f"{url} (+{more})" if url and more > 0 else url


PEER_COLUMNS = [
    Column("name", key("name")),
    Column("node", key("node")),
    Column("state", lambda p: p.get("direction", "known") if p["linked"] else "known"),
    Column("rtt ms", key("rtt_ms_p50"), right=True),
    Column("loss %", key("loss_pct"), right=True),
    Column("path", _path),
    Column("remote", key("remote")),  # the address a direct link's socket uses
    Column("url", _address),
]
# shown when a node of a federated community is linked
FEDERATED_COLUMN = Column("federated", _federated)


def peer_columns(peers: Sequence[Mapping[str, Any]]) -> list[Column]:
    """:data:`PEER_COLUMNS`, and :data:`FEDERATED_COLUMN` when a row needs it."""
    if any(p.get("community") for p in peers):
        return [*PEER_COLUMNS, FEDERATED_COLUMN]
    return PEER_COLUMNS


MEMBER_COLUMNS = [
    Column("node", key("node")),
    Column("level", key("level")),
    Column("role", key("role")),
    Column("name", key("name")),
]
RULE_COLUMNS = [
    Column("pattern", key("pattern")),
    Column("subscribe", key("subscribe")),
    Column("publish", key("publish")),
]


def cmd_peers(args: argparse.Namespace) -> int:
    """``hearthnet peers``: linked peers and known addresses, one row per peer
    (``--json``: what ``mesh.peers@1.0`` answers)."""

    async def main() -> Any:
        async with client_of(args) as client:
            return await client.request_json("GET", "/mesh/v1/peers")

    result = run(main)
    emit(
        args,
        result,
        lambda: print_table(
            with_relay_names(result["peers"]), peer_columns(result["peers"]), "no peers known"
        ),
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
    created = {"community": keys.node_id, "name": args.name, "anchor": keys.node_id}
    emit(
        args,
        created,
        lambda: print(f"founded community {args.name!r} ({keys.node_id}); this node is its anchor"),
    )
    return EXIT_OK


def cmd_community_invite(args: argparse.Namespace) -> int:
    """``hearthnet community invite [--level member|trusted] [--ttl 24h]``: prints hn1:..."""
    from hearthnet.community import Level
    from hearthnet.mesh.admission import Invite

    keys, _, membership = local_identity(args)
    own = membership.level_of(keys.node_id)
    level = Level.parse(args.level)
    if own is None or own < Level.TRUSTED or level > own:
        raise ConfigError(
            "only anchor and trusted members invite, at most at their own level (this node "
            f"is {own.label if own is not None else 'not a member'}); make the invite on an "
            "anchor's node (hearthnet community invite --data-dir <its data dir>), or have an "
            f"anchor raise this node's level: hearthnet community level {keys.node_id} trusted"
        )
    bootstrap, relays = _invite_urls(args)
    invite = Invite.issue(
        keys,
        community=membership.community_id,
        level=level,
        ttl_ms=args.ttl,
        now_ms=now_ms(),
        bootstrap=bootstrap,
        nonce=os.urandom(12).hex(),
        relays=relays,  # spec §8
    )
    token = invite.encode()
    issued = {
        "invite": token,
        "community": invite.community,
        "level": invite.level.label,
        "expires_ms": invite.expires_ms,
        "bootstrap": list(invite.bootstrap),
        "relays": list(invite.relays),
    }
    emit(args, issued, lambda: print(token))
    return EXIT_OK


def _invite_urls(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The invite's bootstrap and relay URLs: ``--bootstrap`` and ``--relay-url`` as
    given, and for what is not given, what the running node uses now (spec §8: its mesh
    URL; the relays it attaches to, else itself when it is a relay), asked of the node,
    since flags or a configuration file changed since its start may say otherwise.

    With the node stopped, ``--bootstrap`` must be given; the relays are then
    ``--relay-url``'s, else those a plain ``hearthnet node start`` would attach to (the
    configuration file's ``mesh.relay_urls`` and the relays this node's invite brought),
    and a note on stderr says so.

    Raises:
        NodeNotRunning: no node runs and no ``--bootstrap`` was given.
    """
    bootstrap = list(args.bootstrap or [])
    relays = list(args.relay_url or [])
    if bootstrap and relays:
        return bootstrap, relays
    try:
        running = _ask_running(args)
    except NodeNotRunning as exc:
        if not bootstrap:
            raise NodeNotRunning(
                f"{exc}; an invite names the addresses the running node uses (its mesh URL"
                " and relays), so start it first, or give them: hearthnet community invite"
                " --bootstrap URL [--relay-url URL]..."
            ) from exc
        if not args.relay_url:
            relays = _relays_at_next_start(args)
            print(
                "hearthnet: note: the node is not running: the invite names the relays it"
                " attaches to when started without flags"
                f" ({', '.join(relays) if relays else 'none'}); give --relay-url URL to name"
                " others",
                file=sys.stderr,
            )
        return bootstrap, relays
    return bootstrap or list(running["bootstrap"]), (
        relays if args.relay_url else list(running["relays"])
    )


def _ask_running(args: argparse.Namespace) -> dict[str, Any]:
    """``GET /mesh/v1/invite-urls`` of the running node, signed with this data dir's key.

    Raises:
        NodeNotRunning: no run file, or no node answers at its URL.
    """

    async def main() -> Any:
        async with client_of(args) as client:
            return await client.request_json("GET", "/mesh/v1/invite-urls")

    try:
        answer: dict[str, Any] = run(main)
    except Unavailable as exc:
        cause = exc.__cause__
        if isinstance(cause, OSError) and cause.errno == errno.ECONNREFUSED:
            raise NodeNotRunning(f"no node answers at {node_url(args)}") from exc
        raise
    except NotFound as exc:
        raise ConfigError(
            f"the node at {node_url(args)} is older than this command and cannot say which"
            " URLs it uses: restart it (hearthnet node stop, then hearthnet node start), or"
            " give them: hearthnet community invite --bootstrap URL [--relay-url URL]..."
        ) from exc
    return answer


def _relays_at_next_start(args: argparse.Namespace) -> list[str]:
    """The relays a stopped node attaches to at a plain ``hearthnet node start``: the
    configuration's ``mesh.relay_urls`` and those its own invite brought (in its peer
    book), but a relay's ``mesh.relay_peers`` (mesh/relaying.py, ``member_urls``)."""
    from hearthnet.mesh.addresses import PeerBook, normalize_url

    mesh = config_of(args).mesh
    book = PeerBook(data_dir_of(args) / "mesh" / "peers.json")
    book.load()
    configured = [normalize_url(u) for u in mesh.relay_urls]
    saved = [a.url for a in book.addresses.values() if a.source == "relay"]
    # a relay federates with its --relay-peer relays and never attaches to them
    peers = {normalize_url(u) for u in mesh.relay_peers} if mesh.relay else set()
    return [u for u in dict.fromkeys([*configured, *saved]) if u not in peers]


def cmd_community_revoke(args: argparse.Namespace) -> int:
    """``hearthnet community revoke NODEID``: sign a revocation and hand it to the node."""
    from hearthnet.community import Level

    keys, _, membership = local_identity(args)
    if args.node == membership.community_id and membership.level_of(keys.node_id) is Level.ANCHOR:
        # the node would refuse it as forbidden, which reads as "use an anchor's key" to an
        # anchor (to anyone else it is the right advice, and what the node says)
        raise ConfigError(
            f"{args.node} founded this community (its NodeID is the community's id): the"
            " founder cannot be revoked, so nothing was signed; to end another member's"
            " access, revoke its own NodeID (hearthnet community show lists them)"
        )
    stranger = membership.level_of(args.node) is None and not membership.is_revoked(args.node)
    submit_record(
        args,
        lambda k, m: m.sign(k, "member.revoked", args.node, now_ms=now_ms()),
        "only anchors revoke; the founder stays",
    )
    emit(args, {"revoked": args.node}, lambda: print(f"revoked {args.node} on every node"))
    if stranger:  # a mistyped NodeID revokes nobody who is a member: say so
        print(
            f"hearthnet: note: {args.node} is not a member of this community (hearthnet"
            " community show lists them); the revocation stands: that key can never join",
            file=sys.stderr,
        )
    return EXIT_OK


def cmd_community_level(args: argparse.Namespace) -> int:
    """``hearthnet community level NODEID LEVEL``: sign a level change (anchors only) and
    hand it to the node, which gossips it on (spec §1.5, ``member.level_changed``)."""
    from hearthnet.community import Level

    _, _, membership = local_identity(args)
    if args.node == membership.community_id:
        raise ConfigError(
            f"{args.node} founded this community (its NodeID is the community's id): the"
            " founder stays an anchor, so nothing was signed"
        )
    if membership.level_of(args.node) is None:
        raise ConfigError(
            f"{args.node} is not a member of this community (hearthnet community show lists"
            " them; a new node joins with an invite: hearthnet community invite --level"
            " trusted), so nothing was signed"
        )
    level = Level.parse(args.level)
    submit_record(
        args,
        lambda k, m: m.sign(k, "member.level_changed", args.node, now_ms=now_ms(), level=level),
        "only anchors change levels; a revoked member stays revoked",
    )
    emit(
        args,
        {"node": args.node, "level": level.label},
        lambda: print(f"{args.node} is {level.label} now, on every node"),
    )
    return EXIT_OK


def _rules_file(path: str) -> tuple[tuple[str, str, str], ...]:
    """Access rules from a TOML file's ``[[pubsub.rules]]`` tables (a node's config file
    will do) or from a JSON list of ``{pattern, subscribe, publish}``."""
    from hearthnet.pubsub.access import AccessRule

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot read {path}: {exc.strerror or exc} (give hearthnet community rules a TOML"
            " file with [[pubsub.rules]] tables, such as a node's hearthnet.toml, or a .json"
            " list of {pattern, subscribe, publish}; --clear hands the rules back to each node)"
        ) from exc
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
    record = submit_record(
        args,
        lambda k, m: m.sign(k, "pubsub.rules", m.community_id, now_ms=now_ms(), rules=rules),
        "only anchors set the rules",
    )
    rows = [{"pattern": p, "subscribe": sub, "publish": pub} for p, sub, pub in rules]

    def for_people() -> None:
        if not rows:
            print("community rules cleared: each node applies its own [[pubsub.rules]] again")
            return
        print("the community's pub/sub access rules, first match wins:")
        print_table(rows, RULE_COLUMNS)

    emit(args, {"pubsub_rules": record.to_json()["rules"]}, for_people)
    return EXIT_OK


def cmd_community_show(args: argparse.Namespace) -> int:
    """``hearthnet community show``: the community, its founder and its members.

    The founding record names the community, not its founder's node, so the founder's row
    shows this node's own name when this node founded it, else no name."""
    keys, _, membership = local_identity(args)
    founder = membership.community_id  # a community's id is its founder's NodeID

    def member_name(node: str, recorded: str | None) -> str | None:
        if node != founder:
            return recorded
        if node == keys.node_id:
            return NameFile(data_dir_of(args)).name_of(config_of(args).node, node, remember=False)
        return None

    info = {
        "community": membership.community_id,
        "name": membership.name,
        "founder": founder,
        "members": [
            {"node": n, "level": m.level.label, "role": m.role, "name": member_name(n, m.name)}
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

    def for_people() -> None:
        by = "this node" if founder == keys.node_id else founder
        print_fields({"community": info["community"], "name": info["name"], "founder": by})
        print()
        print_table(info["members"], MEMBER_COLUMNS)
        if info["revoked"]:
            print(f"\nrevoked: {', '.join(info['revoked'])}")
        rules = info["pubsub_rules"]
        print(
            "\npub/sub rules: "
            + ("each node's own" if rules is None else "signed, first match wins")
        )
        if rules:
            print_table(rules, RULE_COLUMNS)

    emit(args, info, for_people)
    return EXIT_OK


def cmd_heartbeat_export(args: argparse.Namespace) -> int:
    """``hearthnet heartbeat export --out DIR [--since 24h] [--format jsonl|parquet]``."""
    from hearthnet.mesh.heartlog import export

    data_dir = data_dir_of(args)
    keys = existing_keys(data_dir)
    counts = export(
        data_dir, Path(args.out), node=keys.node_id, since_ms=now_ms() - args.since, fmt=args.format
    )
    emit(
        args,
        counts,
        lambda: print(
            f"exported to {args.out}: " + ", ".join(f"{n} {what}" for what, n in counts.items())
        ),
    )
    return EXIT_OK


def add_parsers(sub: Any, local: Parents, remote: Parents) -> None:
    """``hearthnet peers``, ``community ...``, ``mesh health`` and ``heartbeat export``."""
    peers = sub.add_parser("peers", parents=remote, help="linked peers and known addresses")
    add_json_flag(peers)
    peers.set_defaults(func=cmd_peers)
    add_forget_parser(peers, remote)

    community = sub.add_parser("community", help="community membership")
    csub = community.add_subparsers(dest="community_command", required=True, metavar="ACTION")
    create = csub.add_parser("create", parents=local, help="found a community (node stopped)")
    create.add_argument("name", help="the community's name, shown to its members")
    create.add_argument("--force", action="store_true", help="leave the current community")
    add_json_flag(create)
    create.set_defaults(func=cmd_community_create)
    invite = csub.add_parser("invite", parents=remote, help="print an invite token (hn1:...)")
    invite.add_argument(
        "--level",
        choices=["member", "trusted"],
        default="member",
        help="the new node's level (trusted may invite too; default member)",
    )
    invite.add_argument(
        "--ttl",
        type=invite_lifetime_ms,
        default=parse_duration_ms("24h"),
        help="how long the invite works, e.g. 1h (default 24h); it admits one node",
    )
    invite.add_argument(
        "--bootstrap",
        action="append",
        type=node_url_arg,
        metavar="URL",
        help="where the new node joins (default: the running node's mesh URL; required"
        " when the node is stopped)",
    )
    invite.add_argument(
        "--relay-url",
        action="append",
        type=node_url_arg,
        metavar="URL",
        help="relay the new node attaches to (repeatable; default: the relays the running"
        " node attaches to, else itself when it is a relay)",
    )
    add_json_flag(invite, "print {invite, community, level, expires_ms, bootstrap, relays}")
    invite.set_defaults(func=cmd_community_invite)
    revoke = csub.add_parser("revoke", parents=remote, help="revoke a member (anchors only)")
    revoke.add_argument("node", type=node_id_arg, help="the NodeID to revoke")
    add_json_flag(revoke)
    revoke.set_defaults(func=cmd_community_revoke)
    level = csub.add_parser("level", parents=remote, help="change a member's level (anchors only)")
    level.add_argument("node", type=node_id_arg, help="the member's NodeID")
    level.add_argument("level", choices=("member", "trusted", "anchor"), help="its new level")
    add_json_flag(level)
    level.set_defaults(func=cmd_community_level)
    rules = csub.add_parser(
        "rules", parents=remote, help="set the community's pub/sub access rules (anchors only)"
    )
    rules.add_argument(
        "file", nargs="?", help="TOML with [[pubsub.rules]] tables, or a .json list of rules"
    )
    rules.add_argument(
        "--clear", action="store_true", help="drop them: each node uses its own config again"
    )
    add_json_flag(rules)
    rules.set_defaults(func=cmd_community_rules)
    show = csub.add_parser("show", parents=local, help="the community and its members")
    add_json_flag(show)
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
    exp.add_argument(
        "--since",
        type=parse_duration_ms,
        default=parse_duration_ms("24h"),
        help="how far back, e.g. 6h (default 24h)",
    )
    exp.add_argument(
        "--format",
        choices=["jsonl", "parquet"],
        default="jsonl",
        help="file format (parquet needs the analysis extra; default jsonl)",
    )
    add_json_flag(exp)
    exp.set_defaults(func=cmd_heartbeat_export)
