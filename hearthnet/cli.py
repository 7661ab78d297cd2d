"""The ``hearthnet`` command (spec §9).

Exit codes: 0 ok, 1 error, 2 usage, 3 node not running, 4 auth failure.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import os
import re
import sys
import tomllib
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hearthnet import __version__
from hearthnet.clock import now_ms
from hearthnet.config import Config, default_data_dir, load_config, to_toml
from hearthnet.errors import (
    ConfigError,
    Expired,
    HearthNetError,
    IdentityError,
    InvalidSignature,
    NodeNotRunning,
    Revoked,
    Unauthorized,
    Unavailable,
    WireError,
)

if TYPE_CHECKING:
    from hearthnet.community import MembershipRecord

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NOT_RUNNING, EXIT_AUTH = 0, 1, 2, 3, 4
_AUTH_ERRORS = (InvalidSignature, Unauthorized, Revoked, Expired)
_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?\Z")
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, None: 1000}


def parse_duration_ms(text: str) -> int:
    """``"90s"``, ``"30m"``, ``"1h"``, ``"7d"``, ``"500ms"``; a bare number is seconds."""
    match = _DURATION_RE.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use 500ms, 30s, 10m, 1h, 7d)")
    return int(float(match.group(1)) * _UNITS_MS[match.group(2)])


def _json_arg(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc


def _cursor_arg(text: str) -> dict[str, Any]:
    """``--since SEQ`` or ``EPOCH:SEQ``."""
    epoch, _, seq = text.rpartition(":")
    if not seq.isdigit():
        raise argparse.ArgumentTypeError(f"not SEQ or EPOCH:SEQ: {text!r}")
    return {"seq": int(seq), **({"epoch": epoch} if epoch else {})}


def _scope_arg(text: str) -> str:
    """``--scope sub:PATTERN``, ``pub:PATTERN`` or ``call:NAME[@MAJOR]``, checked now."""
    from hearthnet.tokens import Scope

    try:
        Scope.parse(text)
    except HearthNetError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def _lifetime_ms(text: str) -> int:
    """A token lifetime: a duration above zero."""
    ms = parse_duration_ms(text)
    if ms <= 0:
        raise argparse.ArgumentTypeError(f"a token must live longer than {text!r}")
    return ms


# --- shared helpers ------------------------------------------------------------------


def _data_dir(args: argparse.Namespace) -> Path:
    if getattr(args, "data_dir", None):
        return Path(args.data_dir).expanduser()
    return default_data_dir()


def _config(args: argparse.Namespace) -> Config:
    data_dir = _data_dir(args)
    overrides: dict[str, dict[str, Any]] = {"node": {"data_dir": str(data_dir)}}
    node_flags = {"host": "host", "port": "port", "log_level": "log_level", "name": "name"}
    for flag, key in node_flags.items():
        value = getattr(args, flag, None)
        if value is not None:
            overrides["node"][key] = value
    section_flags = {
        "llm_url": ("llm", "url"),
        "llm_model": ("llm", "model"),
        "llm_demo": ("llm", "demo"),
        "peer": ("mesh", "peers"),
        "heartbeat_s": ("mesh", "heartbeat_s"),
        "zeroconf": ("mesh", "zeroconf"),
        "advertise_url": ("mesh", "advertise_url"),
        "relay": ("mesh", "relay"),
        "relay_url": ("mesh", "relay_urls"),
        "relay_peer": ("mesh", "relay_peers"),
        "federation_peer": ("mesh", "federation_peers"),
    }
    for flag, (section, key) in section_flags.items():
        value = getattr(args, flag, None)
        if value is not None:
            overrides.setdefault(section, {})[key] = value
    path = (
        Path(args.config).expanduser()
        if getattr(args, "config", None)
        else data_dir / "hearthnet.toml"
    )
    if getattr(args, "config", None) and not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    return load_config(path, overrides=overrides)


def _node_url(args: argparse.Namespace) -> str:
    if getattr(args, "url", None):
        return str(args.url)
    from hearthnet.client import find_running_node

    return str(find_running_node(_data_dir(args))["url"])


def _existing_keys(data_dir: Path) -> Any:
    """This data dir's node keys; an error (not a new identity) when there are none, so a
    mistyped --data-dir is noticed instead of founding a community of its own."""
    from hearthnet.identity import load_or_create_keys

    if not (data_dir / "keys").exists():
        raise IdentityError(f"no keys in {data_dir}; they are created by: hearthnet node start")
    return load_or_create_keys(data_dir)


def _client(args: argparse.Namespace) -> Any:
    """A client of the running node that signs with this data dir's node key."""
    from hearthnet.client import Client

    url = _node_url(args)
    return Client(url, keys=_existing_keys(_data_dir(args)))


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, ensure_ascii=False))


# --- node ----------------------------------------------------------------------------


def cmd_node_start(args: argparse.Namespace) -> int:
    """``hearthnet node start``."""
    from hearthnet import logs
    from hearthnet.node import Node

    config = _config(args)
    logs.configure(config.node.log_level)

    def ready(node: Node) -> None:
        logs.configure(config.node.log_level, node.keys.node_id)
        print(node.ready_line(), flush=True)

    async def main() -> None:
        await Node(config, join=args.join).serve_forever(on_ready=ready)

    _run(main)
    return EXIT_OK


def _run(main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    try:
        import uvloop

        return uvloop.run(main())
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(main())


def cmd_node_status(args: argparse.Namespace) -> int:
    """``hearthnet node status [--json]``: /status is public, so no keys are needed."""
    status = _status(args)
    if args.json:
        _print_json(status)
        return EXIT_OK
    width = max(len(k) for k in status)
    for key, value in status.items():
        shown = ", ".join(str(v) for v in value) or "-" if isinstance(value, list) else value
        print(f"{key.ljust(width)}  {shown}")
    return EXIT_OK


# --- calls ---------------------------------------------------------------------------


def cmd_call(args: argparse.Namespace) -> int:
    """``hearthnet call CAP --body JSON [--stream]``."""
    from hearthnet.client import raise_for_terminal

    async def main() -> int:
        async with _client(args) as client:
            if not args.stream:
                result = await client.call_with_meta(args.capability, args.body, target=args.target)
                _print_json(result["output"])
                return EXIT_OK
            async with client.stream(
                args.capability,
                args.body,
                prefer_ws=not args.sse,
                cbor=args.cbor,
                target=args.target,
            ) as stream:
                async for frame in stream:
                    print(json.dumps(frame.to_json(), ensure_ascii=False), flush=True)
                    raise_for_terminal(frame)  # main() maps the error to its exit code
                return EXIT_OK

    result: int = _run(main)
    return result


# --- pub/sub -------------------------------------------------------------------------


def cmd_pub(args: argparse.Namespace) -> int:
    """``hearthnet pub TOPIC --type T --data JSON [--ttl S]``: prints id and seq."""

    async def main() -> Any:
        async with _client(args) as client:
            return await client.publish(args.topic, args.type, args.data, ttl_s=args.ttl)

    _print_json(_run(main))
    return EXIT_OK


def _since_arg(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.since is not None:
        cursor: dict[str, Any] = args.since
        return cursor
    if args.since_ts is not None:
        return {"ts": args.since_ts}
    if args.last is not None:
        return {"last": args.last}
    return None


def cmd_sub(args: argparse.Namespace) -> int:
    """``hearthnet sub PATTERN...``: one JSON line per message (or gap) until interrupted."""
    from hearthnet.subscription import Gap

    async def main() -> int:
        seen = 0
        async with (
            _client(args) as client,
            client.subscribe(
                args.patterns, since=_since_arg(args), consumer=args.consumer
            ) as subscription,
        ):
            async for item in subscription:
                if isinstance(item, Gap):
                    line: dict[str, Any] = {
                        "gap": {"from_seq": item.from_seq, "to_seq": item.to_seq}
                    }
                else:
                    line = (
                        {"seq": item.seq, **item.envelope}
                        if args.full
                        else {
                            "seq": item.seq,
                            "topic": item.topic,
                            "type": item.type,
                            "data": item.data,
                            "id": item.id,
                            "ts": item.ts,
                        }
                    )
                print(json.dumps(line, ensure_ascii=False), flush=True)
                seen += 1
                if args.count and seen >= args.count:
                    return EXIT_OK
        return EXIT_OK

    result: int = _run(main)
    return result


def cmd_topics(args: argparse.Namespace) -> int:
    """``hearthnet topics [--prefix P]``."""

    async def main() -> Any:
        async with _client(args) as client:
            return await client.topics(args.prefix or "", args.limit)

    topics = _run(main)
    if args.json:
        _print_json(topics)
        return EXIT_OK
    print(f"{'topic':40} {'messages':>8} {'head_seq':>9} {'subs':>5}")
    for t in topics:
        print(f"{t['topic']:40} {t['messages']:>8} {t['head_seq']:>9} {t['subscribers']:>5}")
    return EXIT_OK


def cmd_chat(args: argparse.Namespace) -> int:
    """``hearthnet chat``: interactive llm.chat with tools (hearthnet.chat_cli)."""
    from hearthnet.chat_cli import chat_command

    return chat_command(args, lambda: _client(args), _run)


# --- mesh ----------------------------------------------------------------------------


def cmd_peers(args: argparse.Namespace) -> int:
    """``hearthnet peers``: linked peers and known addresses."""

    async def main() -> Any:
        async with _client(args) as client:
            return await client.request_json("GET", "/mesh/v1/peers")

    result = _run(main)
    if args.json:
        _print_json(result)
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


def _local_identity(args: argparse.Namespace, *, create: bool = False) -> tuple[Any, Any, Any]:
    """Keys, membership store and view of this data dir (keys made only if ``create``)."""
    from hearthnet.community import CommunityStore
    from hearthnet.identity import load_or_create_keys
    from hearthnet.membership import open_membership

    data_dir = _data_dir(args)
    keys = load_or_create_keys(data_dir) if create else _existing_keys(data_dir)
    store = CommunityStore(data_dir)
    membership = open_membership(store, keys, name=_config(args).node.name, now_ms=now_ms())
    return keys, store, membership


def cmd_community_create(args: argparse.Namespace) -> int:
    """``hearthnet community create NAME``: found a community with this node as anchor."""
    from hearthnet.client import find_running_node
    from hearthnet.community import MembershipRecord

    data_dir = _data_dir(args)
    try:
        find_running_node(data_dir)
    except NodeNotRunning:
        pass
    else:
        raise ConfigError("stop the node first: a community is created while the node is stopped")
    keys, store, membership = _local_identity(args, create=True)
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

    keys, _, membership = _local_identity(args)
    bootstrap = list(args.bootstrap or [])
    if not bootstrap:
        try:
            bootstrap = [_status(args)["mesh_url"]]
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
        relays=list(args.relay_url or _config(args).mesh.relay_urls),  # spec §8
    )
    print(invite.encode())
    return EXIT_OK


def _status(args: argparse.Namespace) -> dict[str, Any]:
    from hearthnet.client import get_public_json

    url = _node_url(args)

    async def main() -> Any:
        return await get_public_json(url, "/status")

    result: dict[str, Any] = _run(main)
    return result


def _submit_record(args: argparse.Namespace, record: MembershipRecord, refused: str) -> None:
    """Hand a signed membership record to the running node (which gossips it on).

    Raises:
        Forbidden: this node's key may not sign that record (the node refused it; spec
            §1.5); the CLI exits 1.
        ConfigError: the node did not apply it (``refused`` says why that may be).
    """

    async def main() -> Any:
        async with _client(args) as client:
            return await client.request_json(
                "POST", "/mesh/v1/membership", {"records": [record.to_json()]}
            )

    if not _run(main).get("applied"):
        raise ConfigError(f"the node did not apply the record ({refused})")


def cmd_community_revoke(args: argparse.Namespace) -> int:
    """``hearthnet community revoke NODEID``: sign a revocation and hand it to the node."""

    keys, _, membership = _local_identity(args)
    record = membership.sign(keys, "member.revoked", args.node, now_ms=now_ms())
    _submit_record(args, record, "only anchors revoke; the founder stays")
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
    keys, _, membership = _local_identity(args)
    record = membership.sign(
        keys,
        "pubsub.rules",
        membership.community_id,
        now_ms=now_ms(),
        rules=rules,
    )
    _submit_record(args, record, "only anchors set the rules")
    _print_json({"pubsub_rules": record.to_json()["rules"]})
    return EXIT_OK


def cmd_community_show(args: argparse.Namespace) -> int:
    """``hearthnet community show``: the community and its members."""
    _, _, membership = _local_identity(args)
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
    _print_json(info)
    return EXIT_OK


def cmd_heartbeat_export(args: argparse.Namespace) -> int:
    """``hearthnet heartbeat export --out DIR [--since 24h] [--format jsonl|parquet]``."""
    from hearthnet.mesh.heartlog import export

    data_dir = _data_dir(args)
    keys = _existing_keys(data_dir)
    counts = export(
        data_dir, Path(args.out), node=keys.node_id, since_ms=now_ms() - args.since, fmt=args.format
    )
    print(json.dumps(counts))
    return EXIT_OK


# --- keys, config, tokens ------------------------------------------------------------


def cmd_keys_show(args: argparse.Namespace) -> int:
    """``hearthnet keys show``: NodeID and short id (never the private seed)."""
    data_dir = _data_dir(args)
    keys = _existing_keys(data_dir)
    info = {
        "node": keys.node_id,
        "short_id": keys.short_id,
        "seed_file": str(data_dir / "keys" / "node.ed25519"),
    }
    if args.json:
        _print_json(info)
    else:
        for key, value in info.items():
            print(f"{key:9} {value}")
    return EXIT_OK


def cmd_config_show(args: argparse.Namespace) -> int:
    """``hearthnet config show``: the effective configuration as TOML."""
    print(to_toml(_config(args)), end="")
    return EXIT_OK


def cmd_token_issue(args: argparse.Namespace) -> int:
    """``hearthnet token issue --scope sub:chat.** --ttl 1h``: prints the token alone."""
    from hearthnet.tokens import CapabilityToken, Scope

    keys, _, membership = _local_identity(args)
    scopes = [Scope.parse(s) for s in args.scope]
    token = CapabilityToken.issue(
        keys,
        community=membership.community_id,
        scopes=scopes,
        ttl_ms=args.ttl,
        now_ms=now_ms(),
        sub=args.sub,
    )
    print(token.encode())
    return EXIT_OK


def cmd_token_revoke(args: argparse.Namespace) -> int:
    """``hearthnet token revoke TOKEN|JTI``: revoke one token, mesh-wide (spec §1.6)."""
    from hearthnet.tokens import TOKEN_PREFIX, CapabilityToken

    keys, _, membership = _local_identity(args)
    if args.token.startswith(TOKEN_PREFIX):
        token = CapabilityToken.decode(args.token)
        iss, jti = token.iss, token.jti
    else:
        iss, jti = args.iss or keys.node_id, args.token
    record = membership.sign(keys, "token.revoked", jti, now_ms=now_ms(), iss=iss)
    _submit_record(args, record, "a token is revoked by its issuer or an anchor")
    print(json.dumps({"revoked": jti, "iss": iss}))
    return EXIT_OK


def cmd_topic_rotate(args: argparse.Namespace) -> int:
    """``hearthnet topic rotate PATTERN``: void every token for topics PATTERN matches that
    was issued until now, on every node (anchors only); live sessions on such tokens get
    ``auth.expiring`` and must re-authenticate with a fresh token."""
    from hearthnet.pubsub.topics import TopicPattern

    TopicPattern.parse(args.pattern)
    keys, _, membership = _local_identity(args)
    record = membership.sign(keys, "topic.rotated", args.pattern, now_ms=now_ms())
    _submit_record(args, record, "only anchors rotate topic keys")
    print(json.dumps({"rotated": args.pattern, "ts": record.ts}))
    return EXIT_OK


# --- parser --------------------------------------------------------------------------


def _add_chat_parser(sub: Any, parents: list[argparse.ArgumentParser]) -> None:
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


Parents = list[argparse.ArgumentParser]


def _add_node_parsers(sub: Any, local: Parents, remote: Parents) -> None:
    node = sub.add_parser("node", help="run and inspect the node")
    node_sub = node.add_subparsers(dest="node_command", required=True, metavar="ACTION")
    start = node_sub.add_parser("start", parents=local, help="start a node in the foreground")
    start.add_argument("--host", help="listen address (default 0.0.0.0)")
    start.add_argument("--port", type=int, help="port (default 7080; 0 picks a free port)")
    start.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    start.add_argument("--name", help="human name of this node (default: host name)")
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
    start.add_argument("--advertise-url", help="URL peers should dial to reach this node")
    start.add_argument(
        "--relay",
        action="store_true",
        default=None,
        help="serve as a relay for members that cannot be dialled (spec §8)",
    )
    start.add_argument(
        "--relay-url",
        action="append",
        metavar="URL",
        help="relay to attach to when peers cannot be dialled (repeatable)",
    )
    start.add_argument(
        "--relay-peer",
        action="append",
        metavar="URL",
        help="with --relay: another relay to federate with; it must name this one too (repeatable)",
    )
    start.add_argument(
        "--federation-peer",
        action="append",
        metavar="URL",
        help="a node of a federated community to bridge to (repeatable; docs/federation.md)",
    )
    start.set_defaults(func=cmd_node_start)
    status = node_sub.add_parser("status", parents=remote, help="show the running node")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.set_defaults(func=cmd_node_status)

    call = sub.add_parser("call", parents=remote, help="call a capability")
    call.add_argument("capability", help="NAME[@MAJOR.MINOR], e.g. echo@1.0")
    call.add_argument("--body", type=_json_arg, default={}, help="input as JSON (default {})")
    call.add_argument("--stream", action="store_true", help="stream frames (WS, SSE fallback)")
    call.add_argument("--sse", action="store_true", help="with --stream: use SSE, not WebSocket")
    call.add_argument("--cbor", action="store_true", help="with --stream: CBOR WebSocket frames")
    call.add_argument("--target", help="run on this NodeID")
    call.set_defaults(func=cmd_call)


def _add_pubsub_parsers(sub: Any, remote: Parents) -> None:
    pub = sub.add_parser("pub", parents=remote, help="publish a message")
    pub.add_argument("topic")
    pub.add_argument("--type", default="message", help="message type (default: message)")
    pub.add_argument("--data", type=_json_arg, required=True, help="payload as JSON")
    pub.add_argument("--ttl", type=int, help="seconds the message lives (default: retention)")
    pub.set_defaults(func=cmd_pub)

    subp = sub.add_parser("sub", parents=remote, help="subscribe and print messages")
    subp.add_argument("patterns", nargs="+", metavar="PATTERN", help="topic patterns (* and **)")
    since = subp.add_mutually_exclusive_group()
    since.add_argument("--since", type=_cursor_arg, help="resume after SEQ (or EPOCH:SEQ)")
    since.add_argument("--since-ts", type=int, help="messages from this Unix ms on")
    since.add_argument("--last", type=int, help="start with the last N messages")
    subp.add_argument("--consumer", help="durable consumer name (at-least-once)")
    subp.add_argument("--count", type=int, help="exit after N items")
    subp.add_argument("--full", action="store_true", help="print whole envelopes")
    subp.set_defaults(func=cmd_sub)

    topics = sub.add_parser("topics", parents=remote, help="list active topics")
    topics.add_argument("--prefix")
    topics.add_argument("--limit", type=int, default=100)
    topics.add_argument("--json", action="store_true")
    topics.set_defaults(func=cmd_topics)


def _add_mesh_parsers(sub: Any, local: Parents, remote: Parents) -> None:
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


def _add_admin_parsers(sub: Any, local: Parents, remote: Parents) -> None:
    keys = sub.add_parser("keys", help="node identity")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    show = keys_sub.add_parser("show", parents=local, help="show NodeID and short id")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_keys_show)

    config = sub.add_parser("config", help="configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    cshow = config_sub.add_parser("show", parents=local, help="print the effective configuration")
    cshow.set_defaults(func=cmd_config_show)

    token = sub.add_parser("token", help="capability tokens for clients")
    token_sub = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    issue = token_sub.add_parser("issue", parents=local, help="issue a token (printed alone)")
    issue.add_argument(
        "--scope",
        action="append",
        required=True,
        type=_scope_arg,
        help="sub:PATTERN, pub:PATTERN or call:NAME[@MAJOR]; repeatable",
    )
    issue.add_argument(
        "--ttl",
        type=_lifetime_ms,
        default=parse_duration_ms("1h"),
        help="lifetime (default 1h)",
    )
    issue.add_argument("--sub", help="subject name for the client (default: generated)")
    issue.set_defaults(func=cmd_token_issue)
    revoke = token_sub.add_parser(
        "revoke", parents=remote, help="revoke one token on every node (issuer or anchor)"
    )
    revoke.add_argument("token", help="the token (hnt1:...) or its jti")
    revoke.add_argument("--iss", help="with a jti: the token's issuer (default: this node)")
    revoke.set_defaults(func=cmd_token_revoke)
    topic = sub.add_parser("topic", help="topic keys")
    topic_sub = topic.add_subparsers(dest="topic_command", required=True, metavar="ACTION")
    rotate = topic_sub.add_parser(
        "rotate",
        parents=remote,
        help="void every token issued so far for topics PATTERN matches (anchors only)",
    )
    rotate.add_argument("pattern", help="topic pattern, e.g. chat.** or sensors.kitchen.*")
    rotate.set_defaults(func=cmd_topic_rotate)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every subcommand."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir",
        help="data directory (default: $HEARTHNET_DATA_DIR or ~/.local/share/hearthnet)",
    )
    common.add_argument("--config", help="TOML config file (default: <data_dir>/hearthnet.toml)")
    remote = argparse.ArgumentParser(add_help=False)
    remote.add_argument("--url", help="node URL (default: from <data_dir>/run/node.json)")

    parser = argparse.ArgumentParser(prog="hearthnet", description="HearthNet mesh node")
    parser.add_argument("--version", action="version", version=f"hearthnet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_node_parsers(sub, [common], [common, remote])
    _add_pubsub_parsers(sub, [common, remote])
    _add_chat_parser(sub, [common, remote])
    _add_mesh_parsers(sub, [common], [common, remote])
    _add_admin_parsers(sub, [common], [common, remote])
    from hearthnet.cli_federation import add_federation_parsers  # spec §8

    add_federation_parsers(sub, [common], [common, remote])
    from hearthnet.console.cli import add_console_parser

    add_console_parser(sub, [common, remote])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hearthnet`` console script."""
    words = sys.argv[1:] if argv is None else list(argv)
    if words[:2] == ["mesh", "health"]:
        # its own parser (shared with spark-submit); PySpark is imported only once it runs
        from spark_federation.cli import main as mesh_health

        return mesh_health(words[2:])
    parser = build_parser()
    args = parser.parse_args(words)
    try:
        code: int = args.func(args)
        return code
    except NodeNotRunning as exc:
        print(f"hearthnet: {exc}", file=sys.stderr)
        return EXIT_NOT_RUNNING
    except Unavailable as exc:
        cause = exc.__cause__
        if isinstance(cause, OSError) and cause.errno == errno.ECONNREFUSED:
            # nothing listens at the node's address (spec §9: exit 3, node not running)
            print(f"hearthnet: no node answers: {exc.message}", file=sys.stderr)
            return EXIT_NOT_RUNNING
        print(f"hearthnet: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_ERROR
    except _AUTH_ERRORS as exc:
        print(f"hearthnet: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_AUTH
    except WireError as exc:
        print(f"hearthnet: {exc.code}: {exc.message}", file=sys.stderr)
        return EXIT_ERROR
    except HearthNetError as exc:  # configuration, identity, storage
        print(f"hearthnet: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader of our stdout went away (| head): not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
