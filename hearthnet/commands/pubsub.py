"""``hearthnet pub``, ``hearthnet sub`` and ``hearthnet topics``."""

from __future__ import annotations

import argparse
import json
from typing import Any

from hearthnet.commands.common import (
    EXIT_OK,
    Parents,
    client_of,
    cursor_arg,
    json_arg,
    print_json,
    run,
)


def cmd_pub(args: argparse.Namespace) -> int:
    """``hearthnet pub TOPIC --type T --data JSON [--ttl S]``: prints id and seq."""

    async def main() -> Any:
        async with client_of(args) as client:
            return await client.publish(args.topic, args.type, args.data, ttl_s=args.ttl)

    print_json(run(main))
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
            client_of(args) as client,
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

    result: int = run(main)
    return result


def cmd_topics(args: argparse.Namespace) -> int:
    """``hearthnet topics [--prefix P]``."""

    async def main() -> Any:
        async with client_of(args) as client:
            return await client.topics(args.prefix or "", args.limit)

    topics = run(main)
    if args.json:
        print_json(topics)
        return EXIT_OK
    print(f"{'topic':40} {'messages':>8} {'head_seq':>9} {'subs':>5}")
    for t in topics:
        print(f"{t['topic']:40} {t['messages']:>8} {t['head_seq']:>9} {t['subscribers']:>5}")
    return EXIT_OK


def add_parsers(sub: Any, remote: Parents) -> None:
    pub = sub.add_parser("pub", parents=remote, help="publish a message")
    pub.add_argument("topic")
    pub.add_argument("--type", default="message", help="message type (default: message)")
    pub.add_argument("--data", type=json_arg, required=True, help="payload as JSON")
    pub.add_argument("--ttl", type=int, help="seconds the message lives (default: retention)")
    pub.set_defaults(func=cmd_pub)

    subp = sub.add_parser("sub", parents=remote, help="subscribe and print messages")
    subp.add_argument("patterns", nargs="+", metavar="PATTERN", help="topic patterns (* and **)")
    since = subp.add_mutually_exclusive_group()
    since.add_argument("--since", type=cursor_arg, help="resume after SEQ (or EPOCH:SEQ)")
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
