"""``hearthnet token issue``, ``token list`` and ``token revoke`` (spec §1.6).

Tokens are signed here, with the data dir's seed file (the node need not run), and each
one is recorded in ``<data_dir>/tokens/issued.sqlite3`` (:mod:`hearthnet.issued_tokens`)
before it is printed, so ``token list`` shows it and ``token revoke`` recognises its jti.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hearthnet.clock import now_ms
from hearthnet.commands.common import (
    EXIT_OK,
    Parents,
    data_dir_of,
    lifetime_ms,
    local_identity,
    node_id_arg,
    parse_duration_ms,
    scope_arg,
    submit_record,
)
from hearthnet.commands.output import Column, add_json_flag, emit, key, print_table
from hearthnet.errors import HearthNetError, NotFound, UsageError
from hearthnet.issued_tokens import IssuedTokens, listed, revocation_doubt


def cmd_token_issue(args: argparse.Namespace) -> int:
    """``hearthnet token issue --scope sub:chat.** --ttl 1h``: prints the token alone."""
    from hearthnet.tokens import CapabilityToken, Scope

    keys, _, membership = local_identity(args)
    scopes = [Scope.parse(s) for s in args.scope]
    now = now_ms()
    token = CapabilityToken.issue(
        keys,
        community=membership.community_id,
        scopes=scopes,
        ttl_ms=args.ttl,
        now_ms=now,
        sub=args.sub,
    )
    # recorded first: a token this node cannot list (and its revoke not recognise) is
    # never printed
    IssuedTokens(data_dir_of(args)).record(token, "cli", now)
    text = token.encode()
    issued = {
        "token": text,
        "jti": token.jti,
        "iss": token.iss,
        "sub": token.sub,
        "community": token.community,
        "scopes": [f"{scope.kind}:{scope.pattern}" for scope in token.scopes],
        "exp_ms": token.exp_ms,
    }
    emit(args, issued, lambda: print(text))
    return EXIT_OK


def span(ms: int, now: int) -> str:
    """``ms`` from ``now`` as people read it: ``in 59m``, ``3h ago``, ``in 2d``."""
    delta = abs(ms - now) // 1000
    for unit, seconds in (("d", 86_400), ("h", 3600), ("m", 60)):
        if delta >= seconds:
            text = f"{delta // seconds}{unit}"
            break
    else:
        text = f"{delta}s"
    return f"in {text}" if ms > now else f"{text} ago"


def token_columns(now: int) -> list[Column]:
    """The ``token list`` table, times relative to ``now``."""
    return [
        Column("jti", key("jti")),
        Column("sub", key("sub")),
        Column("scopes", key("scopes")),
        Column("issued", lambda t: span(t["iat_ms"], now)),
        Column("expires", lambda t: span(t["exp_ms"], now)),
        Column("state", key("state")),
        Column("via", key("via")),
    ]


def cmd_token_list(args: argparse.Namespace) -> int:
    """``hearthnet token list [--all]``: the live tokens this node issued (``--all``: the
    revoked and expired ones it still records too), newest first. Revoked: through this
    node, or by any node whose ``token.revoked`` record reached this data dir."""
    keys, _, membership = local_identity(args)
    now = now_ms()
    revoked = membership.revoked_tokens
    rows = [t.revoked_in(revoked) for t in IssuedTokens(data_dir_of(args)).all(now)]
    shown = [t.to_json(now) for t in listed(rows, now, everything=args.all)]
    empty = "no tokens issued by this node" + ("" if args.all else " are live (--all: every one)")
    emit(
        args,
        {"node": keys.node_id, "tokens": shown},
        lambda: print_table(shown, token_columns(now), empty),
    )
    return EXIT_OK


def cmd_token_revoke(args: argparse.Namespace) -> int:
    """``hearthnet token revoke TOKEN|JTI``: revoke one token, mesh-wide (spec §1.6).

    A jti that this node has no record of issuing is refused (exit 1, nothing sent: it is
    almost always a typo), unless ``--force`` (a token issued before tokens were
    recorded, or by another node)."""
    from hearthnet.tokens import TOKEN_PREFIX, CapabilityToken

    keys, _, _ = local_identity(args)
    issued = IssuedTokens(data_dir_of(args))
    if args.token.startswith(TOKEN_PREFIX):
        try:
            token = CapabilityToken.decode(args.token)
        except HearthNetError as exc:
            raise UsageError(
                f"not a token ({exc}): pass the whole hnt1:... that hearthnet token issue"
                " printed, or its jti (hearthnet token list shows it)"
            ) from exc
        iss, jti = token.iss, token.jti  # its signature verified: it exists
    else:
        iss, jti = args.iss or keys.node_id, args.token
        doubt = revocation_doubt(jti, iss, keys.node_id, issued.get(jti))
        if doubt is not None and not args.force:
            raise NotFound(f"not revoked: {doubt}")
        if doubt is not None:
            print(f"hearthnet: warning: {doubt}; revoking it anyway (--force)", file=sys.stderr)
    submit_record(
        args,
        lambda k, m: m.sign(k, "token.revoked", jti, now_ms=now_ms(), iss=iss),
        "a token is revoked by its issuer or an anchor",
    )
    if iss == keys.node_id:
        issued.mark_revoked(jti, now_ms())
    emit(
        args,
        {"revoked": jti, "iss": iss},
        lambda: print(f"revoked token {jti} (issued by {iss}) on every node"),
    )
    return EXIT_OK


def add_token_parsers(sub: Any, local: Parents, remote: Parents) -> None:
    """``hearthnet token issue``, ``token list`` and ``token revoke``."""
    token = sub.add_parser("token", help="capability tokens for clients")
    token_sub = token.add_subparsers(dest="token_command", required=True, metavar="ACTION")
    issue = token_sub.add_parser("issue", parents=local, help="issue a token (printed alone)")
    issue.add_argument(
        "--scope",
        action="append",
        required=True,
        type=scope_arg,
        help="sub:PATTERN, pub:PATTERN or call:NAME[@MAJOR]; repeatable",
    )
    issue.add_argument(
        "--ttl",
        type=lifetime_ms,
        default=parse_duration_ms("1h"),
        help="lifetime (default 1h)",
    )
    issue.add_argument("--sub", help="subject name for the client (default: generated)")
    add_json_flag(issue, "print {token, jti, iss, sub, community, scopes, exp_ms}")
    issue.set_defaults(func=cmd_token_issue)
    tlist = token_sub.add_parser(
        "list", parents=local, help="the live tokens this node issued (never the tokens)"
    )
    tlist.add_argument(
        "--all", action="store_true", help="also those revoked or expired (kept 7 days)"
    )
    add_json_flag(tlist, "print {node, tokens: [{jti, sub, scopes, iat_ms, exp_ms, state, ...}]}")
    tlist.set_defaults(func=cmd_token_list)
    revoke = token_sub.add_parser(
        "revoke", parents=remote, help="revoke one token on every node (issuer or anchor)"
    )
    revoke.add_argument("token", help="the token (hnt1:...) or its jti")
    revoke.add_argument(
        "--iss", type=node_id_arg, help="with a jti: the token's issuer (default: this node)"
    )
    revoke.add_argument(
        "--force",
        action="store_true",
        help="revoke a jti this node has no record of issuing (issued before tokens were"
        " recorded, or by another node)",
    )
    add_json_flag(revoke)
    revoke.set_defaults(func=cmd_token_revoke)
