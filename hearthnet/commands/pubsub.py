"""``hearthnet pub``, ``hearthnet sub`` and ``hearthnet topics``."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from hearthnet.commands.common import (
    EXIT_OK,
    Parents,
    client_of,
    consumer_arg,
    count_arg,
    cursor_arg,
    json_arg,
    pattern_arg,
    positive_int,
    run,
    topic_arg,
    unix_ms_arg,
)
from hearthnet.commands.output import (
    STREAM_JSON_HELP,
    Column,
    add_json_flag,
    emit,
    key,
    print_json_line,
    print_table,
)

TOPIC_COLUMNS = [
    Column("topic", key("topic")),
    Column("messages", key("messages"), right=True),
    Column("head_seq", key("head_seq"), right=True),
    Column("subscribers", key("subscribers"), right=True),
    Column("presence", key("presence"), right=True),
]
CONSUMER_COLUMNS = [
    Column("owner", key("owner")),
    Column("name", key("name")),
    Column("topics", lambda row: ",".join(row["topics"])),
    Column("cursor", key("cursor"), right=True),
    Column("pending", key("pending"), right=True),
    Column("held", lambda row: "yes" if row["held"] else "no"),
]


def cmd_pub(args: argparse.Namespace) -> int:
    """``hearthnet pub TOPIC --type T --data JSON [--ttl S]``: where the message landed
    (``--json``: ``{"topic", "id", "seq", "origin_seq", "ts"}``)."""

    async def main() -> Any:
        async with client_of(args) as client:
            return await client.publish(args.topic, args.type, args.data, ttl_s=args.ttl)

    result = {"topic": args.topic, **run(main)}
    emit(
        args,
        result,
        lambda: print(f"published to {args.topic} at seq {result['seq']} (id {result['id']})"),
    )
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
    """``hearthnet sub PATTERN...``: one JSON line per message (or gap, or reset) until
    interrupted."""
    from hearthnet.subscription import Gap, Reset

    def reset(r: Reset) -> None:
        # spec §6.5: the start asked for was not honoured; said once, not counted
        print_json_line(
            {
                "reset": {"reason": r.reason, "since": r.since, "head_seq": r.head_seq},
                "epoch": r.epoch,
            }
        )

    # Reconnects and refusals the subscription rides out are said on stderr (stdout
    # stays one JSON line per message).
    notes = logging.StreamHandler(sys.stderr)
    notes.setFormatter(logging.Formatter("hearthnet: %(message)s"))
    subscription_log = logging.getLogger("hearthnet.client.subscription")
    subscription_log.addHandler(notes)
    subscription_log.setLevel(logging.INFO)
    subscription_log.propagate = False

    async def main() -> int:
        seen = 0
        async with (
            client_of(args) as client,
            client.subscribe(
                args.patterns,
                since=_since_arg(args),
                consumer=args.consumer,
                verify=args.verify,
                on_reset=reset,
            ) as subscription,
        ):
            async for item in subscription:
                # The node's log epoch rides on every line, so a script can resume
                # exactly where it stopped with `--since EPOCH:SEQ` (spec §6.5).
                epoch = subscription.state.epoch
                if isinstance(item, Gap):
                    line: dict[str, Any] = {
                        "gap": {"from_seq": item.from_seq, "to_seq": item.to_seq},
                        "epoch": epoch,
                    }
                else:
                    line = (
                        {"epoch": epoch, "seq": item.seq, **item.envelope}
                        if args.full
                        else {
                            "epoch": epoch,
                            "seq": item.seq,
                            "topic": item.topic,
                            "type": item.type,
                            "data": item.data,
                            "id": item.id,
                            "ts": item.ts,
                        }
                    )
                    if "data_enc" in item.envelope:  # bytes, as base64url text
                        line["data_enc"] = item.envelope["data_enc"]
                print_json_line(line)
                seen += 1
                if args.count and seen >= args.count:
                    await subscription.ack()  # printed is handled: a consumer moves past it
                    return EXIT_OK
        return EXIT_OK

    result: int = run(main)
    return result


def cmd_topics(args: argparse.Namespace) -> int:
    """``hearthnet topics [--prefix P]``: a table (``--json``: ``{"topics": [row]}``, what
    ``mesh.topics@1.0`` answers)."""

    async def main() -> Any:
        async with client_of(args) as client:
            return await client.topics(args.prefix or "", args.limit)

    topics = run(main)
    emit(
        args,
        {"topics": topics},
        lambda: print_table(topics, TOPIC_COLUMNS, "no topics with messages"),
    )
    return EXIT_OK


def cmd_consumer_list(args: argparse.Namespace) -> int:
    """``hearthnet consumer list [--owner ID]``: durable consumers, as a table (``--json``:
    ``{"consumers": [row]}``). Signed with this data dir's node key: every identity's."""

    async def main() -> Any:
        async with client_of(args) as client:
            return await client.consumers(args.owner)

    consumers = run(main)
    emit(
        args,
        {"consumers": consumers},
        lambda: print_table(consumers, CONSUMER_COLUMNS, "no durable consumers"),
    )
    return EXIT_OK


def cmd_consumer_rm(args: argparse.Namespace) -> int:
    """``hearthnet consumer rm NAME [--owner ID]``: forget a durable consumer (its cursor
    and the messages kept for it); a session holding it is closed."""

    async def main() -> Any:
        async with client_of(args) as client:
            return await client.delete_consumer(args.name, args.owner)

    deleted = run(main)["deleted"]
    emit(
        args,
        {"deleted": deleted},
        lambda: print(f"deleted consumer {deleted['name']} of {deleted['owner']}"),
    )
    return EXIT_OK


def add_parsers(sub: Any, remote: Parents) -> None:
    """``hearthnet pub``, ``sub``, ``topics`` and ``consumer``."""
    pub = sub.add_parser("pub", parents=remote, help="publish a message")
    pub.add_argument("topic", type=topic_arg, help="a topic, e.g. chat.room.1")
    pub.add_argument("--type", default="message", help="message type (default: message)")
    pub.add_argument(
        "--data", type=json_arg, required=True, help="payload as JSON ('-': read from stdin)"
    )
    pub.add_argument(
        "--ttl", type=positive_int, help="seconds the message lives (default: retention)"
    )
    add_json_flag(pub)
    pub.set_defaults(func=cmd_pub)

    subp = sub.add_parser("sub", parents=remote, help="subscribe and print messages")
    subp.add_argument(
        "patterns",
        nargs="+",
        type=pattern_arg,
        metavar="PATTERN",
        help="topic patterns (* and **), e.g. 'chat.room.*'",
    )
    since = subp.add_mutually_exclusive_group()
    since.add_argument("--since", type=cursor_arg, help="resume after SEQ (or EPOCH:SEQ)")
    since.add_argument("--since-ts", type=unix_ms_arg, help="messages from this Unix ms on")
    since.add_argument("--last", type=count_arg, help="start with the last N messages")
    subp.add_argument("--consumer", type=consumer_arg, help="durable consumer name (at-least-once)")
    subp.add_argument("--count", type=positive_int, help="exit after N messages or gaps")
    subp.add_argument("--full", action="store_true", help="print whole envelopes")
    subp.add_argument(
        "--verify",
        action="store_true",
        help="ask for signed frames and check every message's signature (or its batch's);"
        " a message that fails is skipped; with --full the envelope keeps its sig",
    )
    add_json_flag(subp, STREAM_JSON_HELP)
    subp.set_defaults(func=cmd_sub)

    topics = sub.add_parser("topics", parents=remote, help="list active topics")
    topics.add_argument("--prefix", help="only topics that start with this")
    topics.add_argument(
        "--limit", type=positive_int, default=100, help="at most this many (default 100)"
    )
    add_json_flag(topics)
    topics.set_defaults(func=cmd_topics)

    consumer = sub.add_parser("consumer", help="durable consumers: list, delete")
    consumer_sub = consumer.add_subparsers(dest="consumer_command", required=True, metavar="ACTION")
    owner_help = "another identity's (a NodeID, or token:ISSUER/SUB as the list shows)"
    listing = consumer_sub.add_parser(
        "list", parents=remote, help="every identity's durable consumers on the node"
    )
    listing.add_argument("--owner", help="only " + owner_help)
    add_json_flag(listing)
    listing.set_defaults(func=cmd_consumer_list)
    rm = consumer_sub.add_parser(
        "rm", parents=remote, help="delete a durable consumer and what is kept for it"
    )
    rm.add_argument("name", type=consumer_arg, help="the consumer's name")
    rm.add_argument("--owner", help=owner_help + "; default: this node's own")
    add_json_flag(rm)
    rm.set_defaults(func=cmd_consumer_rm)
