"""What a community admin running nodes meets when following docs/operations.md and
docs/configuration.md against real node processes: each command works as written, and
each mistake is answered with what to do."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hearthnet import __version__
from hearthnet.ids import b64url_decode, b64url_encode
from hearthnet.mesh.dialer import REVOKED_ADVICE
from tests.helpers import NodeProcess, hearthnet_cmd, run_cli, start_node_process
from tests.integration.mesh_cluster import MESH_ARGS, invite


def _module(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """``python -m hearthnet ARGS`` with ``HOME`` at ``home`` (bounded)."""
    return subprocess.run(
        [sys.executable, "-m", "hearthnet", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
    )


def test_python_dash_m_hearthnet_is_the_hearthnet_command(tmp_path: Path) -> None:
    """``python -m hearthnet`` (a checkout, or a venv whose bin/ is not on PATH) once failed
    with "No module named hearthnet.__main__"; it is the ``hearthnet`` command."""
    node = start_node_process(tmp_path / "data", *MESH_ARGS)
    try:
        version = _module("--version", home=tmp_path)
        status = _module(
            "node", "status", "--json", "--data-dir", str(node.data_dir), home=tmp_path
        )
    finally:
        node.stop()
    assert (0, f"hearthnet {__version__}", 0, True) == (
        version.returncode,
        version.stdout.strip(),
        status.returncode,
        f'"node": "{node.fields["node"]}"' in status.stdout,
    )


def test_a_misspelt_environment_variable_is_named_in_the_node_s_log(tmp_path: Path) -> None:
    """``HEARTHNET_LOG_LEVEL=warning`` (the key is ``HEARTHNET_NODE_LOG_LEVEL``) once changed
    nothing without a word: the node still logged at info; now its log says the variable
    is ignored and which one was meant."""
    node, log = _start_logged(tmp_path / "data", env={"HEARTHNET_LOG_LEVEL": "warning"})
    node.stop()
    assert [
        "environment variable HEARTHNET_LOG_LEVEL is ignored: it names no configuration key"
        " (did you mean HEARTHNET_NODE_LOG_LEVEL?)"
    ] == [w for w in _warnings(log) if "HEARTHNET_LOG_LEVEL" in w]  # not HEARTHNET_FUZZ_*


def _start_logged(
    data_dir: Path, *extra: str, env: dict[str, str] | None = None
) -> tuple[NodeProcess, Path]:
    """A node process on port 0 whose log (stderr) goes to a file beside its data dir."""
    log = data_dir.parent / f"{data_dir.name}.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            hearthnet_cmd(
                *("node", "start", "--data-dir", str(data_dir)),
                *("--host", "127.0.0.1", "--port", "0", *MESH_ARGS, *extra),
            ),
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, **(env or {})},
        )
    return NodeProcess(proc, _ready_line(proc), data_dir), log


def _warnings(log: Path) -> list[str]:
    """The messages of the warning lines of a node's JSON log."""
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    return [line["msg"] for line in lines if line["level"] == "warning"]


def _ready_line(proc: subprocess.Popen[str], timeout: float = 20.0) -> str:
    """The node's ready line (its stdout's first line), or fail once it exited or after
    ``timeout`` seconds."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("hearthnet ready"):
            return line.strip()
        if proc.poll() is not None:
            break
    proc.kill()
    proc.wait(5)
    raise AssertionError(f"node did not become ready (exit {proc.returncode})")


def test_access_rules_can_be_given_in_the_environment(tmp_path: Path) -> None:
    """``HEARTHNET_PUBSUB_RULES`` is listed in docs/configuration.md, but any value stopped
    the node (``expected dict``: lists were split on commas); a JSON array of rules is
    taken: here it closes publishing to tokens, which the default rules allow."""
    rules = '[{"pattern": "**", "subscribe": "token", "publish": "member"}]'
    node = start_node_process(tmp_path / "data", *MESH_ARGS, env={"HEARTHNET_PUBSUB_RULES": rules})
    try:
        issued = run_cli("token", "issue", "--data-dir", str(node.data_dir), "--scope", "pub:**")
        status, body = _post_json(
            f"{node.url}/pubsub/v1/topics/chat.x/messages",
            {"type": "message", "data": {"a": 1}},
            {"Authorization": f"Bearer {issued.stdout.strip()}"},
        )
    finally:
        node.stop()
    assert (403, "forbidden") == (status, body["error"])


def _post_json(url: str, body: object, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """POST a JSON body; the status and the JSON answer."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_revoking_the_founder_says_the_founder_cannot_be_revoked(tmp_path: Path) -> None:
    """``community revoke`` of the founder, on the founder's own node, once answered
    ``forbidden: ... may not sign member.revoked here (anchors only: run it with the
    --data-dir of an anchor's node ...)``: advice the anchor had already followed. Now it
    says the founder cannot be revoked, signs nothing (exit 1), and the founder stays."""
    node = start_node_process(tmp_path / "data", *MESH_ARGS)
    try:
        done = run_cli(
            "community", "revoke", node.fields["node"], "--data-dir", str(tmp_path / "data")
        )
        shown = json.loads(
            run_cli("community", "show", "--json", "--data-dir", str(tmp_path / "data")).stdout
        )
    finally:
        node.stop()
    assert (1, True, False, []) == (
        done.returncode,
        "the founder cannot be revoked, so nothing was signed" in done.stderr,
        "anchors only" in done.stderr,
        shown["revoked"],
    )


def test_a_revoked_node_s_own_log_and_commands_say_it_was_revoked(tmp_path: Path) -> None:
    """Once revoked, a node's commands answered only ``revoked: identity revoked`` (exit 4)
    and its log said ``revoked <its own id>`` at info beside peers' "the peer is revoked":
    nothing told its operator that this node was the one revoked or what to do. Now its log
    says so in a warning when the revocation reaches it, and again when a peer refuses
    its link as revoked, each with how to take part again; its commands give the same
    advice."""
    anchor = start_node_process(tmp_path / "anchor", *MESH_ARGS)
    try:
        joined, log = _start_logged(
            tmp_path / "member", "--join", invite(anchor.data_dir, anchor.url)
        )
        try:
            # linked first, so that the revocation reaches it before the link closes
            _wait_for(lambda: any(m.startswith("link up with") for m in _messages(log)))
            run_cli(
                "community", "revoke", joined.fields["node"], "--data-dir", str(anchor.data_dir)
            )
            _wait_for(lambda: len(_revoked_warnings(log)) == 2)
            peers = run_cli("peers", "--data-dir", str(joined.data_dir))
        finally:
            joined.stop()
    finally:
        anchor.stop()
    assert (4, True, ["the node at", "this node was revoked from community"]) == (
        peers.returncode,
        "which its community revoked: that key can no longer act in it; to take part again,"
        " stop this node and join with a new key" in peers.stderr,
        _revoked_warnings(log),
    )


def _messages(log: Path) -> list[str]:
    """The messages of a node's JSON log."""
    return [json.loads(line)["msg"] for line in log.read_text().splitlines()]


def _revoked_warnings(log: Path) -> list[str]:
    """The kinds of warning a revoked node logs, by their first words, sorted."""
    kinds = ("this node was revoked from community", "the node at")
    return sorted(
        {k for w in _warnings(log) if w.endswith(REVOKED_ADVICE) for k in kinds if w.startswith(k)}
    )


def _wait_for(condition: Callable[[], bool], within_s: float = 15.0) -> None:
    """Poll ``condition`` until it holds; fail after ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within_s} s")
        time.sleep(0.05)


def _start_refused(
    data: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``node start`` on ``data`` (loopback, port 0, mesh off) run to its end: for starts
    the node refuses."""
    return subprocess.run(
        hearthnet_cmd(
            *("node", "start", "--data-dir", str(data)),
            *("--host", "127.0.0.1", "--port", "0", *MESH_ARGS),
        ),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ, **(env or {})},
    )


def test_a_tls_key_readable_by_others_is_refused_like_the_seed(tmp_path: Path) -> None:
    """``tls/node.key`` holds the node's seed (its certificate is made from the node's
    key), yet a node started with it readable by everyone, while the same seed in
    ``keys/`` is refused: the start now fails the same way, naming the file and the
    ``chmod`` (docs/operations.md, "Troubleshooting")."""
    node = start_node_process(tmp_path / "data", *MESH_ARGS)
    node.stop()
    key = tmp_path / "data" / "tls" / "node.key"
    key.chmod(0o644)
    started = _start_refused(tmp_path / "data")
    assert (1, "", f"hearthnet: {key} is readable by group or others (mode 644)") == (
        started.returncode,
        started.stdout,
        started.stderr.splitlines()[-1].partition(" and holds")[0],
    )


def test_an_anchor_raises_a_member_s_level_with_community_level(tmp_path: Path) -> None:
    """A member's ``community invite`` (and ``federation propose``) said "have an anchor
    raise this node's level", but no command did that. ``community level NODEID trusted``
    on the anchor's node does: the member then invites; the member cannot do it itself
    (forbidden, exit 1), nor can anyone lower the founder."""
    anchor = start_node_process(tmp_path / "anchor", *MESH_ARGS)
    try:
        member = start_node_process(
            tmp_path / "member", *MESH_ARGS, "--join", invite(anchor.data_dir, anchor.url)
        )
        try:
            m, a = ("--data-dir", str(member.data_dir)), ("--data-dir", str(anchor.data_dir))
            before = run_cli("community", "invite", *m)
            raised = run_cli("community", "level", member.fields["node"], "trusted", *a)
            deadline = time.monotonic() + 15
            after = run_cli("community", "invite", *m)
            while after.returncode != 0 and time.monotonic() < deadline:
                time.sleep(0.2)
                after = run_cli("community", "invite", *m)
            by_member = run_cli("community", "level", member.fields["node"], "anchor", *m)
            founder = run_cli("community", "level", anchor.fields["node"], "member", *a)
        finally:
            member.stop()
    finally:
        anchor.stop()
    hint = f"hearthnet community level {member.fields['node']} trusted"
    assert (1, True, 0, 0, True, 1, True, 1, True) == (
        before.returncode,
        hint in before.stderr,
        raised.returncode,
        after.returncode,
        after.stdout.startswith("hn1:"),
        by_member.returncode,
        "forbidden" in by_member.stderr and "anchors only" in by_member.stderr,
        founder.returncode,
        "the founder stays an anchor, so nothing was signed" in founder.stderr,
    )


def test_sighup_stops_the_node_like_sigterm(tmp_path: Path) -> None:
    """A node run in a terminal that closes (an ssh session that drops) gets SIGHUP; it
    once died of it at once (exit 129, its run file left behind, so ``node status`` said
    "stale run file"). It now shuts down as on SIGTERM: exit 0, run file removed."""
    node = start_node_process(tmp_path / "data", *MESH_ARGS)
    code = node.stop(signal.SIGHUP)
    assert (0, False) == (code, (node.data_dir / "run" / "node.json").exists())


def test_config_show_refuses_the_rules_a_node_start_refuses(tmp_path: Path) -> None:
    """``config show`` printed a file whose access rule names no level (``memberz``) and
    whose retention rule has a misspelt key, exit 0, and ``node start`` then refused it;
    now ``config show`` refuses each the same way (exit 1), so it checks a file."""
    bad_rule = tmp_path / "rule.toml"
    bad_rule.write_text('[[pubsub.rules]]\npattern = "chat.**"\nsubscribe = "memberz"\n')
    bad_retention = tmp_path / "retention.toml"
    bad_retention.write_text('[[pubsub.retention]]\npattern = "x.*"\nmax_mesages = 3\n')
    d = ("--data-dir", str(tmp_path / "data"))
    shown = [run_cli("config", "show", "--config", str(f), *d) for f in (bad_rule, bad_retention)]
    expected = [
        "hearthnet: rule 'chat.**': level 'memberz' is not one of",
        "hearthnet: [[pubsub.retention]] takes pattern, max_messages, max_age_s",
    ]
    assert [(1, True), (1, True)] == [
        (r.returncode, r.stderr.startswith(e)) for r, e in zip(shown, expected, strict=True)
    ]


def test_the_data_dir_key_and_its_long_variable_choose_the_data_dir(tmp_path: Path) -> None:
    """``[node] data_dir`` in a ``--config`` file and ``HEARTHNET_NODE_DATA_DIR`` are listed
    in docs/configuration.md, yet both were overridden by ``~/.local/share/hearthnet``
    (only ``--data-dir`` and ``HEARTHNET_DATA_DIR`` counted): a node started with them
    used the home directory. Now each names the data dir the node runs on, and commands
    given the same ``--config`` or environment find that node."""
    config = tmp_path / "node.toml"
    config.write_text(f'[node]\ndata_dir = "{tmp_path / "from-file"}"\n')
    from_env = {"HEARTHNET_NODE_DATA_DIR": str(tmp_path / "from-env")}
    found = []
    for extra, env in ((("--config", str(config)), {}), ((), from_env)):
        proc = subprocess.Popen(
            hearthnet_cmd(
                *("node", "start", "--host", "127.0.0.1", "--port", "0", *MESH_ARGS, *extra)
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "HOME": str(tmp_path / "home"), **env},
        )
        node = NodeProcess(proc, _ready_line(proc), tmp_path)
        try:
            status = subprocess.run(
                hearthnet_cmd("node", "status", "--json", *extra),
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
                env={**os.environ, "HOME": str(tmp_path / "home"), **env},
            )
            found.append(json.loads(status.stdout)["node"] == node.fields["node"])
        finally:
            node.stop()
    assert ([True, True], True, True, False) == (
        found,
        (tmp_path / "from-file" / "keys").is_dir(),
        (tmp_path / "from-env" / "keys").is_dir(),
        (tmp_path / "home" / ".local").exists(),
    )


def test_a_log_level_the_node_does_not_know_stops_it(tmp_path: Path) -> None:
    """``HEARTHNET_NODE_LOG_LEVEL=warn`` (the level is ``warning``) once started a node that
    logged at info, ignoring it without a word; the node now refuses to start, naming the
    levels, and ``config show`` refuses a file that says so."""
    config = tmp_path / "node.toml"
    config.write_text('[node]\nlog_level = "warn"\n')
    shown = run_cli("config", "show", "--config", str(config), "--data-dir", str(tmp_path / "d"))
    started = _start_refused(tmp_path / "d", {"HEARTHNET_NODE_LOG_LEVEL": "warn"})
    levels = "'warn' is not one of debug, info, warning, error"
    assert (1, True, 1, True) == (
        shown.returncode,
        f"{config} [node] log_level: {levels}" in shown.stderr,
        started.returncode,
        f"environment [node] log_level: {levels}" in started.stderr,
    )


def test_a_federation_file_changed_on_the_way_is_named_as_such(tmp_path: Path) -> None:
    """A proposal cut short (a line lost in a mail) was ``bad_request: malformed JSON ...``
    and one whose terms were changed ``invalid_signature`` with exit 4 and advice about
    this node's key: neither said the file was damaged. Both are now refused (exit 1) as
    not intact, with what to ask the other anchor for."""
    a, b = ("--data-dir", str(tmp_path / "a")), ("--data-dir", str(tmp_path / "b"))
    run_cli("community", "create", "A", *a)
    made_b = json.loads(run_cli("community", "create", "B", "--json", *b).stdout)
    proposal = run_cli(
        *("federation", "propose", *a, "--with", made_b["community"]),
        *("--grant-topics", "chat.**", "--expires", "30d"),
    ).stdout.strip()
    blob = json.loads(b64url_decode(proposal.removeprefix("hnf1:")))
    blob["agreement"]["a_grants_b"]["topics"] = ["news.**"]
    changed = "hnf1:" + b64url_encode(json.dumps(blob).encode())
    runs = [run_cli("federation", "accept", text, *b) for text in (proposal[:-40], changed)]
    assert [(1, True), (1, True)] == [
        (r.returncode, "is not an intact federation agreement" in r.stderr) for r in runs
    ], [r.stderr for r in runs]


def test_accepting_a_revoked_agreement_again_says_it_stays_revoked(tmp_path: Path) -> None:
    """Accepting again a proposal whose agreement was revoked once printed "wrote agreement
    ...: give it to the other community's anchor" and exited 0, with "revoked" on a line of
    stderr; now it exits 1, writes nothing, and says to propose a new agreement."""
    a = start_node_process(tmp_path / "a", *MESH_ARGS)
    b = start_node_process(tmp_path / "b", *MESH_ARGS)
    try:
        da, db = ("--data-dir", str(a.data_dir)), ("--data-dir", str(b.data_dir))
        proposal = tmp_path / "proposal.hnf"
        run_cli(
            *("federation", "propose", *da, "--with", b.fields["community"]),
            *("--grant-topics", "chat.**", "--expires", "30d", "--out", str(proposal)),
        )
        signed = tmp_path / "signed.hnf"
        run_cli("federation", "accept", str(proposal), "--out", str(signed), *db)
        agreement = json.loads(run_cli("federation", "list", "--json", *db).stdout)
        agreement_id = agreement["agreements"][0]["id"]
        run_cli("federation", "revoke", agreement_id, "--url", b.url, *da)
        again = run_cli(
            "federation", "accept", str(proposal), "--out", str(tmp_path / "again.hnf"), *db
        )
    finally:
        a.stop()
        b.stop()
    assert (1, True, False) == (
        again.returncode,
        f"agreement {agreement_id} is revoked on this node, for good" in again.stderr,
        (tmp_path / "again.hnf").exists(),
    ), again.stderr


def test_an_interval_of_0_stops_the_node_instead_of_spinning(tmp_path: Path) -> None:
    """``HEARTHNET_PUBSUB_RETENTION_INTERVAL_S=0`` once started a node whose retention loop
    ran without pause, a whole core busy for good; the node now refuses to start."""
    started = _start_refused(tmp_path / "d", {"HEARTHNET_PUBSUB_RETENTION_INTERVAL_S": "0"})
    assert (1, "hearthnet: environment [pubsub] retention_interval_s: 0.0 must be more than 0") == (
        started.returncode,
        started.stderr.strip().partition(" (a period")[0],
    )


def test_federation_list_with_no_agreement_says_so(tmp_path: Path) -> None:
    """``federation list`` on a node with no agreement printed a header and no row (as if
    the output were cut); it now says there is none and how one is made, as ``peers``
    and ``topics`` do when they have nothing to list."""
    node = start_node_process(tmp_path / "data", *MESH_ARGS)
    try:
        listed = run_cli("federation", "list", "--data-dir", str(node.data_dir))
    finally:
        node.stop()
    expected = f"no federation agreements ({node.fields['community']}); an anchor proposes"
    assert (0, True) == (listed.returncode, listed.stdout.startswith(expected))
