"""The console (docs/browser.md) on two linked node processes: log in with the URL
`hearthnet console` prints and see a peer, a topic and a live message."""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.support import process_token, publish
from tests.helpers import run_cli
from tests.integration.mesh_cluster import Cluster

# DOCS_SCREENSHOTS=docs/img makes the first test save the console's screenshots there
DOCS_IMG = os.environ.get("DOCS_SCREENSHOTS")


def _peers_linked(url: str) -> int:
    with urllib.request.urlopen(url + "/status", timeout=5) as resp:
        count: int = json.loads(resp.read())["peers_linked"]
        return count


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two linked nodes of one community; node 0 offers the demo model."""
    cluster = Cluster(tmp_path_factory.mktemp("console"))
    try:
        cluster.start(0, "--llm-demo", "--name", "kitchen")
        cluster.start(1, "--name", "attic")
        deadline = time.monotonic() + 30
        while min(_peers_linked(n.url) for n in cluster.nodes) < 1:
            assert time.monotonic() < deadline, "the two nodes did not link"
            time.sleep(0.1)
        yield cluster
    finally:
        cluster.stop_all()


def _login_url(data_dir: Path) -> str:
    result = run_cli("console", "--data-dir", str(data_dir))
    assert 0 == result.returncode, result.stderr
    url: str = result.stdout.strip()
    return url


def test_login_shows_peer_topic_and_live_message(page: Any, mesh: Cluster) -> None:
    """With the printed URL the console opens (the token leaves the address bar), lists
    the linked peer and a published topic, and tails it live, with its own presence."""
    node = mesh.nodes[0]
    token = process_token(node, "pub:demo.**")
    publish(node.url, token, "demo.console", "note", {"text": "first"})
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto(_login_url(mesh.data(0)))
    page.wait_for_selector("#peer-rows tr.peer", timeout=20_000)
    page.wait_for_selector("a.topic:text('demo.console')", timeout=20_000)
    page.click("a.topic:text('demo.console')")
    # (the console's CSP forbids eval, so tests wait on the DOM, not on expressions)
    page.wait_for_selector("#tail-state:has-text('live')", timeout=15_000)
    publish(node.url, token, "demo.console", "note", {"text": "live one"})
    page.wait_for_selector("#tail-messages li:has-text('live one')", timeout=15_000)
    page.wait_for_selector("#tail-presence li:has-text('console')", timeout=15_000)
    peer = page.inner_text("#peer-rows tr.peer")
    if DOCS_IMG:
        page.screenshot(path=f"{DOCS_IMG}/console.png", full_page=True)
        page.set_viewport_size({"width": 390, "height": 844})
        page.screenshot(path=f"{DOCS_IMG}/console-phone.png")
    assert ("#token=" in page.url, "attic", "direct", True, []) == (
        False,
        peer.split("\t")[0].strip(),
        peer.split("\t")[1].strip(),
        "first" in page.inner_text("#tail-messages"),
        page.errors,
    )
