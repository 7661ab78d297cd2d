"""One CLI convention (spec §9, docs/cli.md): tables for people, ``--json`` on every command
with the documented fields, errors that say what to type, exit codes 0/1/2/3/4; against a
real node process."""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from hearthnet.cli import build_parser, main
from hearthnet.identity import load_or_create_keys
from spark_federation.cli import build_parser as mesh_health_parser
from tests.helpers import NodeProcess, hearthnet_cmd, run_cli, start_node_process
from tests.integration.mesh_cluster import MESH_ARGS, invite


@pytest.fixture(scope="module")
def node_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One node process for the module (the commands here change nothing it keeps)."""
    proc = start_node_process(tmp_path_factory.mktemp("cli-output") / "data", "--no-zeroconf")
    try:
        yield proc
    finally:
        proc.stop()


def leaf_commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every runnable subcommand, with its words."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
    for action in subs:
        for name, child in action.choices.items():
            yield from leaf_commands(child, (*path, name))


def test_every_command_has_json() -> None:
    """Every subcommand takes --json; ``mesh health`` through its own parser, which
    ``hearthnet mesh health`` hands its words to."""
    own: dict[tuple[str, ...], argparse.ArgumentParser] = {("mesh", "health"): mesh_health_parser()}
    missing = [
        " ".join(words)
        for words, parser in leaf_commands(build_parser())
        if not any("--json" in a.option_strings for a in own.get(words, parser)._actions)
    ]
    assert [] == missing


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run the command in this process (against the node process): exit code, out, err."""
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_people_get_tables_and_scripts_get_the_documented_json(
    node_proc: NodeProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """pub, topics, peers, community show, keys show, config show, token issue, call: a
    sentence or table by default, the fields of docs/cli.md with --json."""
    d = ("--data-dir", str(node_proc.data_dir))
    runs = [
        cli(capsys, *args)
        for args in (
            ("pub", "out.t", "--data", '{"i": 1}', *d),
            ("pub", "out.t", "--data", "2", "--json", *d),
            ("topics", *d),
            ("topics", "--json", *d),
            ("peers", *d),
            ("peers", "--json", *d),
            ("community", "show", *d),
            ("community", "show", "--json", *d),
            ("keys", "show", "--json", *d),
            ("config", "show", "--json", *d),
            ("token", "issue", "--scope", "sub:out.*", "--json", *d),
            ("call", "echo@1.0", "--body", '{"a": 1}', "--json", *d),
        )
    ]
    assert [(0, "")] * 12 == [(code, err) for code, _, err in runs]
    pub, pub_json, topics, topics_json, peers, peers_json, show, show_json, *rest = (
        out for _, out, _ in runs
    )
    keys, config, token, call = (json.loads(out) for out in rest)
    node = node_proc.fields["node"]
    assert (
        "published to out.t at seq 1 (id ",
        {"topic": "out.t", "seq": 2},
        ["topic", "messages", "head_seq", "subscribers", "presence"],
        [("out.t", 2)],
        "no peers known\n",
        {"node": node, "url": node_proc.url, "peers": []},
        ["node", "level", "role", "name"],
        ["community", "founder", "members", "name", "pubsub_rules", "revoked"],
        (node, str(node_proc.data_dir)),
        ["community", "exp_ms", "iss", "jti", "scopes", "sub", "token"],
        ({"echo": {"a": 1}}, node),
    ) == (
        pub[:32],
        {k: v for k, v in json.loads(pub_json).items() if k in ("topic", "seq")},
        topics.split("\n")[0].split(),
        [(t["topic"], t["messages"]) for t in json.loads(topics_json)["topics"]],
        peers,
        json.loads(peers_json),
        show.split("\n")[4].split(),
        sorted(json.loads(show_json)),
        (keys["node"], config["node"]["data_dir"]),
        sorted(token),
        (call["output"], call["meta"]["node"]),
    )


def test_errors_say_what_to_type_and_exit_by_kind(
    tmp_path: Path, node_proc: NodeProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stream called without --stream is a usage error naming the fix (2); an unknown
    capability lists what is offered (1); a stranger's key is told to use a member's data
    dir (4); nothing listening says how to start a node (3); --json errors are objects.
    The process's exit code is the one main() returns."""
    d = ("--data-dir", str(node_proc.data_dir))
    stranger = tmp_path / "stranger"
    load_or_create_keys(stranger)
    usage = run_cli("call", "echo.stream@1.0", "--body", '{"count": 1}', *d)
    usage_json, missing, auth, silent = (
        cli(capsys, *args)
        for args in (
            ("call", "echo.stream@1.0", "--body", '{"count": 1}', "--json", *d),
            ("call", "nope@1.0", *d),
            ("call", "echo@1.0", "--data-dir", str(stranger), "--url", node_proc.url),
            ("topics", "--data-dir", str(stranger), "--url", "http://127.0.0.1:1", "--json"),
        )
    )
    assert (2, 2, 1, 4, 3) == (
        usage.returncode,
        *(r[0] for r in (usage_json, missing, auth, silent)),
    )
    assert (
        "hearthnet: echo.stream@1.0 streams its answer: add --stream "
        "(hearthnet call echo.stream@1.0 --stream --body JSON)\n",
        "usage",
        True,
        True,
        "node_not_running",
        True,
    ) == (
        usage.stderr,
        json.loads(usage_json[2])["error"],
        "the mesh offers: echo.stream@1.0, echo@1.0, mesh.peers@1.0" in missing[2],
        "use the --data-dir of a member" in auth[2],
        json.loads(silent[2])["error"],
        "hearthnet node start" in json.loads(silent[2])["message"],
    )


def test_mistakes_name_the_fix(
    tmp_path: Path, node_proc: NodeProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    """--json before the command works; --data that is not JSON, a NodeID that is not one, a
    malformed token to revoke and an agreement ID that is not one are usage errors (2)
    showing the right form; a bad --token to the bridge (stdin at /dev/null) and a damaged
    invite (4) say what to pass, not to change the data dir."""
    d = ("--data-dir", str(node_proc.data_dir))
    # those that need a process of their own (stdin; a node start) run meanwhile
    bridge, join = (
        subprocess.Popen(
            hearthnet_cmd(*args),
            stdin=subprocess.DEVNULL,  # /dev/null (which once aborted the bridge)
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in (
            ("bridge", "--token", "hnt1:garbage", *d),
            ("node", "start", "--data-dir", str(tmp_path / "new"), "--host", "127.0.0.1",
             "--port", "0", "--no-zeroconf", "--join", "hn1:eyJib290"),
        )
    )  # fmt: skip
    flag_first, token, agreement = (
        cli(capsys, *args)
        for args in (
            ("--json", "node", "status", *d),
            ("token", "revoke", "hnt1:garbage", *d),
            ("federation", "revoke", "NOSUCH", *d),
        )
    )
    refused = []
    for args in (
        ("pub", "x", "--data", "hello"),
        ("call", "echo", "--target", "ed25519:nosuch"),
        ("community", "revoke", "bob"),
    ):
        with pytest.raises(SystemExit) as usage:
            main([*args, *d])
        refused.append((usage.value.code, capsys.readouterr().err.rpartition(" (")[2]))
    bridge_err, join_err = (p.communicate(timeout=60)[1] for p in (bridge, join))
    assert (0, 2, 2, 4, 4) == (
        flag_first[0],
        token[0],
        agreement[0],
        bridge.returncode,
        join.returncode,
    )
    quote = """quote it for the shell, keys and strings in double quotes: '{"text": "hi"}', a"""
    shows = "ed25519:... as hearthnet peers or hearthnet community show print it)\n"
    alone = """ string alone '"hi"'; "-" reads it from stdin)\n"""
    assert [(2, quote + alone), (2, shows), (2, shows)] == refused
    assert (node_proc.fields["node"], True, True, True, False, True) == (
        json.loads(flag_first[1])["node"],
        "pass the whole hnt1:... that hearthnet token issue printed" in token[2],
        "hearthnet federation list shows them" in agreement[2],
        "hearthnet token issue --scope" in bridge_err,
        "--data-dir" in bridge_err,
        "give --join the whole hn1:... that hearthnet community invite printed" in join_err,
    )


def test_community_show_tells_the_founder_from_the_community(tmp_path: Path) -> None:
    """`community show` after `community create "Smith Family"`: the community is named
    Smith Family and founded by "this node", whose row carries the node's own name (the
    founder's row was named "Smith Family", after the community); on a member's node the
    founder is named by its NodeID and its row has no name (the founding record names
    only the community), the member's row its own."""
    a, m = tmp_path / "a", tmp_path / "m"
    created = run_cli("community", "create", "Smith Family", "--data-dir", str(a))
    assert created.returncode == 0, created.stderr
    anchor = start_node_process(a, *MESH_ARGS, "--name", "kitchen")
    try:
        member = start_node_process(
            m, *MESH_ARGS, "--name", "attic", "--join", invite(a, anchor.url)
        )
        try:
            on_anchor = run_cli("community", "show", "--data-dir", str(a))
            on_member = run_cli("community", "show", "--json", "--data-dir", str(m))
        finally:
            member.stop()
    finally:
        anchor.stop()
    founder, joined = anchor.fields["node"], member.fields["node"]
    lines = on_anchor.stdout.splitlines()
    rows = {line.split()[0]: line.split()[-1] for line in lines[5:] if line.startswith("ed25519:")}
    shown = json.loads(on_member.stdout)
    assert (
        ["name       Smith Family", "founder    this node"],
        {founder: "kitchen", joined: "attic"},
    ) == (lines[1:3], rows)
    assert ("Smith Family", founder, {founder: None, joined: "attic"}) == (
        shown["name"],
        shown["founder"],
        {row["node"]: row["name"] for row in shown["members"]},
    )
    member_lines = run_cli("community", "show", "--data-dir", str(m)).stdout.splitlines()
    assert f"founder    {founder}" == member_lines[2]
