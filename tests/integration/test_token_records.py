"""``hearthnet token list`` and a ``token revoke`` that refuses a jti this node never
issued, against real node processes (docs/cli.md, docs/security.md)."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from hearthnet.client import Client
from hearthnet.clock import now_ms
from hearthnet.errors import Revoked
from hearthnet.identity import load_or_create_keys
from hearthnet.tokens import CapabilityToken, Scope
from tests.helpers import NodeProcess, eventually, run_cli, start_node_process
from tests.integration.mesh_cluster import FAST_MESH, MESH_ARGS, invite


def _json(*args: str) -> Any:
    done = run_cli(*args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _listed(data_dir: Path, *flags: str) -> dict[str, str]:
    """jti -> state of ``token list --json`` (with ``flags``)."""
    answer = _json("token", "list", *flags, "--data-dir", str(data_dir))
    return {t["jti"]: t["state"] for t in answer["tokens"]}


def _records(data_dir: Path) -> int:
    """How many membership records the data dir holds."""
    return len((data_dir / "community" / "records.jsonl").read_text().splitlines())


async def _refused(url: str, token: str) -> bool:
    """Whether the node refuses ``token`` as revoked."""
    try:
        async with Client(url, token=token) as client:
            await client.request_json("GET", "/pubsub/v1/topics/tr.a/history")
    except Revoked:
        return True
    return False


def _unrecorded_token(data_dir: Path) -> CapabilityToken:
    """A token signed with the node's key but never recorded: one issued before tokens
    were recorded."""
    keys = load_or_create_keys(data_dir)
    return CapabilityToken.issue(
        keys,
        community=keys.node_id,
        scopes=[Scope.parse("sub:tr.*")],
        ttl_ms=600_000,
        now_ms=now_ms(),
    )


@pytest.fixture
def node(tmp_path: Path) -> Any:
    proc = start_node_process(tmp_path / "data", *MESH_ARGS)
    try:
        yield proc
    finally:
        proc.stop()


async def test_issued_tokens_are_listed_and_a_revoked_one_leaves_the_live_list(
    node: NodeProcess,
) -> None:
    """Two issued tokens are listed live (table and JSON, never the token itself); one
    revoked by its jti is refused by the node, gone from the list and ``revoked`` in
    ``--all``."""
    d = str(node.data_dir)
    first = _json("token", "issue", "--scope", "sub:tr.*", "--sub", "kitchen", "--data-dir", d)
    second = _json("token", "issue", "--scope", "pub:tr.b", "--data-dir", d)
    table = run_cli("token", "list", "--data-dir", d).stdout
    live = _json("token", "list", "--data-dir", d)["tokens"]
    revoked = run_cli("token", "revoke", first["jti"], "--data-dir", d)
    refused = await _refused(node.url, first["token"])
    stored = b"".join(p.read_bytes() for p in (node.data_dir / "tokens").iterdir())
    assert (
        ["jti", "sub", "scopes", "issued", "expires", "state", "via"],
        True,
        [(second["jti"], ["pub:tr.b"]), (first["jti"], ["sub:tr.*"])],
        (0, True),
        {second["jti"]: "live"},
        {first["jti"]: "revoked", second["jti"]: "live"},
        False,
    ) == (
        table.splitlines()[0].split(),
        [first["jti"], "kitchen", "sub:tr.*"] in [line.split()[:3] for line in table.splitlines()],
        [(t["jti"], t["scopes"]) for t in live],
        (revoked.returncode, refused),
        _listed(node.data_dir),
        _listed(node.data_dir, "--all"),
        first["token"].encode() in stored or first["token"].encode() in table.encode(),
    )


async def test_a_mistyped_jti_is_refused_and_an_unrecorded_token_needs_force(
    node: NodeProcess,
) -> None:
    """A jti one character off is refused (exit 1, nothing signed, the token still works);
    a token issued before tokens were recorded is refused the same way, and revoked with
    ``--force``, which warns and goes through."""
    d = str(node.data_dir)
    issued = _json("token", "issue", "--scope", "sub:tr.*", "--data-dir", d)
    typo = issued["jti"][:-1] + ("A" if issued["jti"][-1] != "A" else "B")
    before = _records(node.data_dir)
    mistyped = run_cli("token", "revoke", typo, "--data-dir", d)
    as_json = run_cli("token", "revoke", typo, "--json", "--data-dir", d)
    old = _unrecorded_token(node.data_dir)
    unforced = run_cli("token", "revoke", old.jti, "--data-dir", d)
    still_works = not await _refused(node.url, old.encode())
    after_refusals = _records(node.data_dir)
    forced = run_cli("token", "revoke", old.jti, "--force", "--data-dir", d)
    assert (
        (1, True, True),
        "not_found",
        (1, True),
        (True, before),
        (0, True, True),
        (False, True),
    ) == (
        (
            mistyped.returncode,
            f"this node issued no token with jti {typo}" in mistyped.stderr,
            "hearthnet token list --all" in mistyped.stderr and "--force" in mistyped.stderr,
        ),
        json.loads(as_json.stderr)["error"],
        (unforced.returncode, "--force" in unforced.stderr),
        (still_works, after_refusals),
        (
            forced.returncode,
            "hearthnet: warning:" in forced.stderr,
            f"revoked token {old.jti}" in forced.stdout,
        ),
        (await _refused(node.url, issued["token"]), await _refused(node.url, old.encode())),
    )


def test_offline_issue_and_console_logins_are_recorded_in_one_place(tmp_path: Path) -> None:
    """A token issued while the node is stopped (seed file) and a console login (the CLI)
    are listed once the node runs; the node's refresh of the console session extends
    that row (the node writes the file the CLI reads)."""
    data = tmp_path / "data"
    start_node_process(data, *MESH_ARGS).stop()
    offline = _json("token", "issue", "--scope", "call:echo", "--data-dir", str(data))
    node = start_node_process(data, *MESH_ARGS)
    try:
        login_url = _json("console", "--ttl-min", "1", "--data-dir", str(data))["url"]
        login = login_url.partition("#token=")[2]
        rows = {t["jti"]: t for t in _json("token", "list", "--data-dir", str(data))["tokens"]}
        jti = CapabilityToken.decode(login).jti
        request = urllib.request.Request(
            node.url + "/console/v1/token", method="POST", headers={"X-HearthNet-Token": login}
        )
        with urllib.request.urlopen(request, timeout=10) as resp:
            fresh = CapabilityToken.decode(json.loads(resp.read())["token"])
        extended = _json("token", "list", "--data-dir", str(data))["tokens"]
    finally:
        node.stop()
    assert (
        [
            ("cli", ["call:echo"]),
            ("console", ["console:node", "sub:**", "pub:chat.**", "call:llm.chat@2"]),
        ],
        True,
        [fresh.exp_ms],
    ) == (
        [(rows[j]["via"], rows[j]["scopes"]) for j in (offline["jti"], jti)],
        rows[jti]["exp_ms"] < fresh.exp_ms,
        [t["exp_ms"] for t in extended if t["jti"] == jti],
    )


async def test_a_forced_revocation_of_an_unrecorded_token_reaches_every_node(
    tmp_path: Path,
) -> None:
    """spec §1.6: the revocation is gossiped like membership, whether or not the token was
    recorded: a token of the anchor's key used at a member is refused there after
    ``token revoke JTI --force`` on the anchor."""
    anchor = start_node_process(tmp_path / "a", *MESH_ARGS, env=FAST_MESH)
    try:
        member = start_node_process(
            tmp_path / "b",
            *MESH_ARGS,
            "--join",
            invite(anchor.data_dir, anchor.url),
            env=FAST_MESH,
        )
        try:
            token = _unrecorded_token(anchor.data_dir)
            old = token.encode()
            worked = not await _refused(member.url, old)
            forced = await asyncio.to_thread(
                run_cli, "token", "revoke", token.jti, "--force", "--data-dir", str(anchor.data_dir)
            )
            await eventually(
                lambda: _refused(member.url, old), lambda r: r is True, 15, "revoked at the member"
            )
        finally:
            member.stop()
    finally:
        anchor.stop()
    assert (True, 0) == (worked, forced.returncode), forced.stderr
