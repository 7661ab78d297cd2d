"""The ``hearthnet`` command against real node processes (spec §9)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hearthnet.cli import main
from hearthnet.client import Client
from hearthnet.errors import Revoked
from hearthnet.identity import load_or_create_keys
from hearthnet.subscription import Delivery, Gap
from hearthnet.tokens import CapabilityToken
from tests.helpers import NodeProcess, free_port, hearthnet_cmd, run_cli, start_node_process
from tests.integration.mesh_cluster import MESH_ARGS, invite


@pytest.fixture(scope="module")
def node_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A node process on a free loopback port, shared by the module's tests (each uses
    topics and tokens of its own)."""
    proc = start_node_process(tmp_path_factory.mktemp("cli-node") / "data")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def fresh_node_proc(tmp_path: Path) -> Iterator[NodeProcess]:
    """A node process of the test's own (whose log's sequence numbers start at 1)."""
    proc = start_node_process(tmp_path / "data")
    try:
        yield proc
    finally:
        proc.stop()


def test_ready_line_and_run_file(node_proc: NodeProcess) -> None:
    """The ready line names url/node/community; run/node.json matches it."""
    fields = node_proc.fields
    info = json.loads((node_proc.data_dir / "run" / "node.json").read_text())
    keys = load_or_create_keys(node_proc.data_dir)
    assert (fields["url"], keys.node_id, keys.node_id, node_proc.proc.pid) == (
        info["url"],
        fields["node"],
        fields["community"],
        info["pid"],
    )
    assert fields["url"].startswith("http://127.0.0.1:")
    assert not fields["url"].endswith(":0")


def test_status_call_keys_config(node_proc: NodeProcess) -> None:
    """node status, call (unary and stream), keys show and config show work against the node."""
    d = str(node_proc.data_dir)
    status = run_cli("node", "status", "--json", "--data-dir", d)
    echo = run_cli("call", "echo@1.0", "--body", '{"hi": 1}', "--data-dir", d)
    stream = run_cli("call", "echo.stream", "--body", '{"count": 2}', "--stream", "--data-dir", d)
    keys = run_cli("keys", "show", "--json", "--data-dir", d)
    config = run_cli("config", "show", "--data-dir", d)
    assert [0, 0, 0, 0, 0] == [p.returncode for p in (status, echo, stream, keys, config)]
    assert (
        node_proc.fields["node"],
        {"echo": {"hi": 1}},
        ["token", "token", "done"],
        node_proc.fields["node"],
    ) == (
        json.loads(status.stdout)["node"],
        json.loads(echo.stdout),
        [json.loads(line)["event"] for line in stream.stdout.splitlines()],
        json.loads(keys.stdout)["node"],
    )
    assert "[transport]" in config.stdout
    assert f'data_dir = "{d}"' in config.stdout


async def test_issued_token_works_for_a_client(node_proc: NodeProcess) -> None:
    """`token issue --scope call:echo` prints a token alone; a client calls with it."""
    issued = run_cli(
        "token",
        "issue",
        "--scope",
        "call:echo",
        "--ttl",
        "10m",
        "--data-dir",
        str(node_proc.data_dir),
    )
    token = issued.stdout.strip()
    assert (0, 1, True) == (
        issued.returncode,
        len(issued.stdout.splitlines()),
        token.startswith("hnt1:"),
    )
    async with Client(node_proc.url, token=token) as client:
        assert {"echo": "via token"} == await client.call("echo@1", "via token")


def test_node_stop_sigterm_shuts_down_within_5s_and_removes_run_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """hearthnet node stop sends SIGTERM: exit code 0 within 5 s, run file removed; a second
    node stop finds no node (exit 3)."""
    proc = start_node_process(tmp_path / "d")
    try:
        started = time.monotonic()
        stopped = main(["node", "stop", "--data-dir", str(tmp_path / "d"), "--json"])
        out = capsys.readouterr().out
        proc.proc.wait(timeout=10)
        elapsed = time.monotonic() - started
    finally:
        code = proc.stop()  # closes its pipe; signals it only if it still runs
    again = main(["node", "stop", "--data-dir", str(tmp_path / "d")])
    assert (0, {"stopped": proc.fields["node"], "pid": proc.proc.pid}, 0, True, False, 3) == (
        stopped,
        json.loads(out),
        code,
        elapsed < 5,
        (tmp_path / "d" / "run" / "node.json").exists(),
        again,
    )


def test_sigint_with_a_stream_running(tmp_path: Path) -> None:
    """SIGINT while a client streams: the stream gets a final frame and the node exits 0 in 5 s."""
    proc = start_node_process(tmp_path / "d")
    streamer = subprocess.Popen(
        hearthnet_cmd(
            "call",
            "echo.stream",
            "--body",
            '{"count": 100000, "interval_ms": 5}',
            "--stream",
            "--data-dir",
            str(tmp_path / "d"),
        ),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert streamer.stdout is not None
    first = streamer.stdout.readline()
    started = time.monotonic()
    code = proc.stop(signal.SIGINT)
    elapsed = time.monotonic() - started
    rest, _ = streamer.communicate(timeout=10)
    last = json.loads(rest.strip().splitlines()[-1])
    assert ("token", 0, True, ("error", "unavailable")) == (
        json.loads(first)["event"],
        code,
        elapsed < 5,
        (last["event"], last["data"]["code"]),
    )


def test_second_node_on_same_data_dir_refused(node_proc: NodeProcess) -> None:
    """Two nodes cannot share a data directory."""
    result = run_cli(
        "node", "start", "--data-dir", str(node_proc.data_dir), "--port", "0", "--host", "127.0.0.1"
    )
    assert (1, True) == (result.returncode, "another node is running" in result.stderr)


def test_group_readable_key_refuses_to_start(tmp_path: Path) -> None:
    """A seed file readable by others stops start-up with exit 1 and the fix in the message."""
    load_or_create_keys(tmp_path)
    os.chmod(tmp_path / "keys" / "node.ed25519", 0o644)
    result = run_cli(
        "node", "start", "--data-dir", str(tmp_path), "--port", "0", "--host", "127.0.0.1"
    )
    assert (1, True) == (result.returncode, "chmod 600" in result.stderr)


def test_exit_codes(tmp_path: Path, node_proc: NodeProcess) -> None:
    """3 when no node runs, 2 on usage errors, 1 on a refused call, 4 on an auth failure."""
    no_node = run_cli("node", "status", "--data-dir", str(tmp_path / "empty"))
    usage = run_cli("call")
    refused = run_cli("call", "nope@1.0", "--data-dir", str(node_proc.data_dir))
    other = tmp_path / "other"
    load_or_create_keys(other)  # a stranger's keys: not a member of the node's community
    auth = run_cli("call", "echo@1.0", "--data-dir", str(other), "--url", node_proc.url)
    streams = [
        run_cli(
            "call", "echo.stream@1.0", "--stream", *transport,
            "--body", '{"count": 2}', "--data-dir", str(other), "--url", node_proc.url,
        )
        for transport in ((), ("--sse",))
    ]  # fmt: skip
    assert [3, 2, 1, 4, 4, 4] == [p.returncode for p in (no_node, usage, refused, auth, *streams)]
    assert "unauthorized" in auth.stderr
    assert "not_found" in refused.stderr


def test_exit_codes_for_a_silent_url_and_bad_arguments(node_proc: NodeProcess) -> None:
    """Nothing listening at --url is 3 (node not running), whatever the command; a bad
    cursor, scope or token lifetime is a usage error (2), caught before anything runs."""
    d = str(node_proc.data_dir)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        silent = f"http://127.0.0.1:{s.getsockname()[1]}"
    codes = [
        run_cli(*args).returncode
        for args in (
            ("node", "status", "--url", silent),
            ("pub", "x", "--data", "1", "--url", silent, "--data-dir", d),
            ("sub", "x", "--url", silent, "--data-dir", d),
            ("sub", "x", "--since", "abc", "--data-dir", d),
            ("token", "issue", "--scope", "bogus", "--data-dir", d),
            ("token", "issue", "--scope", "sub:x", "--ttl", "0s", "--data-dir", d),
        )
    ]
    assert codes == [3, 3, 3, 2, 2, 2]


def test_node_status_of_another_node_needs_no_keys_here(node_proc: NodeProcess) -> None:
    """`node status --url` reads the public status page: it works on a machine (here: the
    test's empty home) that holds no keys of its own, and makes none."""
    result = run_cli("node", "status", "--url", node_proc.url, "--json")
    home_data = Path(os.environ["HOME"]) / ".local" / "share" / "hearthnet"
    assert (0, node_proc.fields["node"], False) == (
        result.returncode,
        json.loads(result.stdout)["node"],
        home_data.exists(),
    )


def test_commands_that_read_an_identity_do_not_make_one(tmp_path: Path) -> None:
    """A mistyped --data-dir is an error, not a new identity and community."""
    empty = tmp_path / "typo"
    results = [
        run_cli(*args, "--data-dir", str(empty))
        for args in (
            ("community", "show"),
            ("community", "invite"),
            ("token", "issue", "--scope", "sub:x"),
            ("heartbeat", "export", "--out", str(tmp_path / "out")),
            ("keys", "show"),
        )
    ]
    assert [(1, True)] * len(results) == [(r.returncode, "no keys in" in r.stderr) for r in results]
    assert not (empty / "keys").exists()


def test_pub_sub_topics_from_the_command_line(fresh_node_proc: NodeProcess) -> None:
    """`sub --last` prints the backlog then live messages as JSON lines; `topics` lists;
    `pub --data -` reads the payload from stdin."""
    d = str(fresh_node_proc.data_dir)
    assert run_cli("pub", "cli.t", "--data", json.dumps({"i": 0}), "--data-dir", d).returncode == 0
    piped = run_cli("pub", "cli.t", "--data", "-", "--data-dir", d, stdin=json.dumps({"i": 1}))
    assert piped.returncode == 0
    not_json = run_cli("pub", "cli.t", "--data", "-", "--data-dir", d, stdin="hello")
    assert (2, True) == (not_json.returncode, "stdin is not one JSON value" in not_json.stderr)
    sub = subprocess.Popen(
        hearthnet_cmd("sub", "cli.*", "--last", "5", "--count", "3", "--data-dir", d),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert sub.stdout is not None
        first = [json.loads(sub.stdout.readline()) for _ in range(2)]  # the backlog
        pub = run_cli("pub", "cli.t", "--type", "note", "--data", '{"i": 2}', "--data-dir", d)
        out, err = sub.communicate(timeout=30)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
    lines = first + [json.loads(line) for line in out.splitlines()]
    topics = run_cli("topics", "--json", "--data-dir", d)
    # The node's own mesh.* topics (a beacon every 30 s) are not what this test publishes.
    listed = {
        t["topic"]: t["messages"]
        for t in json.loads(topics.stdout)["topics"]
        if not t["topic"].startswith("mesh.")
    }
    assert (sub.returncode, pub.returncode, topics.returncode) == (0, 0, 0), err
    assert [(x["seq"], x["topic"], x["type"], x["data"]) for x in lines] == [
        (1, "cli.t", "message", {"i": 0}),
        (2, "cli.t", "message", {"i": 1}),
        (3, "cli.t", "note", {"i": 2}),
    ]
    assert listed == {"cli.t": 3}


def test_sub_lines_carry_the_epoch_to_resume_with(node_proc: NodeProcess) -> None:
    """A `sub` line's `epoch` and `seq` given back as `--since EPOCH:SEQ` resume right
    after that message."""
    d = str(node_proc.data_dir)
    for i in range(3):
        assert (
            run_cli("pub", "cli.e", "--data", json.dumps({"i": i}), "--data-dir", d).returncode == 0
        )
    first = run_cli("sub", "cli.e", "--last", "3", "--count", "1", "--data-dir", d)
    line = json.loads(first.stdout.splitlines()[0])
    rest = run_cli(
        "sub",
        "cli.e",
        "--since",
        f"{line['epoch']}:{line['seq']}",
        "--count",
        "2",
        "--data-dir",
        d,
    )
    assert (0, 0) == (first.returncode, rest.returncode), first.stderr + rest.stderr
    assert [{"i": 1}, {"i": 2}] == [json.loads(x)["data"] for x in rest.stdout.splitlines()]
    assert {line["epoch"]} == {json.loads(x)["epoch"] for x in rest.stdout.splitlines()}


def test_sub_says_when_its_start_was_not_honoured(node_proc: NodeProcess) -> None:
    """`sub --since` with an epoch not the node's prints a `reset` line (not counted by
    `--count`), then goes live: the next message published is the one counted."""
    d = str(node_proc.data_dir)
    sub = subprocess.Popen(
        hearthnet_cmd("sub", "cli.r", "--since", "00000:1", "--count", "1", "--data-dir", d),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sub.stdout is not None
        ready, _, _ = select.select([sub.stdout], [], [], 30)
        first = json.loads(sub.stdout.readline()) if ready else None
        codes = set()
        for i in range(10):  # until the live subscription takes one (a loaded node is slow)
            codes.add(run_cli("pub", "cli.r", "--data", '{"live": 1}', "--data-dir", d).returncode)
            with contextlib.suppress(subprocess.TimeoutExpired):
                sub.wait(timeout=1 + i)
                break
        rest, _ = sub.communicate(timeout=30)
    finally:
        sub.kill()
    assert first is not None
    line = json.loads(rest)
    reset = {"reason": "epoch_changed", "since": {"epoch": "00000", "seq": 1}}
    assert (reset, {0}, 0, {"live": 1}, first["epoch"]) == (
        {k: first["reset"][k] for k in ("reason", "since")},
        codes,
        sub.returncode,
        line["data"],
        line["epoch"],
    )


@pytest.mark.parametrize(
    ("cursor", "why"),
    [
        ("1:2:3", "one ':' at most"),
        (":5", "no EPOCH before ':'"),
        (":", "no EPOCH before ':'"),
        ("abc:", "SEQ is a whole number, 0 or more"),
        ("", "SEQ is a whole number, 0 or more"),
        ("-1", "SEQ is a whole number, 0 or more"),
        ("abc:-1", "SEQ is a whole number, 0 or more"),
        ("1.5", "SEQ is a whole number, 0 or more"),
        ("+3", "SEQ is a whole number, 0 or more"),
        ("\u0663", "SEQ is a whole number, 0 or more"),  # an Arabic-Indic 3: not ASCII
        ("a b:1", "an EPOCH has no spaces"),
        (str(2**53), "SEQ is at most 2^53-1"),
    ],
)
def test_sub_since_takes_seq_or_epoch_seq_only(
    node_proc: NodeProcess, cursor: str, why: str
) -> None:
    """`sub --since` takes `SEQ` or `EPOCH:SEQ` and refuses anything else as a usage
    error that names both forms and what is wrong, before anything is sent (a cursor
    `1:2:3` was sent as epoch `1:2` and got a reset; `:5` dropped its epoch; a seq past
    2^53 ended in a traceback)."""
    done = run_cli(
        "sub", "cli.m", "--since", cursor, "--data-dir", str(node_proc.data_dir), timeout=30
    )
    err = done.stderr.splitlines()[-1] if done.stderr else ""
    expected = f"hearthnet sub: error: argument --since: not SEQ or EPOCH:SEQ: {cursor!r} ({why};"
    assert (2, expected, "") == (done.returncode, err[: len(expected)], done.stdout)


@pytest.mark.parametrize("ts", ["-5", str(2**64), "1.5", ""])
def test_sub_since_ts_takes_unix_ms_only(node_proc: NodeProcess, ts: str) -> None:
    """`sub --since-ts` takes a Unix time in ms the node can take (0 to 2^53-1); anything
    else is a usage error before anything is sent (a negative one was the node's
    bad_request, one past 64 bits a traceback)."""
    done = run_cli("sub", "cli.m", "--since-ts", ts, "--data-dir", str(node_proc.data_dir))
    expected = f"hearthnet sub: error: argument --since-ts: not a time in Unix ms: {ts!r}"
    err = done.stderr.splitlines()[-1] if done.stderr else ""
    assert (2, expected) == (done.returncode, err[: len(expected)])


def test_sub_since_takes_the_largest_seq(node_proc: NodeProcess) -> None:
    """The largest seq the node takes (2^53-1) is passed on: the node answers
    `cursor_ahead`, not a usage error or a traceback."""
    d = str(node_proc.data_dir)
    sub = subprocess.Popen(
        hearthnet_cmd("sub", "cli.big", "--since", str(2**53 - 1), "--data-dir", d),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert sub.stdout is not None
        ready, _, _ = select.select([sub.stdout], [], [], 30)
        first = json.loads(sub.stdout.readline()) if ready else None
    finally:
        sub.kill()
        sub.communicate(timeout=30)
    assert first is not None
    assert ("cursor_ahead", 2**53 - 1) == (first["reset"]["reason"], first["reset"]["since"]["seq"])


def test_sub_full_carries_sig_only_with_verify(node_proc: NodeProcess) -> None:
    """`sub --full` prints envelopes without `sig`; with `--verify` they keep it (checked)."""
    d = str(node_proc.data_dir)
    assert run_cli("pub", "cli.v", "--data", "{}", "--data-dir", d).returncode == 0
    plain, checked = (
        run_cli("sub", "cli.v", "--last", "1", "--count", "1", "--full", *extra, "--data-dir", d)
        for extra in ((), ("--verify",))
    )
    assert (0, 0) == (plain.returncode, checked.returncode), plain.stderr + checked.stderr
    assert (False, True) == tuple(
        "sig" in json.loads(done.stdout.splitlines()[0]) for done in (plain, checked)
    )


async def test_token_revoke_ends_the_tokens_sessions_and_requests(node_proc: NodeProcess) -> None:
    """`token revoke TOKEN` (spec §1.6): its live subscription ends with `revoked`, its
    next request is refused, another token of the same issuer still works."""
    d = str(node_proc.data_dir)
    doomed, other = (
        run_cli("token", "issue", "--scope", "sub:rv.*", "--data-dir", d).stdout.strip()
        for _ in range(2)
    )
    async with Client(node_proc.url, token=doomed) as client, client.subscribe("rv.*") as sub:

        async def first() -> Delivery | Gap:
            return await anext(aiter(sub))

        reader = asyncio.get_running_loop().create_task(first())
        revoked = await asyncio.to_thread(
            run_cli, "token", "revoke", doomed, "--json", "--data-dir", d
        )
        with pytest.raises(Revoked):
            await asyncio.wait_for(reader, timeout=10)
        with pytest.raises(Revoked):
            await client.request_json("GET", "/pubsub/v1/topics/rv.a/history")
    async with Client(node_proc.url, token=other) as client:
        assert (await client.request_json("GET", "/pubsub/v1/topics/rv.a/history"))[
            "messages"
        ] == []
    assert revoked.returncode == 0, revoked.stderr
    assert json.loads(revoked.stdout)["revoked"] == CapabilityToken.decode(doomed).jti


def test_anchor_only_commands_on_a_member_node_are_forbidden(tmp_path: Path) -> None:
    """Finding 6: on a plain member's node, `community rules` and `community revoke` are
    refused by the node (forbidden, spec §1.5); the CLI says so, naming the fix, and exits
    1, and the anchor's node never hears of them."""
    anchor = start_node_process(tmp_path / "a", *MESH_ARGS)
    try:
        member = start_node_process(
            tmp_path / "m", *MESH_ARGS, "--join", invite(tmp_path / "a", anchor.url)
        )
        try:
            rules_file = tmp_path / "rules.toml"
            rules_file.write_text(
                '[[pubsub.rules]]\npattern = "**"\nsubscribe = "any"\npublish = "any"\n'
            )
            m = str(member.data_dir)
            rules = run_cli("community", "rules", str(rules_file), "--data-dir", m)
            revoke = run_cli("community", "revoke", anchor.fields["node"], "--data-dir", m)
            rotate = run_cli("topic", "rotate", "chat.**", "--data-dir", m)
            records_on_member = len(
                (member.data_dir / "community" / "records.jsonl").read_text().splitlines()
            )
        finally:
            member.stop()
        shown = json.loads(
            run_cli("community", "show", "--json", "--data-dir", str(anchor.data_dir)).stdout
        )
    finally:
        anchor.stop()
    assert [(1, True, True)] * 3 == [
        (
            p.returncode,
            "forbidden" in p.stderr,
            "anchors only: run it with the --data-dir" in p.stderr,
        )
        for p in (rules, revoke, rotate)
    ], (rules.stderr, revoke.stderr, rotate.stderr)
    assert ("", "", None, [], 2) == (
        rules.stdout,
        revoke.stdout,
        shown["pubsub_rules"],
        shown["revoked"],
        records_on_member,
    )


async def test_topic_rotate_voids_tokens_issued_before(node_proc: NodeProcess) -> None:
    """`topic rotate PATTERN` on an anchor: a token for those topics issued before is
    refused (revoked) from then on; one issued after, or for other topics, still works."""
    d = str(node_proc.data_dir)
    old, other = (
        run_cli("token", "issue", "--scope", scope, "--data-dir", d).stdout.strip()
        for scope in ("sub:rot.**", "sub:keep.**")
    )
    rotated = run_cli("topic", "rotate", "rot.**", "--data-dir", d)
    fresh = run_cli("token", "issue", "--scope", "sub:rot.**", "--data-dir", d).stdout.strip()
    outcomes = []
    for token, topic in ((old, "rot.a"), (fresh, "rot.a"), (other, "keep.a")):
        async with Client(node_proc.url, token=token) as client:
            try:
                await client.request_json("GET", f"/pubsub/v1/topics/{topic}/history")
                outcomes.append("ok")
            except Revoked as exc:
                outcomes.append(exc.code)
    assert (0, ["revoked", "ok", "ok"]) == (rotated.returncode, outcomes), rotated.stderr


def test_a_call_to_a_node_this_node_has_no_link_to_says_where_to_look(
    node_proc: NodeProcess,
) -> None:
    """``call --target`` a NodeID the node is not linked with: exit 1, ``unavailable``,
    and the message points at ``hearthnet peers``."""
    nobody = "ed25519:" + "A" * 43
    done = run_cli(
        *("call", "echo@1.0", "--body", "{}", "--target", nobody, "--json"),
        *("--data-dir", str(node_proc.data_dir)),
    )
    error = json.loads(done.stderr)
    assert (1, "unavailable") == (done.returncode, error["error"])
    assert "hearthnet peers lists the nodes" in error["message"]


def test_sub_consumer_count_acks_what_it_printed(node_proc: NodeProcess) -> None:
    """`sub --consumer NAME --count N` takes N messages off the consumer: the next run
    goes on after them (a worker script taking one job at a time never gets the same
    job twice when it exits cleanly)."""
    d = str(node_proc.data_dir)
    for i in range(3):
        assert (
            run_cli("pub", "cli.jobs", "--data", json.dumps({"i": i}), "--data-dir", d).returncode
            == 0
        )
    took = [
        run_cli("sub", "cli.jobs", "--consumer", "w1", *start, "--count", "1", "--data-dir", d)
        for start in (("--since", "0"), (), ())
    ]
    assert [0, 0, 0] == [t.returncode for t in took], [t.stderr for t in took]
    assert [{"i": 0}, {"i": 1}, {"i": 2}] == [json.loads(t.stdout)["data"] for t in took]


def test_consumer_list_and_rm(node_proc: NodeProcess) -> None:
    """`consumer list` shows a durable consumer with what it has pending; `consumer rm`
    forgets it (the list no longer has it; a second rm is not_found, exit 1)."""
    d = str(node_proc.data_dir)
    for i in range(2):
        run_cli("pub", "cli.rm", "--data", json.dumps({"i": i}), "--data-dir", d)
    took = run_cli(
        "sub", "cli.rm", "--consumer", "gone", "--since", "0", "--count", "1", "--data-dir", d
    )
    listed = run_cli("consumer", "list", "--json", "--data-dir", d)
    table = run_cli("consumer", "list", "--data-dir", d)
    removed = run_cli("consumer", "rm", "gone", "--data-dir", d)
    again = run_cli("consumer", "rm", "gone", "--data-dir", d)
    after = run_cli("consumer", "list", "--json", "--data-dir", d)
    row = next(c for c in json.loads(listed.stdout)["consumers"] if c["name"] == "gone")
    assert (0, 0, 0, 0, 1) == tuple(r.returncode for r in (took, listed, table, removed, again)), (
        removed.stderr,
        again.stderr,
    )
    assert (["cli.rm"], 1, False, True, True, "not_found") == (
        row["topics"],
        row["pending"],
        row["held"],
        "gone" in table.stdout,
        "deleted consumer gone" in removed.stdout,
        again.stderr.split(":")[1].strip(),
    )
    assert "gone" not in [c["name"] for c in json.loads(after.stdout)["consumers"]]


def test_sub_of_a_consumer_deleted_under_it_says_deleted(node_proc: NodeProcess) -> None:
    """`consumer rm` of a consumer a `sub` holds ends that sub (exit 1) saying the consumer
    was deleted, not "taken over by another connection" (both are close 4409)."""
    d = str(node_proc.data_dir)
    sub = subprocess.Popen(
        hearthnet_cmd("sub", "cli.del", "--consumer", "held", "--data-dir", d),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until the node holds it for the sub
            listed = run_cli("consumer", "list", "--json", "--data-dir", d)
            rows = json.loads(listed.stdout or "{}").get("consumers", [])
            if any(c["name"] == "held" and c["held"] for c in rows):
                break
            time.sleep(0.2)
        removed = run_cli("consumer", "rm", "held", "--data-dir", d)
        _, err = sub.communicate(timeout=30)
    finally:
        sub.kill()
    deleted = "hearthnet: unavailable: this durable consumer was deleted on the node"
    assert (0, 1, deleted) == (removed.returncode, sub.returncode, err.strip()[: len(deleted)])


def test_sub_says_when_the_node_went_away_and_when_it_is_back(tmp_path: Path) -> None:
    """`sub` keeps its stdout for messages, and says on stderr that the node went away
    and that it resumed (a user watching it otherwise sees nothing while it retries);
    the message published after the restart arrives."""
    port = str(free_port())
    data = tmp_path / "data"
    node = start_node_process(data, "--port", port)
    sub = subprocess.Popen(
        hearthnet_cmd("sub", "cli.back", "--count", "1", "--data-dir", str(data)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(100):  # until the subscription is in place
            status = json.loads(run_cli("node", "status", "--json", "--data-dir", str(data)).stdout)
            if status["subscribers"]:
                break
            time.sleep(0.1)
        node.stop()
        node = start_node_process(data, "--port", port)
        for i in range(10):  # until the resumed subscription takes one
            run_cli("pub", "cli.back", "--data", '{"n": 1}', "--data-dir", str(data))
            with contextlib.suppress(subprocess.TimeoutExpired):
                sub.wait(timeout=1 + i)
                break
        out, err = sub.communicate(timeout=30)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait()
        node.stop()
    assert (0, {"n": 1}) == (sub.returncode, json.loads(out.splitlines()[0])["data"]), err
    assert "hearthnet: the node closed the subscription" in err
    assert "hearthnet: subscription resumed" in err
