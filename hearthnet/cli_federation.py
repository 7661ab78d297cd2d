"""``hearthnet federation propose|accept|list|revoke`` (spec §8; docs/federation.md).

The two anchors exchange one blob each way:

1. an anchor of A runs ``propose --with B ...``: it prints a *proposal*, ``hnf1:`` +
   base64url of the JCS form of ``{"agreement": <signed by A>, "records": [A's
   membership records]}`` (B's nodes need A's records to check that the signer is an
   anchor of A, and who A's members are);
2. an anchor of B runs ``accept PROPOSAL``: it counter-signs, hands the agreement and A's
   records to its node (which spreads them to B's members), and prints the signed
   agreement in the same form, with B's records;
3. an anchor of A runs ``accept SIGNED`` to hand it to A's node. (A bridge syncing with
   the other side delivers it too; this step just does not wait for one.)
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hearthnet.canonical import canonicalize, parse_json
from hearthnet.cli import (
    EXIT_OK,
    _client,
    _local_identity,
    _print_json,
    _run,
    _status,
    parse_duration_ms,
)
from hearthnet.clock import now_ms
from hearthnet.commands.output import add_json_flag
from hearthnet.community import Level
from hearthnet.errors import BadRequest, ConfigError, InvalidSignature, UsageError
from hearthnet.federation.agreement import Agreement, Grant, Revocation
from hearthnet.ids import b64url_decode, b64url_encode, is_node_id, is_ulid, new_ulid

BLOB_PREFIX = "hnf1:"
MAX_BLOB_CHARS = 2 * 1024 * 1024


def encode_blob(agreement: Agreement, records: list[dict[str, Any]]) -> str:
    """``hnf1:`` + base64url(JCS of ``{agreement, records}``)."""
    return BLOB_PREFIX + b64url_encode(
        canonicalize({"agreement": agreement.to_json(), "records": records})
    )


def decode_blob(text: str) -> tuple[Agreement, list[Any]]:
    """The agreement (signatures verified) and the membership records in a blob.

    Raises:
        BadRequest: not a blob. InvalidSignature: a signature does not verify.
    """
    text = text.strip()
    if not text.startswith(BLOB_PREFIX) or len(text) > MAX_BLOB_CHARS:
        raise BadRequest(f"a federation blob starts with {BLOB_PREFIX!r}")
    try:
        obj = parse_json(b64url_decode(text[len(BLOB_PREFIX) :]))
    except ValueError as exc:
        raise BadRequest(f"malformed federation blob: {exc}") from exc
    if not isinstance(obj, dict) or set(obj) != {"agreement", "records"}:
        raise BadRequest("a federation blob is {agreement, records}")
    records = obj["records"]
    if not isinstance(records, list):
        raise BadRequest("a federation blob's records are a list")
    return Agreement.parse(obj["agreement"]), records


def _anchor(args: argparse.Namespace, what: str) -> tuple[Any, Any]:
    """This data dir's keys and membership, when its key is an anchor.

    Raises:
        ConfigError: it is not (exit 1, saying what to do instead).
    """
    keys, _, membership = _local_identity(args)
    if membership.level_of(keys.node_id) != Level.ANCHOR:
        raise ConfigError(
            f"this node ({keys.node_id}) is not an anchor of community "
            f"{membership.community_id}; {what} on an anchor's node (--data-dir of an anchor),"
            " or have an anchor raise this node's level: hearthnet community level"
            f" {keys.node_id} anchor"
        )
    return keys, membership


def _write_or_print(args: argparse.Namespace, agreement: Agreement, blob: str) -> None:
    """The blob to the ``--out`` file or stdout; ``--json``: one object describing it."""
    out: str | None = args.out
    if out:
        Path(out).write_text(blob + "\n", encoding="utf-8")
    if args.json:
        _print_json({"agreement": agreement.id, "written": out, "blob": None if out else blob})
    elif out:
        print(f"wrote agreement {agreement.id} to {out}: give it to the other community's anchor")
    else:
        print(blob)


def _submit(args: argparse.Namespace, body: dict[str, Any]) -> dict[str, Any]:
    async def main() -> Any:
        async with _client(args) as client:
            return await client.request_json("POST", "/mesh/v1/federation", body)

    answer: dict[str, Any] = _run(main)
    return answer


def cmd_propose(args: argparse.Namespace) -> int:
    """``federation propose --with B --grant-topics ... --expires 30d``: a signed proposal."""
    keys, membership = _anchor(args, "propose federations")
    if not is_node_id(args.with_community):
        raise UsageError(
            f"--with takes the other community's id, not {args.with_community!r}: ed25519:..."
            " as hearthnet community show prints it on one of its nodes (or hearthnet node"
            " status --url URL of one)"
        )
    now = now_ms()
    agreement = Agreement.propose(
        keys,
        agreement_id=new_ulid(now),
        community_a=membership.community_id,
        community_b=args.with_community,
        a_grants_b=Grant.parse(
            {"topics": args.grant_topics or [], "capabilities": args.grant_capabilities or []}
        ),
        b_grants_a=Grant.parse(
            {"topics": args.want_topics or [], "capabilities": args.want_capabilities or []}
        ),
        now_ms=now,
        expires_ms=now + args.expires,
        bridges_a=tuple(_node_ids(args.bridges, "--bridges")),
        bridges_b=tuple(_node_ids(args.their_bridges, "--their-bridges")),
    )
    records = [r.to_json() for r in membership.records.values()]
    _write_or_print(args, agreement, encode_blob(agreement, records))
    return EXIT_OK


def _node_ids(values: list[str] | None, flag: str) -> list[str]:
    for value in values or []:
        if not is_node_id(value):
            raise ConfigError(f"{flag} takes NodeIDs (ed25519:..., hearthnet keys show)")
    return list(dict.fromkeys(values or []))


def _read_blob(text: str) -> str:
    if text == "-":
        return sys.stdin.read()
    if text.startswith(BLOB_PREFIX):
        return text
    path = Path(text)
    if not path.exists():
        raise ConfigError(f"{text} is neither a {BLOB_PREFIX} blob nor a file")
    return path.read_text(encoding="utf-8")


def cmd_accept(args: argparse.Namespace) -> int:
    """``federation accept FILE|BLOB``: counter-sign a proposal (or take a signed
    agreement), hand it to the node, print the signed agreement for the other side."""
    try:
        agreement, records = decode_blob(_read_blob(args.blob))
    except (BadRequest, InvalidSignature) as exc:
        # a file cut or rewrapped on the way (pasted into a mail, say) is the usual cause
        raise ConfigError(
            f"{args.blob} is not an intact federation agreement ({exc.message}): it was"
            " changed on the way; ask the other community's anchor to send the file again,"
            " as a file, unchanged"
        ) from exc
    keys, membership = _anchor(args, "accept federations")
    ours = membership.community_id
    if ours not in agreement.communities:
        raise ConfigError(
            f"the agreement is between {agreement.community_a} and {agreement.community_b},"
            f" not this node's community {ours}"
        )
    imported = agreement.complete  # step 3: signed by both already, nothing to send back
    if not imported:
        if ours != agreement.community_b:
            raise ConfigError("this proposal comes from our community: the other side accepts it")
        agreement = agreement.countersign(keys)
    other = agreement.other(ours)
    answer = _submit(args, {"agreements": [agreement.to_json()], "records": {other: records}})
    held = {a["id"]: a for a in answer.get("agreements", [])}
    if agreement.id not in held:
        raise ConfigError("the node did not take the agreement (see its log)")
    status = held[agreement.id]["status"]
    if status in ("revoked", "expired"):
        # the node keeps it as it was: nothing to give the other side
        raise ConfigError(
            f"agreement {agreement.id} is {status} on this node, for good, so nothing was"
            " written; to federate again, an anchor proposes a new agreement: hearthnet"
            f" federation propose --with {other} ..."
        )
    own_records = [r.to_json() for r in membership.records.values()]
    if imported and not args.out and not args.json:
        print(f"agreement {agreement.id}: {status} (signed by both communities; nothing to send)")
        return EXIT_OK
    _write_or_print(args, agreement, encode_blob(agreement, own_records))
    print(f"agreement {agreement.id}: {status}", file=sys.stderr)
    return EXIT_OK


def cmd_list(args: argparse.Namespace) -> int:
    """``federation list [--json]``: the agreements this node holds."""

    async def main() -> Any:
        async with _client(args) as client:
            return await client.request_json("GET", "/mesh/v1/federation")

    answer = _run(main)
    if args.json:
        _print_json(answer)
        return EXIT_OK
    ours = answer["community"]
    if not answer["agreements"]:
        print(
            f"no federation agreements ({ours}); an anchor proposes one: hearthnet federation"
            " propose --with <the other community's id> ... (docs/federation.md)"
        )
        return EXIT_OK
    rows = [("ID", "WITH", "STATUS", "EXPIRES", "WE GRANT", "THEY GRANT")]
    for a in answer["agreements"]:
        we_are_a = a["community_a"] == ours
        mine, theirs = (
            (a["a_grants_b"], a["b_grants_a"])
            if we_are_a
            else (
                a["b_grants_a"],
                a["a_grants_b"],
            )
        )
        rows.append(
            (
                a["id"],
                a["community_b"] if we_are_a else a["community_a"],
                a["status"],
                datetime.fromtimestamp(a["expires_ms"] / 1000, UTC).strftime("%Y-%m-%d %H:%MZ"),
                _grant_text(mine),
                _grant_text(theirs),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return EXIT_OK


def _grant_text(grant: dict[str, list[str]]) -> str:
    parts = [*grant["topics"], *("call:" + c for c in grant["capabilities"])]
    return ",".join(parts) or "-"


def cmd_revoke(args: argparse.Namespace) -> int:
    """``federation revoke ID [--url URL]``: sign a revocation and hand it to our node, or
    with ``--url`` of a node of the other community, to that node (as a bridge's sync
    would: the revocation is signed, so it needs no agreement in force to be taken)."""
    keys, membership = _anchor(args, "revoke federations")
    if not is_ulid(args.id):
        raise UsageError(
            f"{args.id!r} is not an agreement ID (26 characters, 01...): hearthnet federation"
            " list shows them"
        )
    revocation = Revocation.create(keys, args.id, now_ms())
    ours = membership.community_id
    if args.url and _status(args)["community"] != ours:
        return _revoke_there(args, ours, revocation)
    answer = _submit(args, {"revocations": [revocation.to_json()]})
    held = {a["id"]: a for a in answer.get("agreements", [])}
    if held.get(args.id, {}).get("status") != "revoked":
        raise ConfigError(f"the node holds no agreement {args.id} that this key may revoke")
    if args.json:
        _print_json({"revoked": args.id})
        return EXIT_OK
    agreement = held[args.id]
    other = agreement["community_b" if agreement["community_a"] == ours else "community_a"]
    print(
        f"revoked agreement {args.id}: this community's nodes stop at once; {other} stops"
        " when the revocation reaches it, within 10 s through a bridge that syncs with it"
        " (hearthnet federation list there says revoked); with no bridge running, hand it"
        f" to one of their nodes: hearthnet federation revoke {args.id} --url URL"
    )
    return EXIT_OK


def _revoke_there(args: argparse.Namespace, ours: str, revocation: Revocation) -> int:
    """Hand ``revocation`` to the other community's node at ``--url`` through its sync
    endpoint (docs/federation.md); its answer lists the revocations it holds."""
    body = {"community": ours, "agreements": [], "revocations": [revocation.to_json()]}

    async def main() -> Any:
        async with _client(args) as client:
            return await client.request_json(
                "POST", "/mesh/v1/federation/sync", {**body, "records": []}
            )

    answer = _run(main)
    if args.id not in {r.get("agreement") for r in answer.get("revocations", [])}:
        raise ConfigError(f"the node at {args.url} holds no agreement {args.id} with us")
    if args.json:
        _print_json({"revoked": args.id})
    else:
        print(
            f"revoked agreement {args.id} on {args.url} ({answer['community']}): its"
            " community stops within seconds; ours stops once a node of ours holds the"
            f" revocation too (hearthnet federation revoke {args.id}, without --url)"
        )
    return EXIT_OK


def _expires(text: str) -> int:
    ms = parse_duration_ms(text)
    if ms <= 0:
        raise argparse.ArgumentTypeError(f"an agreement must last longer than {text!r}")
    return ms


def add_federation_parsers(sub: Any, local: list[Any], remote: list[Any]) -> None:
    """``hearthnet federation ...``."""
    fed = sub.add_parser("federation", help="federation with other communities (anchors)")
    fsub = fed.add_subparsers(dest="federation_command", required=True, metavar="ACTION")
    propose = fsub.add_parser("propose", parents=local, help="print a signed proposal")
    propose.add_argument(
        "--with",
        dest="with_community",
        required=True,
        metavar="COMMUNITY_ID",
        help="the other community (its id: hearthnet community show, there)",
    )
    propose.add_argument(
        "--grant-topics", nargs="+", metavar="PATTERN", help="our topics that flow to them"
    )
    propose.add_argument(
        "--grant-capabilities", nargs="+", metavar="NAME", help="our capabilities they may call"
    )
    propose.add_argument(
        "--want-topics", nargs="+", metavar="PATTERN", help="their topics we ask for"
    )
    propose.add_argument(
        "--want-capabilities", nargs="+", metavar="NAME", help="their capabilities we ask to call"
    )
    propose.add_argument(
        "--bridges",
        nargs="+",
        metavar="NODE_ID",
        help="our nodes that bridge through relays (only these are taken there)",
    )
    propose.add_argument(
        "--their-bridges",
        nargs="+",
        metavar="NODE_ID",
        help="their nodes that bridge through relays (only these are taken there)",
    )
    propose.add_argument(
        "--expires", type=_expires, default=_expires("30d"), help="lifetime, e.g. 90d (default 30d)"
    )
    propose.add_argument("--out", help="write the proposal to this file")
    add_json_flag(propose)
    propose.set_defaults(func=cmd_propose)
    accept = fsub.add_parser("accept", parents=remote, help="counter-sign or take an agreement")
    accept.add_argument("blob", metavar="FILE|BLOB", help="hnf1:..., a file holding it, or -")
    accept.add_argument("--out", help="write the signed agreement to this file")
    add_json_flag(accept)
    accept.set_defaults(func=cmd_accept)
    listing = fsub.add_parser("list", parents=remote, help="agreements held by the node")
    add_json_flag(listing)
    listing.set_defaults(func=cmd_list)
    revoke = fsub.add_parser("revoke", parents=remote, help="revoke an agreement (anchors)")
    revoke.add_argument("id", metavar="ID", help="the agreement's ID (hearthnet federation list)")
    add_json_flag(revoke)
    revoke.set_defaults(func=cmd_revoke)
