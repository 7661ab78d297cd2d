"""The console's page script (hearthnet/static/console/console.js) run in Node.js with a
fake DOM, fake timers and a fake node (fetch): its polling follows the session."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from tests.console.nodejs import needs_node, run_module

# A stand-in for the page: elements by id, window and document events, storage, fetch
# answering the console's token trade and overview, setInterval counted.
FAKE_PAGE = """
class El {
  constructor() {
    this.hidden = false; this.textContent = ""; this.value = ""; this.dataset = {};
    this.children = []; this.handlers = {}; this.scrollTop = 0; this.scrollHeight = 0;
  }
  addEventListener(type, f) { this.handlers[type] = f; }
  setAttribute() {}
  replaceChildren(...c) { this.children = c; }
  append(...c) { this.children.push(...c); }
  get firstChild() { return this.children[0]; }
  get childElementCount() { return this.children.length; }
}
const els = new Map();
const $ = (id) => { if (!els.has(id)) els.set(id, new El()); return els.get(id); };
globalThis.document = {
  getElementById: $, createElement: () => new El(), visibilityState: "visible",
  addEventListener() {}, removeEventListener() {},
};
const onWindow = {};
globalThis.window = globalThis;
globalThis.addEventListener = (type, f) => { onWindow[type] = f; };
globalThis.removeEventListener = () => {};
const stored = new Map();
globalThis.sessionStorage = {
  getItem: (k) => stored.get(k) ?? null, setItem: (k, v) => stored.set(k, v),
  removeItem: (k) => stored.delete(k),
};
const token = (ms) => "hnt1:" + btoa(JSON.stringify({ community: "c", exp_ms: Date.now() + ms }));
globalThis.location = { origin: "http://node", hash: "#token=" + token(900_000), pathname: "/" };
globalThis.history = { replaceState() {} };
globalThis.setTimeout = () => 0;
globalThis.clearTimeout = () => {};
const intervals = new Map();
let nextId = 1;
globalThis.setInterval = (f, ms) => { intervals.set(nextId, { f, ms }); return nextId++; };
globalThis.clearInterval = (id) => { intervals.delete(id); };
const polls = () => [...intervals.values()].filter((t) => t.ms === 2000);
globalThis.WebSocket = class { static OPEN = 1; send() {} close() {} };
let overview = { status: 503, body: { error: "unavailable", message: "starting" } };
let overviews = 0;
globalThis.fetch = async (url) => {
  if (url === "/console/v1/token") return new Response(JSON.stringify({ token: token(3_600_000) }));
  if (url.endsWith("/console/v1/overview")) overviews++;
  return new Response(JSON.stringify(overview.body), { status: overview.status });
};
const settle = async () => {
  for (let i = 0; i < 20; i++) await new Promise((r) => setImmediate(r));
};
const login = async () => {
  $("login-token").value = token(900_000);
  $("login-form").handlers.submit({ preventDefault() {} });
  await settle();
};
"""


def run_console(tmp_path: Path, script: str) -> Any:
    """Run ``script`` after console.js was loaded on FAKE_PAGE; the JSON it prints."""
    static = resources.files("hearthnet") / "static"
    source = (static / "console" / "console.js").read_text(encoding="utf-8")
    client_url = "file://" + str(static / "hearthnet.js")
    page = tmp_path / "console.mjs"
    page.write_text(source.replace('"/client/hearthnet.js"', json.dumps(client_url)))
    head = FAKE_PAGE + f"await import({json.dumps(page.as_uri())});\n"
    return run_module(head + script)


@needs_node
def test_polling_stops_with_the_session_and_one_timer_per_login(tmp_path: Path) -> None:
    """One poll timer however often one logs in; it stops when the node refuses the
    session (revoked), and when the token's refresh fails; no poll after that."""
    script = """
onWindow.DOMContentLoaded();
await settle();
const out = { first: polls().length };
await login();                       // logged in again (say from another tab's URL)
out.again = polls().length;
overview = { status: 401, body: { error: "revoked", message: "revoked" } };
for (const t of polls()) t.f();
await settle();
out.revoked = [polls().length, $("login").hidden];
const before = overviews;
for (const t of intervals.values()) t.f();
await settle();
out.pollsAfter = overviews - before;
overview = { status: 503, body: { error: "unavailable", message: "busy" } };
await login();
out.third = polls().length;
window.hearthnetConsole.client.onTokenError(new Error("the trade failed"));
out.refreshFailed = [polls().length, $("login").hidden];
console.log(JSON.stringify(out));
"""
    assert {
        "first": 1,
        "again": 1,
        "revoked": [0, False],
        "pollsAfter": 0,
        "third": 1,
        "refreshFailed": [0, False],
    } == run_console(tmp_path, script)
