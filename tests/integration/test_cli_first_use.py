"""What a new user types wrong on a first day with the ``hearthnet`` command, against real
node processes: each mistake is refused before anything runs (exit 2) or by the node, and
the message says what to type instead (docs/cli.md)."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from hearthnet.cli import build_parser
from tests.helpers import NodeProcess, run_cli, start_node_process
from tests.integration.mesh_cluster import MESH_ARGS

URL_FORM = "is not a node URL: write http://host:port or https://host:port"


@pytest.fixture(scope="module")
def node_proc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One node process for the module."""
    proc = start_node_process(tmp_path_factory.mktemp("first-use") / "data", *MESH_ARGS)
    try:
        yield proc
    finally:
        proc.stop()


def test_addresses_that_are_not_urls_are_refused_naming_the_flag_or_key(tmp_path: Path) -> None:
    """A peer, relay or bootstrap address without ``http://`` (``--peer 10.0.0.2:7080``, once
    dropped in silence while the node started alone) and a ``--url`` that is not one (once
    ``unavailable: POST notaurl: notaurl/bus/v1/call``, exit 1) are usage errors naming the
    flag and the form; in a configuration file, an error naming the file and the key."""
    d = ("--data-dir", str(tmp_path / "d"))
    config = tmp_path / "bad.toml"
    config.write_text('[mesh]\npeers = ["10.0.0.2:7080"]\n')
    runs = [
        run_cli(*args)
        for args in (
            ("node", "start", *d, "--peer", "10.0.0.2:7080"),
            ("node", "start", *d, "--relay-url", "relay.example.org"),
            ("node", "start", *d, "--advertise-url", "http://host:notaport"),
            ("node", "start", *d, "--federation-peer", "mesh:bob"),
            ("community", "invite", *d, "--bootstrap", "ftp://x:1"),
            ("call", "echo@1.0", *d, "--url", "notaurl"),
            ("node", "start", *d, "--config", str(config), "--host", "127.0.0.1"),
        )
    ]
    last = runs.pop()
    assert [2] * 6 + [1] == [r.returncode for r in (*runs, last)]
    expected = [
        f"argument --peer: '10.0.0.2:7080' {URL_FORM}",
        f"argument --relay-url: 'relay.example.org' {URL_FORM}",
        f"argument --advertise-url: 'http://host:notaport' {URL_FORM}",
        "argument --federation-peer: 'mesh:bob' is not mesh:<NodeID>",
        f"argument --bootstrap: 'ftp://x:1' {URL_FORM}",
        "argument --url: not a node URL: 'notaurl' (http://host:port as the node's ready line",
    ]
    said = [r.stderr.splitlines()[-1].partition("error: ")[2] for r in runs]
    assert expected == [line[: len(want)] for line, want in zip(said, expected, strict=True)]
    assert f"{config} [mesh] peers: '10.0.0.2:7080' {URL_FORM}" in last.stderr
    assert not (tmp_path / "d" / "keys").exists()  # refused before anything was made


def test_a_topic_that_is_not_one_is_a_usage_error_not_a_broken_request(
    node_proc: NodeProcess,
) -> None:
    """``pub`` puts the topic in the request's path: a space once broke the request line
    (``bad_request: malformed request: Bad status line``), ``a/b`` and ``''`` answered
    ``not_found: no route``, and ``a?b`` published nowhere useful; now each is refused with
    the topic grammar before any request, and a bad ``sub`` pattern likewise."""
    d = ("--data-dir", str(node_proc.data_dir))
    runs = [
        run_cli("pub", topic, "--data", "1", *d) for topic in ("a b", "a/b", "", "a?b", "chat.*")
    ]
    pattern = run_cli("sub", "chat room", *d)
    topics = json.loads(run_cli("topics", "--json", *d).stdout)["topics"]
    assert ([2] * 5, 2, []) == (
        [r.returncode for r in runs],
        pattern.returncode,
        [t["topic"] for t in topics if t["topic"].startswith("a")],
    )
    grammar = ": dot-separated segments of [A-Za-z0-9_-], at most 16 (e.g. chat.room.1)"
    assert [f"argument topic: invalid topic {t!r}{grammar}" for t in ("a b", "a/b", "")] == [
        r.stderr.splitlines()[-1].partition("error: ")[2] for r in runs[:3]
    ]
    assert "'chat room': dot-separated segments of [A-Za-z0-9_-], * (one segment)" in (
        pattern.stderr
    )


def test_a_command_group_alone_lists_what_may_follow() -> None:
    """``hearthnet community`` (or ``hearthnet`` alone) once said only "the following
    arguments are required: ACTION"; now it names the actions."""
    bare, group = run_cli(), run_cli("community")
    assert (2, 2) == (bare.returncode, group.returncode)
    assert (
        "required: ACTION (one of: create, invite, revoke, level, rules, show; hearthnet community"
        " --help says what each does)"
    ) in group.stderr
    assert "required: COMMAND (one of: node, call, pub, sub," in bare.stderr


def test_a_call_body_given_without_body_says_to_use_the_flag() -> None:
    """``hearthnet call echo@1.0 '{"hello": "world"}'`` once said only "unrecognized
    arguments"; now it says where a JSON body goes."""
    bare = run_cli("call", "echo@1.0", '{"hello": "world"}')
    assert 2 == bare.returncode
    assert "goes after --body: hearthnet call CAPABILITY --body '{...}'" in bare.stderr


def test_an_invite_used_twice_or_expired_says_to_print_another(
    node_proc: NodeProcess, tmp_path: Path
) -> None:
    """An invite admits one node: a second node started with it once got ``unavailable:
    could not join: URL: unauthorized this invite was already used`` (exit 1); now the
    inviter's refusal as it is (exit 4) saying how to get another. An expired one too."""
    made = run_cli("community", "invite", "--data-dir", str(node_proc.data_dir))
    short = run_cli("community", "invite", "--ttl", "1ms", "--data-dir", str(node_proc.data_dir))
    first = start_node_process(tmp_path / "first", *MESH_ARGS, "--join", made.stdout.strip())
    first.stop()
    again, late = (
        run_cli(
            *("node", "start", "--data-dir", str(tmp_path / name), "--host", "127.0.0.1"),
            *("--port", "0", "--no-zeroconf", "--join", invite.stdout.strip()),
        )
        for name, invite in (("second", made), ("third", short))
    )
    assert (4, 4) == (again.returncode, late.returncode)
    assert (
        "hearthnet: unauthorized: this invite was already used (an invite admits one node:"
        " print another with hearthnet community invite on a member's node)\n",
        "hearthnet: expired: the invite expired (print another with hearthnet community invite"
        " --ttl 24h on a member's node)\n",
    ) == (again.stderr, late.stderr)


def test_an_expired_or_revoked_bridge_token_says_to_issue_another(node_proc: NodeProcess) -> None:
    """``hearthnet bridge --token`` with a token past its lifetime, or revoked, once printed
    only ``expired: token expired`` / ``revoked: token revoked``; now what to type too."""
    d = ("--data-dir", str(node_proc.data_dir))
    short = run_cli("token", "issue", "--scope", "call:echo", "--ttl", "1ms", *d).stdout.strip()
    revoked = run_cli("token", "issue", "--scope", "call:echo", *d).stdout.strip()
    assert 0 == run_cli("token", "revoke", revoked, *d).returncode
    call = '{"type":"call","id":"c1","capability":"echo@1.0","input":{}}\n'
    runs = [run_cli("bridge", "--token", token, *d, stdin=call) for token in (short, revoked)]
    fix = ": hearthnet token issue --scope sub:PATTERN --ttl 1h)\n"
    assert [
        (4, "hearthnet: expired: token expired (the --token's lifetime is over: issue a fresh"
         " one on a member's node" + fix),
        (4, "hearthnet: revoked: token revoked (the --token was revoked: issue a new one on a"
         " member's node" + fix),
    ] == [(r.returncode, r.stderr) for r in runs]  # fmt: skip


def test_counts_issuers_patterns_and_a_silent_console_url_exit_by_kind(
    node_proc: NodeProcess,
) -> None:
    """``sub --count 0`` once waited forever, ``token revoke JTI --iss bob`` signed a
    revocation naming "bob" (exit 0), ``--last -5``, ``--ttl -1``, ``--limit 0`` and a bad
    ``topic rotate`` pattern came back from the node as ``bad_request`` (exit 1): now all
    usage errors (2). ``console --url`` where nothing listens is 3, as for every command."""
    d = ("--data-dir", str(node_proc.data_dir))
    jti = "01M8ETC8W16PCA8JGWFXNC158B"
    runs = [
        run_cli(*args, timeout=30)
        for args in (
            ("sub", "chat.x", "--count", "0", *d),
            ("sub", "chat.x", "--last", "-5", *d),
            ("pub", "chat.x", "--data", "1", "--ttl", "-1", *d),
            ("topics", "--limit", "0", *d),
            ("token", "revoke", jti, "--iss", "bob", *d),
            ("topic", "rotate", "chat room", *d),
            ("console", "--url", "http://127.0.0.1:9", *d),
        )
    ]
    assert [2, 2, 2, 2, 2, 2, 3] == [r.returncode for r in runs]
    assert [
        "argument --count: must be at least 1, not 0",
        "argument --iss: not a NodeID: 'bob'",
        "no node answers at http://127.0.0.1:9; start one with: hearthnet node start",
    ] == [
        runs[0].stderr.splitlines()[-1].partition("error: ")[2],
        runs[4].stderr.splitlines()[-1].partition("error: ")[2][:35],
        runs[6].stderr.partition("hearthnet: ")[2][:75],
    ]


def test_every_help_says_what_the_command_and_each_argument_are_for() -> None:
    """``hearthnet pub --help`` once showed options only, not what ``pub`` does, and some
    arguments (``--log-level``, ``community invite --ttl``, ``heartbeat export --since``...)
    had no line at all."""
    bare = []

    def walk(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> None:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        for action in subs:
            for name, child in action.choices.items():
                walk(child, (*words, name))
        if subs:
            return
        if not parser.description:
            bare.append(" ".join(words))
        bare.extend(f"{' '.join(words)} {a.dest}" for a in parser._actions if not a.help)

    walk(build_parser(), ())
    assert [] == bare


def test_a_port_out_of_range_or_a_data_dir_that_cannot_be_made_is_said_not_a_traceback(
    tmp_path: Path,
) -> None:
    """``--port 99999`` and a data directory under a file once ended in Python tracebacks
    (``OverflowError: bind(): port must be 0-65535``, ``NotADirectoryError``); now a usage
    error naming the range, and an error naming the directory and the fix."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    config = tmp_path / "port.toml"
    config.write_text("[node]\nport = 70000\n")
    start = ("node", "start", "--host", "127.0.0.1", "--no-zeroconf")
    runs = [
        run_cli(*start, "--data-dir", str(tmp_path / "d"), "--port", "99999"),
        run_cli(*start, "--data-dir", str(tmp_path / "d"), "--config", str(config)),
        run_cli(*start, "--data-dir", str(blocker / "d"), "--port", "0"),
    ]
    said = [
        (2, "error: argument --port: 99999 is not a port (0 to 65535; 0 picks a free one)"),
        (1, f"{config} [node] port: 70000 is not a port (0 to 65535; 0 picks a free one)"),
        (1, f"cannot make the data directory {blocker / 'd'}: Not a directory (pass --data-dir"),
    ]
    assert said == [
        (r.returncode, want) for r, (_, want) in zip(runs, said, strict=True) if want in r.stderr
    ]
    assert "Traceback" not in "".join(r.stderr for r in runs)


def test_https_to_a_node_itself_says_to_use_its_http_url(node_proc: NodeProcess) -> None:
    """The node answers TLS on its port with a certificate made from its key, for its peer
    links; ``--url https://...`` of the node once failed with only ``self-signed
    certificate``; now the message says to use the http:// URL of the ready line."""
    https = node_proc.url.replace("http://", "https://")
    runs = [
        run_cli("node", "status", "--url", https),
        run_cli("call", "echo@1.0", "--url", https, "--data-dir", str(node_proc.data_dir)),
    ]
    hint = "talk to the node with http://host:port, as its ready line prints it"
    assert [(1, True), (1, True)] == [(r.returncode, hint in r.stderr) for r in runs]


def test_a_node_killed_without_cleaning_up_says_how_to_start_it_again(tmp_path: Path) -> None:
    """After ``kill -9`` the run file stays: commands once said only "not running (stale
    run file)"; now how to start it again (exit 3 as before)."""
    proc = start_node_process(tmp_path / "d", *MESH_ARGS)
    proc.stop(signal.SIGKILL)
    done = run_cli("node", "status", "--data-dir", str(tmp_path / "d"))
    assert (3, f"start it again with: hearthnet node start --data-dir {tmp_path / 'd'}\n") == (
        done.returncode,
        done.stderr[done.stderr.index("start it again") :],
    )


def test_no_node_or_no_keys_in_a_data_dir_says_the_start_command_for_it(tmp_path: Path) -> None:
    """A --data-dir with no node running, or no keys yet, once said to type ``hearthnet
    node start``, which starts a node on the default data dir: now with that --data-dir
    (quoted for the shell), in the message and in the --json error object alike."""
    empty = tmp_path / "no node here"
    runs = [
        run_cli(*args, "--data-dir", str(empty))
        for args in (("node", "status"), ("topics", "--json"), ("keys", "show"))
    ]
    start = f"hearthnet node start --data-dir '{empty}'"
    assert [
        (3, f"start one with: {start}"),
        (3, f"start one with: {start}"),
        (1, f"they are created by: {start}"),
    ] == [
        (runs[0].returncode, runs[0].stderr.strip().partition("; ")[2]),
        (runs[1].returncode, json.loads(runs[1].stderr)["message"].partition("; ")[2]),
        (runs[2].returncode, runs[2].stderr.strip().partition("; ")[2]),
    ]


def test_a_rules_file_that_is_not_there_says_what_file_to_give(
    tmp_path: Path, node_proc: NodeProcess
) -> None:
    """``community rules FILE`` with a path that does not exist once printed Python's
    ``[Errno 2] ...: '/path'``; now the reason and what the file holds (exit 1)."""
    missing = tmp_path / "rules.toml"
    d = ("--data-dir", str(node_proc.data_dir))
    done = run_cli("community", "rules", str(missing), "--json", *d)
    error = json.loads(done.stderr)
    said = f"cannot read {missing}: No such file or directory (give hearthnet community rules"
    assert (1, "config_error", said) == (
        done.returncode,
        error["error"],
        error["message"][: len(said)],
    )


def test_an_invite_for_no_time_and_a_federation_with_no_id_are_usage_errors(
    node_proc: NodeProcess,
) -> None:
    """``community invite --ttl 0`` once printed an invite already expired (exit 0), and
    ``federation propose --with bob`` exited 1 as if the node were at fault: both are now
    usage errors (2) saying what to give."""
    d = ("--data-dir", str(node_proc.data_dir))
    invite = run_cli("community", "invite", "--ttl", "0", *d)
    propose = run_cli("federation", "propose", "--with", "bob", "--json", *d)
    assert (
        2,
        "argument --ttl: an invite must work longer than '0' (e.g. --ttl 1h)",
        2,
        "usage",
        "--with takes the other community's id, not 'bob': ed25519:...",
    ) == (
        invite.returncode,
        invite.stderr.strip().partition("error: ")[2],
        propose.returncode,
        json.loads(propose.stderr)["error"],
        json.loads(propose.stderr)["message"][:61],
    )


def test_revoking_a_key_that_is_no_member_says_so(node_proc: NodeProcess) -> None:
    """A mistyped NodeID once printed "revoked ... on every node" and nothing else, as if a
    member had gone; the revocation still stands (that key can never join), and a note
    on stderr says it named no member."""
    stranger = "ed25519:" + "A" * 43
    done = run_cli("community", "revoke", stranger, "--data-dir", str(node_proc.data_dir))
    assert (0, f"revoked {stranger} on every node\n", True) == (
        done.returncode,
        done.stdout,
        f"note: {stranger} is not a member of this community" in done.stderr,
    )


def test_an_invite_whose_node_is_not_reachable_says_what_must_run(
    node_proc: NodeProcess, tmp_path: Path
) -> None:
    """The join's bootstrap node does not answer: the error (exit 1) once named only the
    connection failure; now what must run, and how to make an invite that works."""
    made = run_cli(
        *("community", "invite", "--data-dir", str(node_proc.data_dir)),
        *("--bootstrap", "http://127.0.0.1:9"),
    )
    done = run_cli(
        *("node", "start", "--data-dir", str(tmp_path / "new"), "--host", "127.0.0.1"),
        *("--port", "0", "--no-zeroconf", "--join", made.stdout.strip()),
    )
    assert (1, True, True) == (
        done.returncode,
        done.stderr.startswith("hearthnet: unavailable: could not join: http://127.0.0.1:9: "),
        "a node named in the invite must be running and reachable from here" in done.stderr,
    )


def test_python_dash_m_hearthnet_is_the_hearthnet_command(tmp_path: Path) -> None:
    """`python -m hearthnet ...` (what a Python user tries first, with no venv script on
    the PATH) runs the same command, under the same name."""
    runs = [
        subprocess.run(
            [sys.executable, "-m", "hearthnet", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        for args in (("--version",), ("pub", "a.b"))
    ]
    assert [0, 2] == [r.returncode for r in runs], runs[0].stderr
    assert runs[0].stdout.startswith("hearthnet ")
    assert runs[1].stderr.startswith("usage: hearthnet pub")


def test_an_empty_consumer_name_is_a_usage_error_not_a_plain_subscription() -> None:
    """`sub --consumer "$NAME"` with NAME unset once subscribed without a consumer (no
    acks kept, nothing redelivered) and said nothing."""
    run = run_cli("sub", "jobs", "--consumer", "", "--data-dir", "/nonexistent")
    assert (2, True) == (run.returncode, "--consumer: a name of 1..64 characters" in run.stderr)
