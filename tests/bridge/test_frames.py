"""The bridge's pure core: lines to commands or refusals, the publish ledger, ack pacing."""

from __future__ import annotations

import orjson
import pytest

from hearthnet.bridge.frames import (
    MAX_LINE_BYTES,
    AckPacer,
    CallCommand,
    CancelCommand,
    PublishLedger,
    PubSubCommand,
    Refusal,
    ToolResultCommand,
    parse_command,
)
from hearthnet.identity import KeyPair

NODE = KeyPair.from_seed(b"\x31" * 32).node_id


def line(obj: object) -> bytes:
    """One input line."""
    return orjson.dumps(obj)


def test_commands_of_each_kind() -> None:
    """Pub/sub frames pass as they are; call, tool_result and cancel become commands."""
    publish = {"type": "publish", "topic": "a.b", "msg_type": "m", "data": 1, "ref": "r"}
    assert [
        PubSubCommand(publish),
        PubSubCommand({"type": "ack", "upto": 5}),
        CallCommand("c1", "echo@1.0", {}, None, None, None, None),
        CallCommand("c2", "llm.chat@2", {"m": 1}, {"p": 1}, NODE, 5000, True),
        ToolResultCommand("c2", "t1", {"ok": True}),
        CancelCommand("c2"),
    ] == [
        parse_command(line(publish), 1),
        parse_command(line({"type": "ack", "upto": 5}), 2),
        parse_command(line({"type": "call", "id": "c1", "capability": "echo@1.0"}), 3),
        parse_command(
            line(
                {
                    "type": "call",
                    "id": "c2",
                    "capability": "llm.chat@2",
                    "input": {"m": 1},
                    "params": {"p": 1},
                    "target": NODE,
                    "deadline_ms": 5000,
                    "stream": True,
                }
            ),
            4,
        ),
        parse_command(
            line({"type": "tool_result", "call": "c2", "tool_call_id": "t1", "body": {"ok": True}}),
            5,
        ),
        parse_command(line({"type": "cancel", "call": "c2"}), 6),
    ]


@pytest.mark.parametrize(
    ("raw", "code", "correlation"),
    [
        (b"{not json", "bad_request", {}),
        (b"[1, 2]", "bad_request", {}),
        (line({"type": "nope"}), "bad_request", {}),
        (line({"type": "auth", "token": "x"}), "bad_request", {}),
        (line({"type": "publish", "topic": "a..b", "msg_type": "m", "data": 1, "ref": "r9"}),
         "bad_request", {"ref": "r9"}),
        (line({"type": "call", "id": "c7", "capability": "echo", "body": {}}), "bad_request",
         {"call": "c7"}),
        (line({"type": "call", "id": "c8", "capability": "echo", "target": "x"}), "bad_request",
         {"call": "c8"}),
        (line({"type": "publish", "topic": "a", "msg_type": "m", "data": 1, "ref": "\x00bridge:1"}),
         "bad_request", {"ref": "\x00bridge:1"}),
        (b" " * (MAX_LINE_BYTES + 1), "payload_too_large", {}),
    ],
)  # fmt: skip
def test_refusals_carry_the_code_the_line_and_the_ref_or_call(
    raw: bytes, code: str, correlation: dict[str, str]
) -> None:
    """Every refused line is an error frame with its line number, ref or call id."""
    refusal = parse_command(raw, 7)
    assert isinstance(refusal, Refusal)
    frame = refusal.frame
    got = {"ref": frame["data"]["ref"]} if "ref" in frame["data"] else {}
    got |= {"call": frame["call"]} if "call" in frame else {}
    assert ("error", code, 7, correlation) == (
        frame["event"],
        frame["data"]["code"],
        frame["data"]["line"],
        got,
    )


def test_ledger_counts_answers_and_hides_its_own_refs() -> None:
    """Publishes wait until answered; a ref the bridge made is shown as null; a script's
    ref used twice needs two answers; other frames pass untouched."""
    ledger = PublishLedger()
    own = ledger.sending({"type": "publish", "topic": "a", "msg_type": "m", "data": 1})
    ledger.sending({"type": "publish", "ref": "x"})
    ledger.sending({"type": "publish", "ref": "x"})
    waiting = sorted(ledger.refs(), key=str)
    ok = {"event": "published.ok", "data": {"ref": own["ref"], "seq": 1}}
    shown_own, counted_own = ledger.answered(ok)
    refused = {"event": "error", "data": {"code": "forbidden", "ref": "x"}}
    first_x = ledger.answered(refused)
    message = {"event": "message", "data": {"ref": "x"}, "seq": 2}
    passed = ledger.answered(message)
    left = ledger.outstanding
    ledger.answered(refused)
    assert (
        [None, "x", "x"],
        ({"event": "published.ok", "data": {"ref": None, "seq": 1}}, True),
        (refused, True),
        (message, False),
        (1, 0),
    ) == (
        waiting,
        (shown_own, counted_own),
        first_x,
        passed,
        (left, ledger.outstanding),
    )


def test_ack_pacer_acks_at_half_window_and_when_idle() -> None:
    """With a window of 4: an ack after every 2 written messages, and on idle what is left."""
    pacer = AckPacer(4)
    acks = [pacer.wrote(seq) for seq in (10, 11, 12)]
    assert ([None, 11, None], 12, None) == (acks, pacer.idle(), pacer.idle())


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (
            {"type": "call", "capability": "echo@1.0"},
            "id is missing: the call's id (yours, 1..128 characters; every frame of its answer"
            " carries it)",
        ),
        ({"type": "cancel", "call": 7}, "call: a call id is a string of 1..128 characters"),
    ],
)
def test_a_call_id_missing_or_wrong_names_its_field(frame: dict[str, object], message: str) -> None:
    refusal = parse_command(line(frame), 1)
    assert isinstance(refusal, Refusal)
    assert message == refusal.frame["data"]["message"]
