"""hearthnet.js's pure helpers agree with the node: topic matching (spec §6.1), ULIDs and
token decoding, run in Node.js (no browser needed)."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from hearthnet.identity import KeyPair
from hearthnet.ids import is_ulid
from hearthnet.pubsub.topics import TopicPattern
from hearthnet.tokens import CapabilityToken, Scope
from tests.console.nodejs import needs_node, run_module

CASES = [
    ("a.b", "a.b"),
    ("a.*", "a.b"),
    ("a.*", "a.b.c"),
    ("a.**", "a"),
    ("a.**", "a.b"),
    ("a.**", "a.b.c"),
    ("*.b.**", "x.b.c.d"),
    ("**", "a"),
    ("a.**.z", "a.b.c.z"),
    ("chat.session.*", "chat.session"),
]


def run_with_hn(script: str) -> Any:
    """Run ``script`` as an ES module in Node.js with hearthnet.js imported as ``hn``; the
    JSON it prints."""
    source = resources.files("hearthnet") / "static" / "hearthnet.js"
    head = f"const hn = await import({json.dumps('file://' + str(source))});\n"
    return run_module(head + script)


@needs_node
def test_helpers_agree_with_the_node() -> None:
    """topicMatches gives the node's answers; ulid() makes ULIDs; decodeToken reads a token."""
    keys = KeyPair.generate()
    token = CapabilityToken.issue(
        keys, community=keys.node_id, scopes=[Scope("sub", "a.**")], ttl_ms=1000, now_ms=1
    )
    script = f"""
const cases = {json.dumps(CASES)};
console.log(JSON.stringify({{
  matches: cases.map(([p, t]) => hn.topicMatches(p, t)),
  ulids: [hn.ulid(), hn.ulid(1_700_000_000_000)],
  claims: hn.decodeToken({json.dumps(token.encode())}),
}}));
"""
    got = run_with_hn(script)
    assert (
        [TopicPattern.parse(p).matches(t) for p, t in CASES],
        [True, True],
        token.to_json(),
    ) == (got["matches"], [is_ulid(u) for u in got["ulids"]], got["claims"])


@needs_node
def test_lean_frames_in_hearthnet_js() -> None:
    """opts.fields goes into the subscribe frame; frames without id are delivered once each."""
    script = """
const got = [];
const sent = [];
const sub = new hn.Subscription(null, ["a.b"], {
  fields: ["data"], onMessage: (envelope, meta) => got.push([envelope.data, meta.seq]),
});
sub._onFrame({ event: "auth.ok", data: {} }, { send: (text) => sent.push(JSON.parse(text)) });
for (const [data, seq] of [[1, 1], [2, 2], [2, 2], [3, 3]]) sub._onMessage({ data }, seq, null);
console.log(JSON.stringify({ sent, got }));
"""
    assert {
        "sent": [{"type": "subscribe", "topics": ["a.b"], "fields": ["data"]}],
        "got": [[1, 1], [2, 2], [3, 3]],
    } == run_with_hn(script)


@needs_node
def test_token_refresh_is_planned_by_the_tokens_life() -> None:
    """refreshToken runs 65 s before expiry, or halfway through what is left of a token
    of less than 130 s (not once a second); the node's auth.expiring for the token's own
    expiry waits for that plan when it is near, and refreshes at once when the plan is
    more than 30 s away (the page's clock is behind) or the node names an earlier end (a
    rotation voided the token)."""
    script = """
const waits = [];
globalThis.setTimeout = (f, ms) => { waits.push(ms); return 0; };
globalThis.clearTimeout = () => {};
const token = (ttl) => "hnt1:" + hn.bytesToBase64url(new TextEncoder().encode(
  JSON.stringify({ community: "c", exp_ms: Date.now() + ttl })));
const refreshed = [];
const client = (ttl) => new hn.HearthNet("http://node", {
  token: token(ttl), refreshToken: async () => { refreshed.push(ttl); return token(ttl); } });
const long = client(3_600_000);
const short = client(30_000);
const expiring = async (c, ms) => {
  const frame = { event: "auth.expiring", data: { expires_ms: ms } };
  new hn.Subscription(c, ["a"], {})._onFrame(frame, null);
  await c._refreshing;
};
await expiring(short, short._claims.exp_ms);          // as planned: in 15 s
await expiring(short, short._claims.exp_ms - 10_000); // voided early: now
await expiring(long, long._claims.exp_ms);            // the page's clock is behind: now
console.log(JSON.stringify({ waits: waits.slice(0, 2), refreshed }));
"""
    got = run_with_hn(script)
    long_wait, short_wait = got["waits"]
    assert (True, True, [30_000, 3_600_000]) == (
        3_534_000 < long_wait <= 3_535_000,
        14_000 < short_wait <= 15_000,
        got["refreshed"],
    )


@needs_node
def test_reconnect_backoff_doubles_to_30_s_and_honours_retry_after() -> None:
    """A subscription's reconnects wait 0.5 s doubling to 30 s (+-20 %), never less than
    the node's retry_after_ms, and start at 0.5 s again once it was live."""
    script = """
const waits = [];
globalThis.setTimeout = (f, ms) => { waits.push(Math.round(ms)); return 0; };
globalThis.clearTimeout = () => {};
const token = "hnt1:" + hn.bytesToBase64url(new TextEncoder().encode(
  JSON.stringify({ community: "c", exp_ms: Date.now() + 3_600_000 })));
const sub = new hn.Subscription(new hn.HearthNet("http://node", { token }), ["a"], {});
for (let i = 0; i < 8; i++) sub._retry("down");
sub._retry("busy", { retry_after_ms: 45_000 });
sub._onFrame({ event: "subscribed", data: { epoch: "e", head_seq: 0 } }, null);
sub._retry("dropped");
console.log(JSON.stringify(waits));
"""
    waits = run_with_hn(script)
    nominal = [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000, 500]
    assert (True, 45_000) == (
        all(
            0.8 * n <= w <= 1.2 * n
            for w, n in zip(waits[:8] + waits[9:], nominal[:8] + nominal[9:], strict=True)
        ),
        waits[8],
    ), waits


@needs_node
def test_a_silent_socket_is_pinged_then_given_up() -> None:
    """A live subscription whose socket brings nothing for 25 s sends a ping frame; a
    pong keeps it; when nothing comes 10 s after a ping it closes that socket and
    reconnects (a socket can die without a close event the browser would see)."""
    script = """
let now = 1_800_000_000_000;
Date.now = () => now;
const ticks = [];
globalThis.setInterval = (f, ms) => { ticks.push(f); return ticks.length; };
globalThis.clearInterval = () => {};
globalThis.setTimeout = () => 0;
globalThis.clearTimeout = () => {};
const sockets = [];
globalThis.WebSocket = class {
  static OPEN = 1;
  constructor(url) { this.readyState = 1; this.sent = []; this.closed = null; sockets.push(this); }
  send(text) { this.sent.push(JSON.parse(text).type); }
  close(code) { this.closed = code; }
};
const token = "hnt1:" + hn.bytesToBase64url(new TextEncoder().encode(
  JSON.stringify({ community: "c", exp_ms: now + 3_600_000 })));
const states = [];
const sub = new hn.HearthNet("http://node", { token }).subscribe(["a"], {
  onState: (s) => states.push(s) });
await null;
const ws = sockets[0];
const frame = (event, data = {}) => ws.onmessage({ data: JSON.stringify({ event, data }) });
ws.onopen();
frame("auth.ok");
frame("subscribed", { epoch: "e", head_seq: 0 });
const tick = (ms) => { now += ms; ticks.at(-1)(); };
tick(26_000);             // quiet: ping
frame("pong", { ts: now }); // answered
tick(5_000);
tick(26_000);             // quiet again: ping
tick(5_000);
const before = ws.closed;
tick(6_000);              // 11 s after the ping, nothing: given up
console.log(JSON.stringify({ sent: ws.sent, before, closed: ws.closed, states }));
"""
    assert {
        "sent": ["auth", "subscribe", "ping", "ping"],
        "before": None,
        "closed": 1000,
        "states": ["connecting", "live", "retrying"],
    } == run_with_hn(script)


@needs_node
def test_one_socket_per_subscription() -> None:
    """subscribe() connects after it returned; a reconnect() before that, and a retry
    timer firing twice, still open one socket (two would both stay subscribed)."""
    script = """
const timers = [];
globalThis.setTimeout = (f, ms) => { timers.push(f); return timers.length; };
globalThis.clearTimeout = () => {};
globalThis.setInterval = () => 0;
globalThis.clearInterval = () => {};
const sockets = [];
globalThis.WebSocket = class {
  static OPEN = 1;
  constructor() { this.readyState = 0; sockets.push(this); }
  send() {}
  close() {}
};
const token = "hnt1:" + hn.bytesToBase64url(new TextEncoder().encode(
  JSON.stringify({ community: "c", exp_ms: Date.now() + 3_600_000 })));
const sub = new hn.HearthNet("http://node", { token }).subscribe(["a"], {});
sub.reconnect();
await null;
for (const f of timers.splice(0)) { f(); f(); }
console.log(JSON.stringify(sockets.length));
"""
    assert 1 == run_with_hn(script)


@needs_node
def test_back_online_or_visible_retries_and_pings_at_once() -> None:
    """When the browser comes back (window `online`, the page visible again), a
    subscription waiting out its backoff reconnects at once and resumes from its cursor
    (one waiting for the node's retry_after_ms still waits for it), and a live socket is
    pinged at once and given up 10 s later when nothing answers; a hidden page does
    nothing, and a closed client no longer listens."""
    script = """
let now = 1_800_000_000_000;
Date.now = () => now;
const timers = [];
globalThis.setTimeout = (f, ms) => { timers.push({ f, ms, live: true }); return timers.length; };
globalThis.clearTimeout = (id) => { if (id) timers[id - 1].live = false; };
const ticks = [];
globalThis.setInterval = (f) => { ticks.push(f); return ticks.length; };
globalThis.clearInterval = () => {};
globalThis.window = new EventTarget();
globalThis.document = new EventTarget();
document.visibilityState = "visible";
const sockets = [];
globalThis.WebSocket = class {
  static OPEN = 1;
  constructor() { this.readyState = 1; this.sent = []; this.closed = null; sockets.push(this); }
  send(text) { this.sent.push(JSON.parse(text)); }
  close(code) { this.closed = code; }
};
const token = "hnt1:" + hn.bytesToBase64url(new TextEncoder().encode(
  JSON.stringify({ community: "c", exp_ms: now + 3_600_000 })));
const client = new hn.HearthNet("http://node", { token });
const sub = client.subscribe(["a"], {});
const busy = client.subscribe(["b"], {});
await null;
const frame = (ws, event, data = {}, seq) =>
  ws.onmessage({ data: JSON.stringify({ event, data, seq }) });
const live = (ws) => {
  ws.onopen();
  frame(ws, "auth.ok");
  frame(ws, "subscribed", { epoch: "e", head_seq: 5 });
};
live(sockets[0]);
frame(sockets[0], "message", { id: "m6", ts: 1 }, 6);
sockets[0].onclose({ code: 1006 });       // dropped: waits 0.5 s
busy._ws = null;
busy._retry("busy", { retry_after_ms: 45_000 });
const out = { states: [sub.state, busy.state] };
document.visibilityState = "hidden";
document.dispatchEvent(new Event("visibilitychange"));
out.hidden = sockets.length;
window.dispatchEvent(new Event("online"));
out.online = sockets.length;              // sub's new socket, busy's none yet
out.busyWait = timers.filter((t) => t.live && t.ms > 50).map((t) => t.ms); // (50: an ack)
const ws = sockets.at(-1);
live(ws);
out.resumed = ws.sent[1].since;
document.visibilityState = "visible";
document.dispatchEvent(new Event("visibilitychange"));
out.pinged = ws.sent.slice(2).map((f) => f.type);
const tick = (ms) => { now += ms; ticks.at(-1)(); };
tick(5_000);
out.after5 = ws.closed;
tick(5_000);
out.after10 = ws.closed;
client.close();
window.dispatchEvent(new Event("online"));
out.closed = sockets.length;
console.log(JSON.stringify(out));
"""
    assert {
        "states": ["retrying", "retrying"],
        "hidden": 2,
        "online": 3,
        "busyWait": [45_000],
        "resumed": {"epoch": "e", "seq": 6},
        "pinged": ["ping"],
        "after5": None,
        "after10": 1000,
        "closed": 3,
    } == run_with_hn(script)


@needs_node
def test_a_stream_refused_expired_at_its_start_is_opened_again() -> None:
    """hn.chat and hn.stream refused `expired` before any frame of the stream are opened
    once more with a token from refreshToken, over WebSocket and over SSE (as publish and
    history are); an `expired` error after a frame came is the stream's end, not retried
    (nothing is repeated)."""
    script = """
globalThis.setTimeout = () => 0;
globalThis.clearTimeout = () => {};
const settle = async () => {
  for (let i = 0; i < 10; i++) await new Promise((r) => setImmediate(r));
};
const token = (n) => "hnt1:" + hn.bytesToBase64url(new TextEncoder().encode(
  JSON.stringify({ community: "c", exp_ms: Date.now() + 3_600_000 + n })));
const sockets = [];
globalThis.WebSocket = class {
  static OPEN = 1;
  constructor() {
    this.readyState = 1; this.sent = []; sockets.push(this);
    queueMicrotask(() => this.onopen());
  }
  send(text) { this.sent.push(JSON.parse(text)); }
  close() { this.readyState = 3; }
};
const frame = (ws, event, data) => ws.onmessage({ data: JSON.stringify({ event, data }) });
const expired = { code: "expired", message: "the token expired" };
let refreshed = 0;
const client = (transport) => new hn.HearthNet("http://node", {
  token: token(0), transport, refreshToken: async () => token(++refreshed) });
const out = {};

// chat over WebSocket: refused at its start, answered on a second socket
const ws = client("auto");
const answer = ws.chat([{ role: "user", content: "hi" }]);
await settle();
frame(sockets[0], "error", expired);
sockets[0].onclose({ code: 1008 });
await settle();
frame(sockets[1], "token", { text: "hello" });
frame(sockets[1], "done", { stop_reason: "end" });
out.chat = [(await answer).text, sockets.length, sockets[1].sent[0].token === ws.token, refreshed];

// a stream refused expired after its first frame: that error ends it
const late = client("auto").stream("echo", {});
await settle();
frame(sockets[2], "token", { text: "a" });
frame(sockets[2], "error", expired);
const lateFrames = [];
for await (const f of late) lateFrames.push(f.event + (f.data.code ? ":" + f.data.code : ""));
out.late = [lateFrames, sockets.length, refreshed];

// over SSE: the POST refused 401 expired, sent again with the fresh token
const sent = [];
globalThis.fetch = async (url, init) => {
  sent.push(init.headers["X-HearthNet-Token"]);
  if (sent.length === 1) {
    return new Response(JSON.stringify({ error: "expired", message: "old" }), { status: 401 });
  }
  return new Response('event: token\\ndata: {"text":"b"}\\n\\nevent: done\\ndata: {}\\n\\n');
};
const sse = client("sse");
const sseFrames = [];
for await (const f of sse.stream("echo", {})) sseFrames.push(f.event);
out.sse = [sseFrames, sent.length, sent[1] === sse.token, sent[0] !== sent[1]];
console.log(JSON.stringify(out));
"""
    assert {
        "chat": ["hello", 2, True, 1],
        "late": [["token", "error:expired"], 3, 1],
        "sse": [["token", "done"], 2, True, True],
    } == run_with_hn(script)
