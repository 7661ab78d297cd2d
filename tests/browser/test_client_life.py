"""hearthnet.js as an application uses it (docs/browser.md), in a real browser against a
real node: the copy-paste example of the docs runs as written (presence, history, publish,
the model's answer streamed to the room) and keeps one presence entry per member across a
reconnect; a subscription that reconnects before any message came misses nothing
published in between; refusals that waiting cannot fix (a bad or expired token, a
forbidden topic, access rules that change to refuse a live subscription) end the
subscription with the error instead of retrying forever or staying "live" with nothing
coming, and a refused llm.chat rejects."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser.support import (
    CLIENT_PAGE,
    PageServer,
    forged_token,
    open_client_page,
    process_token,
    publish,
)
from tests.helpers import NodeProcess, run_cli, start_node_process

DOCS = Path(__file__).resolve().parents[2] / "docs" / "browser.md"
DOC_NODE = "http://192.168.1.20:7080"  # the node's address in the docs' example


def docs_example() -> str:
    """The copy-paste page of docs/browser.md."""
    found = re.search(r"```html\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.S)
    assert found is not None
    return found.group(1)


@pytest.fixture(scope="module")
def pages() -> Iterator[PageServer]:
    """The origin the pages come from (the node allows it)."""
    server = PageServer({"/client": CLIENT_PAGE})
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, pages: PageServer) -> Iterator[NodeProcess]:
    """One node with the demo model, allowing the pages' origin."""
    proc = start_node_process(
        tmp_path_factory.mktemp("life") / "node",
        "--llm-demo",
        env={"HEARTHNET_SECURITY_ALLOWED_ORIGINS": pages.origin},
    )
    try:
        yield proc
    finally:
        proc.stop()


# Records the page's WebSockets, so that a test can drop one as a network would.
RECORD_SOCKETS = """window.sockets = [];
const Native = window.WebSocket;
window.WebSocket = class extends Native {
  constructor(...args) { super(...args); window.sockets.push(this); }
};"""


def test_docs_example_runs_as_written(page: Any, pages: PageServer, node: NodeProcess) -> None:
    """The docs' page, with only the node's address and a token filled in: it joins the
    room (its presence list shows Ada, once, also after its socket dropped and it
    resumed), shows the room's last messages, and a message typed in the form comes back
    through the room with the model's answer streamed there by publish_to."""
    token = process_token(node, "sub:chat.**", "pub:chat.**", "call:llm.chat@2", sub="ada")
    publish(node.url, token, "chat.room.kitchen", "message.complete", {"text": "earlier"})
    html = docs_example().replace(DOC_NODE, node.url).replace('"hnt1:..."', json.dumps(token))
    pages.pages["/example"] = html
    page.add_init_script(RECORD_SOCKETS)
    page.goto(f"{pages.origin}/example")
    who = "[...document.querySelectorAll('#who li')].map((li) => li.textContent)"
    log = "[...document.querySelectorAll('#log li')].map((li) => li.textContent)"
    page.wait_for_function(f"{who}.length === 1 && {log}.length === 1", timeout=10_000)
    page.evaluate("sockets.forEach((ws) => ws.close())")  # the network drops it
    page.wait_for_function("sockets.length === 2 && sockets[1].readyState === 1", timeout=10_000)
    page.fill("#text", "hello kitchen")
    page.click("button")
    page.wait_for_function(
        f"{log}.some((t) => t.includes('stop_reason'))", timeout=10_000
    )  # the answer's message.complete came through the room
    lines = page.evaluate(log)
    assert (["Ada"], "earlier", "hello kitchen", True, []) == (
        page.evaluate(who),
        json.loads(lines[0])["text"],
        json.loads(lines[1])["text"],
        any("You said: hello kitchen" in line for line in lines[2:]),
        page.errors,
    )


HELD = """async ([node, token]) => {
  const client = new hn.HearthNet(node, {token});
  window.got = [];
  const make = (topic, since) => {
    const sub = client.subscribe([topic], {since, onMessage: (m) => got.push([topic, m.data.n])});
    sub.release = null;
    const connect = sub._connect.bind(sub);
    // hold its next connection until the test lets it go (the drop lasts that long)
    sub.hold = () => { sub._connect = () => { sub.release = connect; }; };
    return sub;
  };
  window.subs = [make("demo.quiet", undefined), make("demo.empty", {last: 5})];
  await new Promise((resolve) => {
    const poll = () => subs.every((s) => s.state === "live") ? resolve() : setTimeout(poll, 20);
    poll();
  });
  for (const sub of subs) { sub.hold(); sub.reconnect(); }
}"""


def test_reconnect_before_the_first_message_misses_nothing(
    page: Any, pages: PageServer, node: NodeProcess
) -> None:
    """A live-only subscription and a `last: 5` one on an empty topic, both live with
    nothing received yet, drop; messages are published while they are away; when they
    reconnect they get them (resuming from the head they were subscribed at, and asking
    for the last 5 again), once each."""
    token = process_token(node, "sub:demo.**", "pub:demo.**")
    open_client_page(page, pages, node.url)
    page.evaluate(HELD, [node.url, token])
    page.wait_for_function("subs.every((s) => s.release)", timeout=10_000)
    publish(node.url, token, "demo.quiet", "note", {"n": 1})
    publish(node.url, token, "demo.empty", "note", {"n": 2})
    page.evaluate("for (const sub of subs) sub.release()")
    page.wait_for_function("subs.every((s) => s.state === 'live')", timeout=10_000)
    publish(node.url, token, "demo.quiet", "note", {"n": 3})
    page.wait_for_function("got.some(([, n]) => n === 3)", timeout=10_000)
    assert ([["demo.empty", 2], ["demo.quiet", 1], ["demo.quiet", 3]], []) == (
        sorted(page.evaluate("got")),
        page.errors,
    )


CANCEL = """async ([node, token]) => {
  const out = {};
  for (const transport of ["ws", "sse"]) {
    const client = new hn.HearthNet(node, {token, transport});
    const call = client.stream("echo.stream", {count: 500, interval_ms: 20});
    const events = [];
    for await (const frame of call) {
      events.push(frame.event === "error" ? `error ${frame.data.code}` : frame.event);
      if (events.length === 3) call.cancel();
    }
    out[transport] = [call.inline, events.at(-1), events.length < 100];
  }
  return out;
}"""


def test_cancel_ends_a_stream_with_cancelled_on_either_transport(
    page: Any, pages: PageServer, node: NodeProcess
) -> None:
    """call.cancel() ends the stream with error{cancelled} over WebSocket and over SSE
    (where it aborts the request) alike."""
    open_client_page(page, pages, node.url)
    token = process_token(node, "call:echo.stream")
    assert {"ws": [True, "error cancelled", True], "sse": [False, "error cancelled", True]} == (
        page.evaluate(CANCEL, [node.url, token])
    )


REAUTH = """async ([node, first, other]) => {
  window.got = []; window.states = []; window.errors = [];
  window.client = new hn.HearthNet(node, {token: first, refreshToken: async () => other});
  window.sub = client.subscribe(["demo.reauth"], {onMessage: (m) => got.push(m.data.n),
    onState: (s) => states.push(s), onError: (e) => errors.push(e.code)});
}"""


def test_a_refreshed_token_the_session_refuses_moves_to_a_new_session(
    page: Any, pages: PageServer, node: NodeProcess
) -> None:
    """refreshToken returns a token for another client (another sub): a live session
    refuses it (bad_request), so the subscription opens a new session with it and
    resumes from its cursor, with nothing lost or repeated and no error for the page."""
    token = process_token(node, "sub:demo.**", "pub:demo.**", sub="page")
    other = process_token(node, "sub:demo.**", sub="other")
    open_client_page(page, pages, node.url)
    page.evaluate(REAUTH, [node.url, token, other])
    page.wait_for_function("sub.state === 'live'", timeout=10_000)
    publish(node.url, token, "demo.reauth", "note", {"n": 0})
    page.wait_for_function("got.length === 1", timeout=10_000)
    page.evaluate("client.refresh()")
    page.wait_for_function("states.includes('retrying') && sub.state === 'live'", timeout=10_000)
    publish(node.url, token, "demo.reauth", "note", {"n": 1})
    page.wait_for_function("got.length === 2", timeout=10_000)
    assert ([0, 1], [], other) == (
        page.evaluate("got"),
        page.evaluate("errors"),
        page.evaluate("client.token"),
    )


PRESENCE = """async ([node, token]) => {
  window.got = []; window.errors = [];
  window.sub = new hn.HearthNet(node, {token}).subscribe(["demo.presence"], {
    presence: {name: "Ada"}, onMessage: (m) => got.push(m.data.n),
    onError: (e) => errors.push(e.code)});
  await new Promise((resolve) => {
    const poll = () => (sub.state === "live" ? resolve() : setTimeout(poll, 20));
    poll();
  });
  let thrown = null;
  try { sub.setPresence({mood: "happy"}); } catch (e) { thrown = e.code; }
  sub.setPresence({status: "x".repeat(500)});  // too long: the node refuses it
  return thrown;
}"""


def test_a_refused_presence_update_leaves_the_subscription_live(
    page: Any, pages: PageServer, node: NodeProcess
) -> None:
    """setPresence with a field presence does not have throws at once; one the node
    refuses (a status too long) reaches onError, and the subscription stays live."""
    token = process_token(node, "sub:demo.**", "pub:demo.**", sub="page")
    open_client_page(page, pages, node.url)
    thrown = page.evaluate(PRESENCE, [node.url, token])
    page.wait_for_function("errors.length === 1", timeout=10_000)
    publish(node.url, token, "demo.presence", "note", {"n": 1})
    page.wait_for_function("got.length === 1", timeout=10_000)
    assert ("bad_request", ["bad_request"], "live") == (
        thrown,
        page.evaluate("errors"),
        page.evaluate("sub.state"),
    )


REFUSED = """async ([node, tokens, fresh]) => {
  window.outcomes = {};
  const run = (name, token, topic, refreshToken) => {
    const errors = [];
    const states = [];
    const client = new hn.HearthNet(node, {token, refreshToken});
    client.subscribe([topic], {
      onError: (e) => errors.push(e instanceof hn.HearthNetError ? e.code : String(e)),
      onState: (s, detail) => states.push(detail && detail.code ? `${s} ${detail.code}` : s)});
    outcomes[name] = {errors, states};
  };
  run("bad", tokens.bad, "demo.x");
  run("expired", tokens.expired, "demo.x");
  run("forbidden", tokens.good, "secret.x");
  run("refreshed", tokens.expired, "demo.x", async () => fresh);
  try { new hn.HearthNet(node, {token: "hnt1:not-a-token"}); } catch (e) {
    outcomes.garbled = e instanceof hn.HearthNetError ? e.code : String(e);
  }
  const late = new hn.HearthNet(node, {token: tokens.expired, refreshToken: async () => fresh});
  const published = late.publish("demo.x", "note", {});
  outcomes.publish = await published.then((ok) => typeof ok.seq, (e) => e.code);
  const chat = new hn.HearthNet(node, {token: tokens.good}).chat([{role: "user", content: "hi"}]);
  outcomes.chat = await chat.then((answer) => answer, (e) => `${e.name} ${e.code}`);
  // refused expired at its start: called again with the fresh token (which lacks the scope)
  const renewed = new hn.HearthNet(node, {token: tokens.expired, refreshToken: async () => fresh});
  outcomes.chatRenewed = await renewed.chat([{role: "user", content: "hi"}]).then(
    (answer) => answer, (e) => e.code);
}"""


def test_refusals_end_the_subscription_with_the_error(
    page: Any, pages: PageServer, node: NodeProcess
) -> None:
    """A token whose signature fails, an expired one with no refreshToken, and a topic the
    token does not cover: each subscription gets the error once in onError and ends
    ("closed" with it), instead of reconnecting forever. An expired token with a
    refreshToken is replaced and the subscription goes live; a garbled token is a
    HearthNetError at once; llm.chat without the scope rejects with the node's error; a
    publish, and a chat, refused expired are sent again with a refreshed token."""
    good = process_token(node, "sub:demo.**", "pub:demo.**", sub="page")
    bad = forged_token(good)
    expired = process_token(node, "sub:demo.**", "pub:demo.**", ttl_ms=1, sub="page")
    time.sleep(0.01)
    open_client_page(page, pages, node.url)
    page.evaluate(REFUSED, [node.url, {"good": good, "bad": bad, "expired": expired}, good])
    done = (
        "['bad', 'expired', 'forbidden'].every((k) => outcomes[k].states.at(-1) !== 'connecting')"
    )
    page.wait_for_function(f"{done} && outcomes.refreshed.states.at(-1) === 'live'", timeout=10_000)
    time.sleep(0.7)  # longer than the first backoff: a retry would show in the states
    outcomes = page.evaluate("outcomes")
    assert {
        "bad": {
            "errors": ["invalid_signature"],
            "states": ["connecting", "closed invalid_signature"],
        },
        "expired": {"errors": ["expired"], "states": ["connecting", "closed expired"]},
        "forbidden": {"errors": ["forbidden"], "states": ["connecting", "closed forbidden"]},
        "refreshed": {"errors": [], "states": ["connecting", "retrying", "connecting", "live"]},
        "garbled": "bad_request",
        "chat": "HearthNetError unauthorized",
        "chatRenewed": "unauthorized",
        "publish": "number",
    } == outcomes
    assert [] == page.errors


def test_a_subscription_the_new_access_rules_refuse_ends(
    page: Any, pages: PageServer, node: NodeProcess, tmp_path: Path
) -> None:
    """The community's rules change (`hearthnet community rules`) so that tokens may no
    longer read a topic: the node drops the live subscription with `forbidden`, and the
    page's subscription ends with it instead of showing "live" with nothing coming."""
    token = process_token(node, "sub:demo.**", sub="page")
    open_client_page(page, pages, node.url)
    page.evaluate(
        """([node, token]) => {
      window.out = {errors: [], states: []};
      window.sub = new hn.HearthNet(node, {token}).subscribe(["demo.ruled.x"], {
        onError: (e) => out.errors.push(e.code),
        onState: (s, detail) =>
          out.states.push(detail && detail.code ? `${s} ${detail.code}` : s)});
    }""",
        [node.url, token],
    )
    page.wait_for_function("sub.state === 'live'", timeout=10_000)
    rules = tmp_path / "rules.toml"
    rules.write_text('[[pubsub.rules]]\npattern = "demo.ruled.**"\nsubscribe = "member"\n')
    # (a process: the CLI runs its own event loop, Playwright's holds this thread)
    done = run_cli("community", "rules", str(rules), "--data-dir", str(node.data_dir))
    assert 0 == done.returncode, done.stderr
    page.wait_for_function("sub.state !== 'live'", timeout=10_000)
    assert (
        {"errors": ["forbidden"], "states": ["connecting", "live", "closed forbidden"]},
        [],
    ) == (page.evaluate("out"), page.errors)
