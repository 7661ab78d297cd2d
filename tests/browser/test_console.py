"""The console (docs/browser.md) on two linked node processes: log in with the URL
`hearthnet console` prints and see a peer, a topic and a live message; two consoles on two
nodes watch one llm.chat answer published to their chat room, and a late one reads it."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hearthnet.cli import main
from tests.browser.support import process_token, publish
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
    """What `hearthnet console` prints (run in this process: a CLI start costs more)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["console", "--data-dir", str(data_dir)])
    assert 0 == code, err.getvalue()
    return out.getvalue().strip()


def test_login_shows_peer_topic_and_live_message(page: Any, mesh: Cluster) -> None:
    """With the printed URL the console opens (the token leaves the address bar), lists
        the linked peer and a published topic, and tails it live, with its own presence (once,
    also after the tail's socket dropped and it resumed); a malformed pattern is shown as
    the node's error."""
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
    page.evaluate("hearthnetConsole.tail.reconnect()")  # as a network drop would
    page.wait_for_selector("#tail-state:has-text('retrying')", timeout=15_000)
    page.wait_for_selector("#tail-state:has-text('live')", timeout=15_000)
    page.wait_for_selector("#tail-presence li:has-text('console')", timeout=15_000)
    present = page.inner_text("#tail-presence")
    tailed = page.inner_text("#tail-messages")
    peer = page.inner_text("#peer-rows tr.peer")
    if DOCS_IMG:
        page.screenshot(path=f"{DOCS_IMG}/console.png", full_page=True)
        page.set_viewport_size({"width": 390, "height": 844})
        page.screenshot(path=f"{DOCS_IMG}/console-phone.png")
    page.fill("#tail-topic", "demo..bad")
    page.press("#tail-topic", "Enter")
    page.wait_for_selector("#tail-messages li.error", timeout=15_000)
    assert ("#token=" in page.url, "attic", "direct", True, ["console · watching"], []) == (
        False,
        peer.split("\t")[0].strip(),
        peer.split("\t")[1].strip(),
        "first" in tailed,
        present.splitlines(),
        page.errors,
    )
    assert "bad_request" in page.inner_text("#tail-messages li.error")


def _answer(pg: Any) -> str:
    pg.wait_for_selector("#chat-log .answer[data-complete]", timeout=30_000)
    text: str = pg.inner_text("#chat-log .answer[data-complete] span")
    return text


def test_two_consoles_on_two_nodes_watch_one_answer(browser: Any, mesh: Cluster) -> None:
    """A question asked in node 0's console streams its answer (llm.chat publish_to) to the
    room; node 1's console sees it live, and one opened afterwards reads it from history."""
    contexts = [browser.new_context() for _ in range(3)]
    try:
        asker, watcher, late = (c.new_page() for c in contexts)
        live_room = "#chat-room-form[data-state=live]"
        asker.goto(_login_url(mesh.data(0)))
        attic = _login_url(mesh.data(1))  # a login URL works until it expires
        watcher.goto(attic)
        for pg in (asker, watcher):
            pg.wait_for_selector(live_room, timeout=20_000)
        asker.fill("#chat-input", "how do I boil water")
        asker.press("#chat-input", "Enter")
        answers = [_answer(asker), _answer(watcher)]
        late.goto(attic)
        late.wait_for_selector(live_room, timeout=20_000)
        answers.append(_answer(late))
        history = json.loads(
            urllib.request.urlopen(
                urllib.request.Request(
                    mesh.nodes[1].url + "/pubsub/v1/topics/chat.room.lobby/history?limit=500",
                    headers={"X-HearthNet-Token": process_token(mesh.nodes[1], "sub:chat.**")},
                ),
                timeout=10,
            ).read()
        )
        types = [m["data"]["type"] for m in history["messages"]]
    finally:
        for c in contexts:
            c.close()
    assert (True, 1, 1, True) == (
        "how do I boil water" in answers[0] and answers[0] == answers[1] == answers[2],
        types.count("message.complete") - 1,  # the question is one too
        len({m["data"]["data"].get("call") for m in history["messages"]} - {None}),
        types.count("token") >= 1,
    )
