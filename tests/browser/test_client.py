"""Pages in a real browser (docs/browser.md): CORS (an allowed origin may use fetch,
EventSource and WebSocket, another is refused); hearthnet.js: gaps reach the caller,
messages' batch and single signatures checked in the page with verify: true,
llm.chat with a tool answered by the page, resume after the node restarts with no loss and
no duplicate, token refresh on a live session; with WebSocket blocked, the SSE fallback of
subscriptions and llm.chat by re-calls. One node serves them all (the resume test restarts
it last); a second one refuses WebSocket."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hearthnet.ids import b64url_decode
from tests.browser.support import (
    CLIENT_PAGE,
    PageServer,
    forged_token,
    open_client_page,
    process_token,
    publish,
    publish_burst,
)
from tests.helpers import NodeProcess, free_port, start_node_process

SCOPES = ("pub:demo.**", "sub:demo.**", "call:llm.chat@2")

# What a third-party page does with a node: publish (a preflighted fetch, for the token
# header), read it back over SSE, and open a pub/sub WebSocket.
CORS_PAGE = """<!doctype html><script type="module">
const node = new URLSearchParams(location.search).get("node");
const token = new URLSearchParams(location.search).get("token");
window.results = {};
try {
  const r = await fetch(node + "/pubsub/v1/topics/demo.cors/messages", {
    method: "POST",
    headers: {"Content-Type": "application/json", "X-HearthNet-Token": token},
    body: JSON.stringify({type: "note", data: {from: location.origin}})});
  results.fetch = r.status;
} catch (e) { results.fetch = "refused"; }
const es = new EventSource(node + "/pubsub/v1/subscribe?topics=demo.cors&last=1&token=" +
                           encodeURIComponent(token));
es.addEventListener("message", (e) => { results.sse = JSON.parse(e.data).data.from; es.close(); });
es.onerror = () => { if (!results.sse) { results.sse = "refused"; es.close(); } };
const ws = new WebSocket(node.replace("http", "ws") + "/pubsub/v1/subscribe");
ws.onopen = () => ws.send(JSON.stringify({type: "auth", token}));
ws.onmessage = (e) => { results.ws = JSON.parse(e.data).event; ws.close(); };
ws.onclose = () => { if (!results.ws) results.ws = "refused"; };
</script>"""

DONE = "window.results && results.fetch && results.sse && results.ws"


@pytest.fixture(scope="module")
def pages() -> Iterator[PageServer]:
    """The origin the test pages come from (the nodes allow it)."""
    server = PageServer({"/client": CLIENT_PAGE, "/cors": CORS_PAGE})
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def other_pages() -> Iterator[PageServer]:
    """An origin no node allows."""
    server = PageServer({"/cors": CORS_PAGE})
    try:
        yield server
    finally:
        server.close()


def _start(data_dir: Path, port: int, pages: PageServer) -> NodeProcess:
    return start_node_process(
        data_dir,
        "--port",
        str(port),
        "--llm-demo",
        env={
            "HEARTHNET_SECURITY_ALLOWED_ORIGINS": pages.origin,
            # a small per-subscriber queue, so a burst to a small window makes a gap
            "HEARTHNET_PUBSUB_QUEUE_MAX": "8",
        },
    )


@pytest.fixture(scope="module")
def restartable(
    tmp_path_factory: pytest.TempPathFactory, pages: PageServer
) -> Iterator[list[NodeProcess]]:
    """A node on a fixed port; the last test restarts it (same data dir), the list holds
    every process started."""
    procs = [_start(tmp_path_factory.mktemp("restart") / "node", free_port(), pages)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.stop()


def _run_cors_page(page: Any, origin: str, node: NodeProcess) -> dict[str, Any]:
    token = process_token(node, "pub:demo.**", "sub:demo.**")
    page.goto(f"{origin}/cors?node={node.url}&token={token}")
    page.wait_for_function(DONE, timeout=15_000)
    results: dict[str, Any] = page.evaluate("window.results")
    return results


def test_allowed_origin_uses_fetch_eventsource_and_websocket(
    page: Any, pages: PageServer, restartable: list[NodeProcess]
) -> None:
    """From an allowed origin: the preflighted publish, the SSE read and the WS auth work."""
    assert {"fetch": 200, "sse": pages.origin, "ws": "auth.ok"} == _run_cors_page(
        page, pages.origin, restartable[0]
    )


def test_other_origin_is_refused(
    page: Any, other_pages: PageServer, restartable: list[NodeProcess]
) -> None:
    """From an origin not listed: fetch, EventSource and WebSocket all fail in the page."""
    assert {"fetch": "refused", "sse": "refused", "ws": "refused"} == _run_cors_page(
        page, other_pages.origin, restartable[0]
    )


def test_refusals_and_preflight_on_the_wire(
    pages: PageServer, other_pages: PageServer, restartable: list[NodeProcess]
) -> None:
    """Raw HTTP: preflight answered for the allowed origin, 403 forbidden for another and
    for a DNS-rebound name, and a WebSocket upgrade from another origin gets no 101."""
    cors_node = restartable[0]
    host, port = cors_node.url.removeprefix("http://").split(":")

    def ask(method: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            conn.request(method, path, headers=headers)
            resp = conn.getresponse()
            resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}
        finally:
            conn.close()

    allowed, other = pages.origin, other_pages.origin
    pre_status, pre = ask(
        "OPTIONS",
        "/pubsub/v1/topics/demo.x/messages",
        {
            "Origin": allowed,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, x-hearthnet-token, x-evil",
        },
    )
    refused_status, _ = ask("GET", "/health", {"Origin": other})
    same_status, same = ask("GET", "/health", {"Origin": cors_node.url})
    ws_status, _ = ask(
        "GET",
        "/pubsub/v1/subscribe",
        {
            "Origin": other,
            "Upgrade": "websocket",
            "Connection": "Upgrade",
            "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version": "13",
        },
    )
    # DNS rebinding: a page on the attacker's name, rebound to the node's address, sends
    # that name as Origin and Host alike; the name is not one the node answers to.
    rebound = f"rebound.example:{port}"
    rebound_status, _ = ask("GET", "/health", {"Origin": f"http://{rebound}", "Host": rebound})
    assert (204, allowed, "content-type, x-hearthnet-token", 403, 200, cors_node.url, 403, 403) == (
        pre_status,
        pre.get("access-control-allow-origin"),
        pre.get("access-control-allow-headers"),
        refused_status,
        same_status,
        same.get("access-control-allow-origin"),
        ws_status,
        rebound_status,
    )


GAP = """([node, token]) => {
  window.got = []; window.gaps = [];
  const client = new hn.HearthNet(node, {token, window: 2});
  window.sub = client.subscribe(["demo.burst"], {
    onMessage: (m, at) => got.push(at.seq), onGap: (g) => gaps.push(g)});
}"""


def test_gap_reaches_the_caller(
    page: Any, pages: PageServer, restartable: list[NodeProcess]
) -> None:
    """A burst to a subscriber with a window of 2 and a queue of 8: the node drops for it and
    says so; onGap gets the ranges, and with the messages they account for every seq."""
    node = restartable[0]
    token = process_token(node, *SCOPES)
    open_client_page(page, pages, node.url)
    page.evaluate(GAP, [node.url, token])
    page.wait_for_function("sub.state === 'live'", timeout=15_000)
    seqs = publish_burst(node.url, token, "demo.burst", 40)
    page.wait_for_function(
        f"got.length + gaps.reduce((k, g) => k + g.to_seq - g.from_seq + 1, 0) >= {len(seqs)}",
        timeout=15_000,
    )
    got, gaps = page.evaluate("got"), page.evaluate("gaps")
    dropped = [seq for g in gaps for seq in range(g["from_seq"], g["to_seq"] + 1)]
    assert (True, seqs, []) == (bool(gaps), sorted(got + dropped), sorted(set(got) & set(dropped)))


VERIFY = """async ([node, token]) => {
  const client = new hn.HearthNet(node, {token});
  const first = (verify) => new Promise((resolve) => {
    const sub = client.subscribe(["demo.verify"], {since: {last: 1}, verify,
      onMessage: (m) => { sub.close(); resolve("sig" in m); }});
  });
  return [await first(false), await first(true)];
}"""


def test_envelopes_carry_sig_only_when_the_page_asks(
    page: Any, pages: PageServer, restartable: list[NodeProcess]
) -> None:
    """Message envelopes arrive without sig by default and with it under verify: true."""
    node = restartable[0]
    token = process_token(node, *SCOPES)
    publish(node.url, token, "demo.verify", "note", {"n": 1})
    open_client_page(page, pages, node.url)
    assert [False, True] == page.evaluate(VERIFY, [node.url, token])


SIGNED = """async ([node, token]) => {
  const client = new hn.HearthNet(node, {token});
  const got = [];
  const errors = [];
  let sub;
  await new Promise((resolve) => {
    setTimeout(resolve, 15000);  // a failing check delivers fewer: the assert shows them
    sub = client.subscribe(["demo.signed"], {since: {last: 9}, verify: true,
      onError: (e) => errors.push(e.code),
      onMessage: (m) => { got.push(m); if (got.length === 9) resolve(); }});
  });
  const forged = {...got[3], data: {n: 99}};
  sub._take({event: "message", data: forged, seq: sub.seq + 1}, null);  // as if the node sent it
  await sub._inOrder;
  sub.close();
  const alone = await hn.verifyMessage(forged).then(() => "ok", (e) => e.code);
  const page = await client.history("demo.signed", {since_seq: 0, verify: true});
  return {sigs: got.map((m) => typeof m.sig), ns: got.map((m) => m.data.n),
          delivered: sub.delivered, rejected: sub.rejected, errors, alone,
          history: page.messages.length};
}"""


def test_a_verifying_page_checks_batch_and_single_signatures_and_skips_a_forgery(
    page: Any, pages: PageServer, restartable: list[NodeProcess]
) -> None:
    """With verify: true hearthnet.js checks each message with WebCrypto before onMessage:
    a burst committed together (one batch signature, a Merkle path each) and a lone
    publish (signed alone) are delivered; an altered copy is skipped, counted and given
    to onError, and verifyMessage refuses it; history with verify checks its page."""
    node = restartable[0]
    token = process_token(node, *SCOPES)
    publish_burst(node.url, token, "demo.signed", 8)
    publish(node.url, token, "demo.signed", "note", {"n": 8})
    open_client_page(page, pages, node.url)
    got = page.evaluate(SIGNED, [node.url, token])
    assert (
        (True, "string", [*range(9)]),
        (9, 1, ["invalid_signature"], "invalid_signature", 9),
    ) == (
        ("object" in got["sigs"][:8], got["sigs"][8], got["ns"]),
        (got["delivered"], got["rejected"], got["errors"], got["alone"], got["history"]),
    )
    assert [] == page.errors


BINARY = """async ([node, token]) => {
  const client = new hn.HearthNet(node, {token});
  await client.publish("demo.bin", "blob", new Uint8Array([0, 1, 254, 255]));
  return await new Promise((resolve) => {
    const sub = client.subscribe(["demo.bin"], {since: {last: 2},
      onMessage: (m) => {
        const p = hn.messagePayload(m);
        if (p instanceof Uint8Array && p.length === 3) {
          sub.close();
          resolve({bytes: Array.from(p), text: m.data, enc: m.data_enc});
        }
      }});
  });
}"""


def test_binary_payloads_decode_in_the_page(
    page: Any, pages: PageServer, restartable: list[NodeProcess]
) -> None:
    """A page decodes a binary payload another client published with messagePayload, and
    publishes a Uint8Array the node stores as bytes."""
    node = restartable[0]
    token = process_token(node, *SCOPES)
    _token_json(
        node,
        token,
        "POST",
        "/pubsub/v1/topics/demo.bin/messages",
        {"type": "blob", "data": "BwgJ", "data_enc": "base64url"},
    )
    open_client_page(page, pages, node.url)
    got = page.evaluate(BINARY, [node.url, token])
    history = _token_json(node, token, "GET", "/pubsub/v1/topics/demo.bin/history")
    stored = [
        (b64url_decode(f["data"]["data"]), f["data"]["data_enc"]) for f in history["messages"]
    ]
    assert (
        {"bytes": [7, 8, 9], "text": "BwgJ", "enc": "base64url"},
        [(b"\x07\x08\x09", "base64url"), (b"\x00\x01\xfe\xff", "base64url")],
    ) == (got, stored)


IDEMPOTENT = """async ([node, token]) => {
  const client = new hn.HearthNet(node, {token});
  const opts = {idempotency_key: "page-order-1"};
  const first = await client.publish("demo.idem", "note", {n: 1}, opts);
  const again = await client.publish("demo.idem", "note", {n: 1}, opts);
  let refused = null;
  try {
    await client.publish("demo.idem", "note", {n: 2}, {idempotency_key: ""});
  } catch (err) {
    refused = err.code;
  }
  return {first, again, refused};
}"""


def test_a_publish_sent_again_with_its_idempotency_key_is_published_once(
    page: Any, pages: PageServer, restartable: list[NodeProcess]
) -> None:
    """hn.publish with idempotency_key: sent twice, the second resolves to the first's id
    and seq with duplicate true, and the topic holds one message; an empty key is
    refused bad_request."""
    node = restartable[0]
    token = process_token(node, *SCOPES)
    open_client_page(page, pages, node.url)
    got = page.evaluate(IDEMPOTENT, [node.url, token])
    history = _token_json(node, token, "GET", "/pubsub/v1/topics/demo.idem/history")
    first, again = got["first"], got["again"]
    assert (None, True, "bad_request") == (
        first.get("duplicate"),
        again["duplicate"],
        got["refused"],
    )
    assert (first["id"], first["seq"]) == (again["id"], again["seq"])
    assert [first["seq"]] == [f["seq"] for f in history["messages"]]


def _token_json(
    node: NodeProcess, token: str, method: str, path: str, body: Any = None
) -> dict[str, Any]:
    """One HTTP request with a token (blocking); the JSON answer."""
    host, port = node.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request(
            method,
            path,
            body=json.dumps(body) if body is not None else None,
            headers={"Content-Type": "application/json", "X-HearthNet-Token": token},
        )
        answer: dict[str, Any] = json.loads(conn.getresponse().read())
        return answer
    finally:
        conn.close()


RESETS = """async ([node, token]) => {
  const client = new hn.HearthNet(node, {token});
  const live = (sub) => new Promise((resolve) => {
    const poll = () => (sub.state === "live" ? resolve() : setTimeout(poll, 20));
    poll();
  });
  const first = client.subscribe(["demo.reset"]);
  await live(first);
  const epoch = first.epoch;
  first.close();
  window.got = [];
  window.ahead = client.subscribe(["demo.reset"], {since: {epoch, seq: 1000000},
    onMessage: (m, at) => got.push(["ahead", m.data.n, at.seq])});
  window.other = client.subscribe(["demo.reset"], {since: {epoch: "not-this-epoch", seq: 3},
    onMessage: (m, at) => got.push(["other", m.data.n, at.seq])});
  await live(ahead);
  await live(other);
  return {epoch, resets: [ahead.resets, other.resets]};
}"""


def test_resets_reach_the_caller_and_resume_without_loss(
    page: Any, pages: PageServer, restartable: list[NodeProcess]
) -> None:
    """A start beyond the node's head is answered reset cursor_ahead and resumes from the
    head; a start from another epoch, reset epoch_changed, resumes live. Each subscription
    keeps the resets it got (onReset too), with the start that was refused, and then
    receives the next message published."""
    node = restartable[0]
    token = process_token(node, *SCOPES)
    head = publish(node.url, token, "demo.reset", "note", {"n": 0})["seq"]
    open_client_page(page, pages, node.url)
    result = page.evaluate(RESETS, [node.url, token])
    seq = publish(node.url, token, "demo.reset", "note", {"n": 1})["seq"]
    page.wait_for_function("got.length === 2", timeout=15_000)
    epoch = result["epoch"]
    ahead, other = result["resets"]
    assert (
        [("cursor_ahead", epoch, {"epoch": epoch, "seq": 1000000})],
        [("epoch_changed", epoch, {"epoch": "not-this-epoch", "seq": 3})],
        [["ahead", 1, seq], ["other", 1, seq]],
        [],
    ) == (
        [(r["reason"], r["epoch"], r["since"]) for r in ahead],
        [(r["reason"], r["epoch"], r["since"]) for r in other],
        sorted(page.evaluate("got")),
        page.errors,
    )
    assert (True, True) == (head < seq, all(r["head_seq"] >= head for r in ahead + other))


CHAT = """async ([node, token]) => {
  const client = new hn.HearthNet(node, {token});
  const asked = [];
  const out = await client.chat([{role: "user", content: "what time is it?"}], {
    tools: [{name: "time", description: "the time here",
             parameters: {type: "object", properties: {}}}],
    toolHandler: async (call) => { asked.push(call.name); return {now: "12:34"}; },
    params: {backend: "demo"}});
  return {text: out.text, asked, stop: out.done.stop_reason, rounds: out.done.tool_rounds};
}"""


def test_llm_chat_tool_answered_by_the_page_inline(
    page: Any, pages: PageServer, restartable: list[NodeProcess]
) -> None:
    """llm.chat over WebSocket: the model asks for the page's tool, the page's answer goes
    back on the same socket and the model finishes in the same stream."""
    node = restartable[0]
    open_client_page(page, pages, node.url)
    result = page.evaluate(CHAT, [node.url, process_token(node, *SCOPES)])
    assert (["time"], "end", 1, True) == (
        result["asked"],
        result["stop"],
        result["rounds"],
        "12:34" in result["text"],
    )


SUBSCRIBE = """([node, token, fresh]) => {
  window.got = []; window.states = []; window.refreshed = 0;
  const client = new hn.HearthNet(node, {token, refreshToken: async () => {
    window.refreshed++; return fresh; }});
  window.sub = client.subscribe(["demo.resume"], {
    onMessage: (m, at) => got.push([m.data.n, at.seq]),
    onState: (s) => states.push(s)});
}"""


def test_resume_after_node_restart_no_loss_no_duplicate(
    page: Any, pages: PageServer, restartable: list[NodeProcess]
) -> None:
    """The page subscribes, the node process restarts (same port and data), messages are
    published before and right after the restart: the page gets each once, in order,
    resuming over WebSocket by (epoch, seq); its token (5 s left, so refreshed halfway)
    was refreshed on the live session first."""
    node = restartable[0]
    token = process_token(node, *SCOPES, sub="page")
    short = process_token(node, *SCOPES, ttl_ms=5_000, sub="page")
    open_client_page(page, pages, node.url)
    page.evaluate(SUBSCRIBE, [node.url, short, token])
    expires = json.loads(b64url_decode(token.removeprefix("hnt1:")))["exp_ms"]
    # the node took the fresh token on the live session (its auth.ok names the new expiry)
    page.wait_for_function(f"sub.state === 'live' && sub.expiresMs === {expires}", timeout=15_000)
    for n in range(5):
        publish(node.url, token, "demo.resume", "note", {"n": n})
    page.wait_for_function("got.length === 5", timeout=15_000)
    port = node.url.rsplit(":", 1)[1]
    node.stop()
    page.wait_for_function("states.includes('retrying')", timeout=15_000)
    restarted = _start(node.data_dir, int(port), pages)
    restartable.append(restarted)
    for n in range(5, 10):
        publish(restarted.url, token, "demo.resume", "note", {"n": n})
    page.wait_for_function("got.length >= 10 && sub.state === 'live'", timeout=30_000)
    got = page.evaluate("got")
    seqs = [seq for _, seq in got]
    assert (list(range(10)), sorted(seqs), "ws", 1, []) == (
        [n for n, _ in got],
        seqs,
        page.evaluate("sub.transport"),
        page.evaluate("refreshed"),
        page.errors,
    )


@pytest.fixture(scope="module")
def no_websocket(pages: PageServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A node that refuses every WebSocket upgrade (503), as if a proxy blocked them."""
    node = start_node_process(
        tmp_path_factory.mktemp("nows") / "node",
        "--llm-demo",
        env={
            "HEARTHNET_SECURITY_ALLOWED_ORIGINS": pages.origin,
            "HEARTHNET_TRANSPORT_WEBSOCKET_ENABLED": "false",
        },
    )
    try:
        yield node
    finally:
        node.stop()


SSE = """([node, token]) => {
  window.got = [];
  const client = new hn.HearthNet(node, {token});
  window.sub = client.subscribe(["demo.sse"], {since: {last: 10},
    onMessage: (m) => got.push(m.data.n)});
}"""


def test_sse_fallback_when_websocket_is_blocked(
    page: Any, pages: PageServer, no_websocket: NodeProcess
) -> None:
    """WebSocket refused while the node answers HTTP: the subscription falls back to SSE
    and gets the backlog and live messages."""
    node = no_websocket
    token = process_token(node, *SCOPES)
    publish(node.url, token, "demo.sse", "note", {"n": 1})
    open_client_page(page, pages, node.url)
    page.evaluate(SSE, [node.url, token])
    page.wait_for_function("got.length === 1", timeout=20_000)
    publish(node.url, token, "demo.sse", "note", {"n": 2})
    page.wait_for_function("got.length === 2", timeout=10_000)
    assert ([1, 2], "sse", []) == (
        page.evaluate("got"),
        page.evaluate("sub.transport"),
        page.errors,
    )


SSE_REFUSED = """([node, tokens]) => {
  window.outcomes = {};
  const run = (name, token, topic, refreshToken) => {
    const out = {errors: [], states: []};
    outcomes[name] = out;
    new hn.HearthNet(node, {token, refreshToken, transport: "sse"}).subscribe([topic], {
      onError: (e) => out.errors.push(e.code),
      onState: (s, detail) => out.states.push(detail && detail.code ? `${s} ${detail.code}` : s)});
  };
  run("bad", tokens.bad, "demo.sse");
  run("forbidden", tokens.good, "secret.sse");
  run("refreshed", tokens.expired, "demo.sse", async () => tokens.good);
}"""


def test_sse_refusals_say_why_and_end(
    page: Any, pages: PageServer, no_websocket: NodeProcess
) -> None:
    """Over SSE the node refuses before the stream starts (an EventSource sees only
    "error"): a token whose signature fails and a topic it does not cover reach onError
    with the node's code and end the subscription; an expired token is replaced by
    refreshToken and the stream goes live."""
    node = no_websocket
    good = process_token(node, *SCOPES, sub="page")
    bad = forged_token(good)
    expired = process_token(node, *SCOPES, ttl_ms=1, sub="page")
    open_client_page(page, pages, node.url)
    page.evaluate(SSE_REFUSED, [node.url, {"good": good, "bad": bad, "expired": expired}])
    settled = "Object.values(outcomes).every((o) => o.states.length >= 2)"
    page.wait_for_function(f"{settled} && outcomes.refreshed.states.at(-1) === 'live'")
    page.wait_for_timeout(700)  # longer than the first backoff: a retry would show
    outcomes = page.evaluate("outcomes")
    assert {
        "bad": {
            "errors": ["invalid_signature"],
            "states": ["connecting", "closed invalid_signature"],
        },
        "forbidden": {"errors": ["forbidden"], "states": ["connecting", "closed forbidden"]},
        "refreshed": {"errors": [], "states": ["connecting", "retrying", "connecting", "live"]},
    } == {name: outcomes[name] for name in ("bad", "forbidden", "refreshed")}


def test_llm_chat_tool_answered_by_the_page_over_sse(
    page: Any, pages: PageServer, no_websocket: NodeProcess
) -> None:
    """llm.chat without WebSocket: the model asks for the page's tool, the stream ends
    with tool_calls, the client runs the tool and calls again; the answer carries the
    tool's result."""
    node = no_websocket
    open_client_page(page, pages, node.url)
    result = page.evaluate(CHAT, [node.url, process_token(node, *SCOPES)])
    assert (["time"], "end", True) == (result["asked"], result["stop"], "12:34" in result["text"])
