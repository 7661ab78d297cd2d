"""Signature checks in the checker process: the same outcomes as on the loop (spec §1.4, §11)."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from hearthnet.bus.sigchild import answers
from hearthnet.bus.signatures import SignatureWorker, check_bytes
from hearthnet.errors import InvalidSignature, WireError
from hearthnet.tokens import CapabilityToken, Scope
from tests.test_auth import MEMBER, NODE, NOW, STRANGER, envelope, make_auth


def calls() -> list[tuple[dict[str, Any], object, object]]:
    """(envelope, signature, token): good, forged, replayed, stranger, late, odd, token."""

    good = envelope(MEMBER)
    forged = envelope(MEMBER)
    late = envelope(MEMBER, ts=NOW - 3_600_000)
    odd = envelope(MEMBER, body={"input": 2**60})  # no canonical form
    token = CapabilityToken.issue(
        MEMBER, community=NODE.node_id, scopes=[Scope.parse("call:echo")], ttl_ms=60_000, now_ms=NOW
    )
    token_env = envelope(MEMBER)
    del token_env["from"]
    stranger = envelope(STRANGER)
    return [
        (good, MEMBER.sign_object(good), None),
        (forged, STRANGER.sign_object(forged), None),
        (good, MEMBER.sign_object(good), None),  # the same request id again
        (stranger, STRANGER.sign_object(stranger), None),
        (late, MEMBER.sign_object(late), None),
        (odd, "ed25519:" + "A" * 86, None),
        (forged, "not a signature", None),
        (token_env, None, token.encode()),
    ]


def outcome(result: Any) -> str:
    """What a check gave: the caller's identity, or the refusal's code."""
    if isinstance(result, WireError):
        return result.code
    return str(result.caller.identity)


async def test_calls_checked_on_the_worker_end_as_on_the_loop() -> None:
    """Each call gets the outcome and the counted failure reason it gets from
    authenticate_call: checked together by the checker (batches of 3), and alone (a
    lone check is made on the loop), the replayed one after the first."""
    cases = calls()
    on_loop, loop_failures = make_auth()
    expected = []
    for env, sig, token in cases:
        try:
            expected.append(
                outcome(on_loop.authenticate_call(env, signature=sig, token=token, now_ms=NOW))
            )
        except WireError as exc:
            expected.append(outcome(exc))
    worker = SignatureWorker(max_batch=3)
    on_worker, worker_failures = make_auth()

    async def check(env: dict[str, Any], sig: object, token: object) -> str:
        try:
            call = await on_worker.authenticate_call_on(
                worker, env, signature=sig, token=token, now_ms=NOW
            )
        except WireError as exc:
            return outcome(exc)
        return outcome(call)

    together = [c for i, c in enumerate(cases) if i != 2]
    got = await asyncio.gather(*(check(*c) for c in together))
    got.insert(2, await check(*cases[2]))  # the replay, alone
    worker.close()
    assert (expected, sorted(loop_failures)) == (got, sorted(worker_failures))
    assert {"replayed", "invalid_signature"} <= set(got)


async def test_checks_of_one_turn_come_back_together_and_cancels_are_dropped() -> None:
    """Checks asked for in one turn (more than a batch) each get their own outcome; a
    check whose caller went away is dropped; after close() checks run on the caller."""
    worker = SignatureWorker(max_batch=4)
    messages = [{"i": i} for i in range(10)]
    sigs: list[object] = [MEMBER.sign_object(m) for m in messages]
    sigs[3] = STRANGER.sign_object(messages[3])
    futures = [worker.check(MEMBER.node_id, m, s) for m, s in zip(messages, sigs, strict=True)]
    futures[5].cancel()
    done = await asyncio.gather(*futures, return_exceptions=True)
    kinds = [type(d).__name__ for d in done]
    worker.close()
    after = worker.check(MEMBER.node_id, messages[0], sigs[0])
    forged = worker.check(MEMBER.node_id, messages[3], sigs[3])
    assert (
        ["NoneType"] * 3 + ["InvalidSignature", "NoneType", "CancelledError"] + ["NoneType"] * 4,
        True,
        True,
    ) == (kinds, after.exception() is None, isinstance(forged.exception(), InvalidSignature))


def signed(n: int) -> list[tuple[str, dict[str, Any], object]]:
    """``n`` checks of MEMBER's signatures, every third one forged."""
    out: list[tuple[str, dict[str, Any], object]] = []
    for i in range(n):
        message = {"i": i}
        keys = STRANGER if i % 3 == 2 else MEMBER
        out.append((MEMBER.node_id, message, keys.sign_object(message)))
    return out


def expected(checks: list[tuple[str, dict[str, Any], object]]) -> list[str]:
    """What each check should give."""
    return ["InvalidSignature" if i % 3 == 2 else "NoneType" for i in range(len(checks))]


async def outcomes(
    worker: SignatureWorker, checks: list[tuple[str, dict[str, Any], object]]
) -> list[str]:
    """The outcome of each check asked for in one turn."""
    done = await asyncio.gather(*(worker.check(*c) for c in checks), return_exceptions=True)
    return [type(d).__name__ for d in done]


async def test_a_turns_checks_go_in_batches_answered_one_by_one() -> None:
    """32 checks asked for in one turn (32 connections' calls) go to the checker as 8
    batches of 4, each written as soon as it is whole, not as one at the end of the
    turn: the checker starts at once and answers each batch when it is checked, so the
    loop can answer the first calls while it checks the rest. Every outcome is as
    expected."""
    worker = SignatureWorker()
    checks = signed(3)  # the checker started, and warm
    assert await outcomes(worker, checks) == expected(checks)
    checks = signed(32)
    futures = [worker.check(*c) for c in checks]
    sizes = worker.batches_at_checker  # written while the turn asks for more
    done = await asyncio.gather(*futures, return_exceptions=True)
    worker.close()
    assert (sizes, [type(d).__name__ for d in done]) == ([4] * 8, expected(checks))


async def test_a_dead_checker_is_replaced_and_what_it_held_is_checked_on_the_loop() -> None:
    """Checks sent to a checker that died get their outcomes all the same, and the next
    batch starts a new checker; past the bound and after the last start, checks are made
    on the loop."""
    worker = SignatureWorker(max_batch=8, max_in_flight=16)
    checks = signed(12)
    first = await outcomes(worker, checks)
    pid = worker.checker_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    second = await outcomes(worker, checks)  # written to the dead checker, or seen to be dead
    third = await outcomes(worker, checks)
    starts = worker.starts
    over = await outcomes(worker, signed(20))  # 20 > max_in_flight: on the loop
    worker.close()
    assert (first, second, third, starts, worker.starts) == (
        expected(checks),
        expected(checks),
        expected(checks),
        2,
        2,
    )
    assert over == expected(signed(20))


def test_the_checker_answers_one_byte_per_check_in_order() -> None:
    """A batch of a good, a forged and a cut-short check: 1, 0, 0."""
    message = {"a": 1}
    good = check_bytes(MEMBER.node_id, message, MEMBER.sign_object(message))
    forged = check_bytes(MEMBER.node_id, message, STRANGER.sign_object(message))
    assert answers(good + forged + good[:-1]) == b"\0\0\0\3\1\0\0"
