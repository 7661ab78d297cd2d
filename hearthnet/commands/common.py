"""What every ``hearthnet`` command shares: exit codes, argument types, finding the node,
the client that signs as this data dir's node, and the event-loop runner (spec §9)."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from collections.abc import Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from hearthnet.canonical import MAX_SAFE_INTEGER
from hearthnet.clock import now_ms
from hearthnet.config import (
    Config,
    data_dir_from_environment,
    default_data_dir,
    load_config,
)
from hearthnet.config.mesh_section import node_url_problem
from hearthnet.datadir import NameFile, start_command
from hearthnet.errors import ConfigError, HearthNetError, IdentityError

if TYPE_CHECKING:
    from hearthnet.community import MembershipRecord
    from hearthnet.identity import KeyPair
    from hearthnet.membership import Membership

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_NOT_RUNNING, EXIT_AUTH = 0, 1, 2, 3, 4
Parents = list[argparse.ArgumentParser]
_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d)?\Z")
_SEQ_RE = re.compile(r"^[0-9]+\Z")
_EPOCH_RE = re.compile(r"^[^\s:]+\Z")
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, None: 1000}
# how often a record is signed again when the node took its chain place meanwhile
_SIGN_TRIES = 3


def parse_duration_ms(text: str) -> int:
    """``"90s"``, ``"30m"``, ``"1h"``, ``"7d"``, ``"500ms"``; a bare number is seconds."""
    match = _DURATION_RE.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use 500ms, 30s, 10m, 1h, 7d)")
    return int(float(match.group(1)) * _UNITS_MS[match.group(2)])


# At most this much JSON is read from stdin for an argument given as "-" (the node's
# own bounds are lower: a pub/sub payload is at most 256 KiB, spec §6.2).
STDIN_JSON_MAX = 16 << 20


def json_arg(text: str) -> Any:
    """A JSON argument; ``-``: one JSON value read from stdin (``jq ... | hearthnet pub T
    --data -``)."""
    if text == "-":
        read = sys.stdin.read(STDIN_JSON_MAX + 1)
        if len(read) > STDIN_JSON_MAX:
            raise argparse.ArgumentTypeError(
                f"stdin holds more than {STDIN_JSON_MAX >> 20} MiB of text"
            )
        try:
            return json.loads(read)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"stdin is not one JSON value: {exc}") from exc
    try:
        return json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"not JSON: {exc} (quote it for the shell, keys and strings in double quotes:"
            """ '{"text": "hi"}', a string alone '"hi"'; "-" reads it from stdin)"""
        ) from exc


def node_id_arg(text: str) -> str:
    """A NodeID argument (``ed25519:`` and 43 base64url characters), checked now."""
    from hearthnet.ids import is_node_id

    if not is_node_id(text):
        raise argparse.ArgumentTypeError(
            f"not a NodeID: {text!r} (ed25519:... as hearthnet peers or hearthnet community"
            " show print it)"
        )
    return text


def url_arg(text: str) -> str:
    """``--url``: where a node answers, ``http(s)://host[:port]`` (no port: a node behind
    a reverse proxy on the scheme's port), checked now; a trailing ``/`` is dropped."""
    try:
        parts = urlsplit(text.strip())
        ok = (
            parts.scheme in ("http", "https")
            and bool(parts.hostname)
            and parts.path in ("", "/")
            and not (parts.query or parts.fragment)
        )
        _ = parts.port  # a port that is not a number raises
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(
            f"not a node URL: {text!r} (http://host:port as the node's ready line and"
            " hearthnet node status print it, e.g. http://127.0.0.1:7080)"
        )
    return text.strip().rstrip("/")


def node_url_arg(text: str) -> str:
    """The address of a node to dial (``--peer``, ``--relay-url``...), checked now."""
    problem = node_url_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def federation_peer_arg(text: str) -> str:
    """``--federation-peer``: a node URL, or ``mesh:<NodeID>`` through a relay."""
    problem = node_url_problem(text, mesh_ok=True)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def topic_arg(text: str) -> str:
    """A topic to publish to (spec §6.1), checked now: it goes into the request's path."""
    from hearthnet.pubsub.topics import validate_topic

    try:
        return validate_topic(text)
    except HearthNetError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (e.g. chat.room.1)") from exc


def pattern_arg(text: str) -> str:
    """A topic pattern to subscribe to (``*``, ``**``), checked now."""
    from hearthnet.pubsub.topics import TopicPattern

    try:
        TopicPattern.parse(text)
    except HearthNetError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def positive_int(text: str, least: int = 1) -> int:
    """A count, limit or lifetime of at least 1 (``least``), checked now."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, not {value}")
    return value


def consumer_arg(text: str) -> str:
    """``--consumer NAME``: 1..64 characters (an empty one, say an unset variable, is not
    taken for no consumer)."""
    if not 1 <= len(text) <= 64:
        raise argparse.ArgumentTypeError(f"a name of 1..64 characters, not {text!r}")
    return text


def count_arg(text: str) -> int:
    """A number of messages to start with (``--last``): 0 or more."""
    return positive_int(text, least=0)


def port_arg(text: str) -> int:
    """``--port``: 0 to 65535 (0 picks a free port), checked now."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port (0 to 65535; 0 picks a free one)")
    return value


def cursor_arg(text: str) -> dict[str, Any]:
    """``--since SEQ`` or ``EPOCH:SEQ`` (spec §6.5), as a ``hearthnet sub`` line's ``seq``
    and ``epoch`` give them: a SEQ of ASCII digits (0 to 2^53-1), an EPOCH of no ``:`` and
    no spaces."""
    epoch, colon, seq = text.partition(":") if ":" in text else ("", "", text)
    problem = None
    if ":" in seq:
        problem = "one ':' at most"
    elif colon and not epoch:
        problem = "no EPOCH before ':'"
    elif not _EPOCH_RE.match(epoch or "-"):
        problem = "an EPOCH has no spaces"
    elif not _SEQ_RE.match(seq):
        problem = "SEQ is a whole number, 0 or more"
    elif int(seq) > MAX_SAFE_INTEGER:
        problem = "SEQ is at most 2^53-1"
    if problem is not None:
        raise argparse.ArgumentTypeError(
            f"not SEQ or EPOCH:SEQ: {text!r} ({problem}; e.g. 42 or 5f3a9c1e2b7d4a60:42,"
            " the seq and epoch of a hearthnet sub line)"
        )
    return {"seq": int(seq), **({"epoch": epoch} if epoch else {})}


def unix_ms_arg(text: str) -> int:
    """``--since-ts``: a Unix time in milliseconds, 0 to 2^53-1 (what the node takes),
    checked now."""
    if not _SEQ_RE.match(text) or int(text) > MAX_SAFE_INTEGER:
        raise argparse.ArgumentTypeError(
            f"not a time in Unix ms: {text!r} (a whole number, 0 to 2^53-1, e.g. the ts"
            " of a hearthnet sub line)"
        )
    return int(text)


def scope_arg(text: str) -> str:
    """``--scope sub:PATTERN``, ``pub:PATTERN`` or ``call:NAME[@MAJOR]``, checked now."""
    from hearthnet.tokens import Scope

    try:
        Scope.parse(text)
    except HearthNetError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def lifetime_ms(text: str) -> int:
    """A token lifetime: a duration above zero."""
    return _above_zero_ms(text, "a token must live")


def invite_lifetime_ms(text: str) -> int:
    """How long an invite works: a duration above zero (0 made one already expired)."""
    return _above_zero_ms(text, "an invite must work")


def _above_zero_ms(text: str, what: str) -> int:
    ms = parse_duration_ms(text)
    if ms <= 0:
        raise argparse.ArgumentTypeError(f"{what} longer than {text!r} (e.g. --ttl 1h)")
    return ms


# --- finding and talking to the node ---------------------------------------------------


def data_dir_of(args: argparse.Namespace) -> Path:
    """The data dir, by the configuration's precedence (docs/configuration.md): the flag,
    the environment, the ``--config`` file's ``[node] data_dir``, the default."""
    if getattr(args, "data_dir", None):
        return Path(args.data_dir).expanduser()
    if getattr(args, "config", None) and not data_dir_from_environment():
        in_file = _data_dir_in_file(Path(args.config).expanduser())
        if in_file is not None:
            return in_file
    return default_data_dir()


def _data_dir_in_file(path: Path) -> Path | None:
    """``[node] data_dir`` of a TOML file, if it sets one; a file that cannot be read or
    parsed sets none here (loading the configuration reports it)."""
    import tomllib

    try:
        node = tomllib.loads(path.read_text(encoding="utf-8")).get("node", {})
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    value = node.get("data_dir") if isinstance(node, dict) else None
    return Path(value).expanduser() if isinstance(value, str) and value else None


def config_of(args: argparse.Namespace) -> Config:
    data_dir = data_dir_of(args)
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


def node_url(args: argparse.Namespace) -> str:
    if getattr(args, "url", None):
        return str(args.url)
    return _run_file_url(data_dir_of(args))


def existing_keys(data_dir: Path) -> Any:
    """This data dir's node keys; an error (not a new identity) when there are none, so a
    mistyped --data-dir is noticed instead of founding a community of its own."""
    from hearthnet.identity import load_or_create_keys

    if not (data_dir / "keys").exists():
        made_by = start_command(data_dir)
        raise IdentityError(f"no keys in {data_dir}; they are created by: {made_by}")
    return load_or_create_keys(data_dir)


def client_of(args: argparse.Namespace) -> Any:
    """A client of the running node that signs with this data dir's node key (with
    ``--url``, naming this data dir's community: the node there may be one of a federated
    community, which takes its grant's requests from our members, spec §8)."""
    from hearthnet.client import Client

    url = node_url(args)
    data_dir = data_dir_of(args)
    keys = existing_keys(data_dir)
    if getattr(args, "url", None):
        return Client(url, keys=keys, community=_own_community(data_dir))
    # found by the data dir's run file: a reconnect looks there again (the node may have
    # restarted on another port, with --port 0 or a changed configuration)
    return Client(url, keys=keys, locate=partial(_run_file_url, data_dir))


def _run_file_url(data_dir: Path) -> str:
    """The URL of the node running with this data dir, from its run file."""
    from hearthnet.client import find_running_node

    return str(find_running_node(data_dir)["url"])


def _own_community(data_dir: Path) -> str | None:
    """The community this data dir's records make it a member of; None when it holds
    none (the node there never started), so the node's own is named."""
    from hearthnet.community import CommunityStore

    created = [r for r in CommunityStore(data_dir).load() if r.kind == "community.created"]
    return created[0].community if created else None


def run(main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    try:
        import uvloop

        return uvloop.run(main())
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(main())


def status_of(args: argparse.Namespace) -> dict[str, Any]:
    from hearthnet.client import get_public_json

    url = node_url(args)

    async def main() -> Any:
        return await get_public_json(url, "/status")

    result: dict[str, Any] = run(main)
    return result


def local_identity(args: argparse.Namespace, *, create: bool = False) -> tuple[Any, Any, Any]:
    """Keys, membership store and view of this data dir (keys made only if ``create``)."""
    from hearthnet.community import CommunityStore
    from hearthnet.identity import load_or_create_keys
    from hearthnet.membership import open_membership

    data_dir = data_dir_of(args)
    keys = load_or_create_keys(data_dir) if create else existing_keys(data_dir)
    store = CommunityStore(data_dir)
    name = NameFile(data_dir).name_of(config_of(args).node, keys.node_id, remember=False)
    membership = open_membership(store, keys, name=name, now_ms=now_ms())
    return keys, store, membership


def submit_record(
    args: argparse.Namespace,
    sign: Callable[[KeyPair, Membership], MembershipRecord],
    refused: str,
) -> MembershipRecord:
    """Sign a membership record with this data dir's key (``sign``, next on its chain as
    the data dir records it) and hand it to the running node, which gossips it on; the
    record the node applied.

    The running node signs records on the same chain (admitting a join): when it took
    the record's place meanwhile (``place_taken``), the record is signed again at the
    chain's new head, a few times at most.

    Raises:
        Forbidden: this node's key may not sign that record (the node refused it; spec
            §1.5); the CLI exits 1.
        ConfigError: the node did not apply it (``refused`` says why that may be).
    """
    from hearthnet.errors import BadRequest

    async def main(body: dict[str, Any]) -> Any:
        async with client_of(args) as client:
            return await client.request_json("POST", "/mesh/v1/membership", body)

    for attempt in range(1, _SIGN_TRIES + 1):
        keys, _, membership = local_identity(args)
        record = sign(keys, membership)
        try:
            answer = run(partial(main, {"records": [record.to_json()]}))
        except BadRequest as exc:
            if exc.extra.get("place_taken") is True and attempt < _SIGN_TRIES:
                continue  # the node recorded its own record there first: read it, sign again
            raise
        if not answer.get("applied"):
            raise ConfigError(f"the node did not apply the record ({refused})")
        break
    return record
