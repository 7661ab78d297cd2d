"""``hearthnet community invite`` names the addresses the running node uses (spec §8),
asked of the node process, not read again from a configuration file that flags overrode
or that changed since the node started; with the node stopped, ``--bootstrap`` is needed
and the relays are those a plain ``hearthnet node start`` would attach to."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hearthnet.client import Client
from hearthnet.clock import now_ms
from hearthnet.errors import Forbidden
from hearthnet.identity import load_or_create_keys
from hearthnet.tokens import CapabilityToken, Scope
from tests.helpers import free_port, run_cli, start_node_process
from tests.integration.mesh_cluster import MESH_ARGS, status_of

pytestmark = pytest.mark.slow


def _relay_url() -> str:
    """A relay URL where nothing answers (the node dials it with backoff, harmlessly)."""
    return f"http://127.0.0.1:{free_port()}"


def _invite(data_dir: Path, *extra: str) -> Any:
    """``community invite --json`` of ``data_dir``: the invite's fields (exit 0 required)."""
    made = run_cli("community", "invite", "--json", "--data-dir", str(data_dir), *extra)
    assert 0 == made.returncode, made.stderr
    return json.loads(made.stdout)


def _config(data_dir: Path, relay: str, *more: str) -> None:
    """``[mesh] relay_urls = [relay]`` (and ``more`` lines) in ``hearthnet.toml``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    lines = ["[mesh]", f'relay_urls = ["{relay}"]', *more]
    (data_dir / "hearthnet.toml").write_text("\n".join(lines) + "\n")


def test_an_invite_names_the_relays_the_running_node_attaches_to(tmp_path: Path) -> None:
    """A node started with ``--relay-url`` and ``--advertise-url`` over a
    ``hearthnet.toml`` naming others, whose file then changes again: its invites name the
    relay it attaches to (they once named the file's) and the URL it advertises;
    ``--relay-url`` and ``--bootstrap`` still name others."""
    data_dir = tmp_path / "n"
    in_file, given, changed, named, advertised = (_relay_url() for _ in range(5))
    _config(data_dir, in_file, f'advertise_url = "{_relay_url()}"')
    node = start_node_process(
        data_dir, *MESH_ARGS, "--relay-url", given, "--advertise-url", advertised
    )
    try:
        mesh_url = status_of(node)["mesh_url"]
        first = _invite(data_dir)
        _config(data_dir, changed)
        second = _invite(data_dir)
        flags = _invite(data_dir, "--relay-url", named, "--bootstrap", named)
        manifest = json.load(urllib.request.urlopen(node.url + "/manifest", timeout=5))
    finally:
        node.stop()
    assert (advertised, [given]) == (mesh_url, manifest["relays"])
    assert [([advertised], [given])] * 2 + [([named], [named])] == [
        (i["bootstrap"], i["relays"]) for i in (first, second, flags)
    ]


def test_an_invite_of_a_relay_with_a_changed_file_names_the_relay(tmp_path: Path) -> None:
    """A node started with ``--relay`` and no relay URLs names itself, also after a
    ``relay_urls`` was written into its configuration file (what its next start uses)."""
    data_dir = tmp_path / "relay"
    node = start_node_process(data_dir, *MESH_ARGS, "--relay")
    try:
        mesh_url = status_of(node)["mesh_url"]
        _config(data_dir, _relay_url())
        invite = _invite(data_dir)
    finally:
        node.stop()
    assert ([mesh_url], [mesh_url]) == (invite["bootstrap"], invite["relays"])


def test_an_invite_with_the_node_stopped_needs_bootstrap(tmp_path: Path) -> None:
    """With the node stopped, an invite without ``--bootstrap`` is refused (exit 3, saying
    to start the node or name the addresses); with it, the relays are those a plain start
    attaches to (the file's, and those the node's own invite brought; a relay's
    ``relay_peers`` left out), and a note says so; ``--relay-url`` wins."""
    anchor_dir, data_dir = tmp_path / "anchor", tmp_path / "n"
    in_file, brought, other = (_relay_url() for _ in range(3))
    anchor = start_node_process(anchor_dir, *MESH_ARGS)
    try:
        made = _invite(
            anchor_dir, "--level", "trusted", "--relay-url", brought, "--bootstrap", anchor.url
        )
        _config(data_dir, in_file)
        start_node_process(data_dir, *MESH_ARGS, "--join", made["invite"]).stop()
    finally:
        anchor.stop()
    d = ("--data-dir", str(data_dir))
    refused = run_cli("community", "invite", *d)
    bootstrap = ("--bootstrap", "http://192.0.2.1:7080")
    fallback = run_cli("community", "invite", "--json", *d, *bootstrap)
    given = _invite(data_dir, *bootstrap, "--relay-url", other)
    _config(data_dir, in_file, "relay = true", f'relay_peers = ["{brought}"]')
    as_relay = _invite(data_dir, *bootstrap)
    assert (3, True, True) == (
        refused.returncode,
        "hearthnet: no running node found" in refused.stderr,
        "start it first, or give them: hearthnet community invite --bootstrap URL"
        in refused.stderr,
    )
    assert (0, ["http://192.0.2.1:7080"], [in_file, brought], True, [other], [in_file]) == (
        fallback.returncode,
        json.loads(fallback.stdout)["bootstrap"],
        json.loads(fallback.stdout)["relays"],
        "note: the node is not running: the invite names the relays it attaches to when"
        f" started without flags ({in_file}, {brought})" in fallback.stderr,
        given["relays"],
        as_relay["relays"],
    )


async def test_invite_urls_are_for_members_only(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    """``GET /mesh/v1/invite-urls`` answers a member's signed request with the node's
    mesh URL and relays; unsigned requests and token clients are refused."""
    data_dir = tmp_path / "n"
    relay = _relay_url()
    node = start_node_process(data_dir, *MESH_ARGS, "--relay-url", relay)
    try:
        keys = load_or_create_keys(data_dir)
        async with Client(node.url, keys=keys) as member:
            answer = await member.request_json("GET", "/mesh/v1/invite-urls")
            community = (await member.get_json("/status"))["community"]
        token = CapabilityToken.issue(
            keys, community=community, scopes=[Scope.parse("sub:**")], ttl_ms=60_000,
            now_ms=now_ms(),
        )  # fmt: skip
        async with Client(node.url, token=token.encode()) as holder:
            with pytest.raises(Forbidden):
                await holder.request_json("GET", "/mesh/v1/invite-urls")
        async with http.get(node.url + "/mesh/v1/invite-urls") as resp:
            unsigned = resp.status
        mesh_url = status_of(node)["mesh_url"]
    finally:
        node.stop()
    assert (
        {"node": keys.node_id, "community": community, "bootstrap": [mesh_url], "relays": [relay]},
        401,
    ) == (answer, unsigned)


def test_an_invite_asked_of_an_older_node_says_to_restart_it(tmp_path: Path) -> None:
    """A node started before an upgrade has no ``/mesh/v1/invite-urls`` (it answers as
    a node answers a route it lacks, 404 ``not_found``): the invite is refused with a
    message that says to restart the node or name the URLs, not a bare "no route"."""
    data_dir = tmp_path / "n"
    start_node_process(data_dir, *MESH_ARGS).stop()  # keys and the founding records

    class OlderNode(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name http.server calls
            body = json.dumps(
                {"error": "not_found", "message": f"no route {self.path.split('?')[0]}"}
            ).encode()
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OlderNode)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        made = run_cli("community", "invite", "--data-dir", str(data_dir), "--url", url)
    finally:
        server.shutdown()
        server.server_close()
        serving.join(timeout=5)
    assert (1, True, True) == (
        made.returncode,
        "is older than this command" in made.stderr,
        "hearthnet community invite --bootstrap URL [--relay-url URL]..." in made.stderr,
    ), made.stderr
