// The HearthNet console: reads /console/v1/overview every few seconds and tails topics
// with hearthnet.js. Static, no build step; see docs/browser.md.
import { HearthNet, HearthNetError } from "/client/hearthnet.js";

const KEY = "hearthnet.console.token";
const POLL_MS = 2000;
const $ = (id) => document.getElementById(id);
let client = null; // the session's client; null once it ended
let pollTimer = null; // at most one, running while a session is
let tail = null;
let room = null;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child ?? "");
  return node;
}

function short(id) {
  return id ? id.slice(0, 18) + "…" : "";
}

async function trade(token) {
  // the next token of this console session (same jti; see hearthnet/console/access.py)
  const resp = await fetch("/console/v1/token", { method: "POST", headers: { "X-HearthNet-Token": token } });
  const obj = await resp.json();
  if (!resp.ok) throw new HearthNetError(obj.error, obj.message);
  sessionStorage.setItem(KEY, obj.token);
  return obj.token;
}

function showLogin(message) {
  $("app").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
}

async function start(token) {
  let session;
  try {
    session = await trade(token);
  } catch (err) {
    sessionStorage.removeItem(KEY);
    showLogin(`That token does not open the console (${err.message}).`);
    return;
  }
  stop(); // a session still open (a second login)
  const c = new HearthNet(location.origin, {
    token: session,
    refreshToken: trade,
    onTokenError: () => { if (client === c) end("The console session ended; log in again."); },
  });
  client = c;
  $("login").hidden = true;
  $("app").hidden = false;
  $("logout").hidden = false;
  await poll();
  if (client !== c) return; // it ended during the first poll, or another login replaced it
  pollTimer = setInterval(poll, POLL_MS);
  joinRoom($("chat-room").value);
}

/** Stop the session: no more polls with its token, its subscriptions closed. */
function stop() {
  clearInterval(pollTimer);
  pollTimer = null;
  if (client) client.close(); // the tail, the chat room and the token's refresh
  client = tail = room = null;
}

function end(message) {
  stop();
  showLogin(message);
}

async function poll() {
  const c = client;
  if (!c) return;
  try {
    const overview = await c.request("GET", "/console/v1/overview");
    if (client === c) render(overview);
  } catch (err) {
    if (client !== c) return;
    if (err.code === "expired" || err.code === "unauthorized" || err.code === "revoked") {
      end(`Logged out: ${err.message}`);
    }
  }
}

function render(o) {
  const n = o.node;
  $("node-name").textContent = n.name;
  const dl = $("identity-list");
  dl.replaceChildren();
  for (const [k, v] of [
    ["node", n.node], ["short id", n.short_id], ["version", n.version],
    ["uptime", `${Math.round(n.uptime_s)} s`], ["log", `epoch ${n.log_epoch}, head ${n.log_head}`],
    ["subscribers", n.subscribers], ["streams", n.streams_active], ["you", o.you.identity],
  ]) dl.append(el("dt", {}, k), el("dd", { class: k === "node" ? "mono" : "" }, String(v)));
  $("community-id").textContent = o.community.id;
  $("members").replaceChildren(...o.community.members.map((m) =>
    el("tr", {}, el("td", { title: m.node }, m.name || short(m.node)), el("td", {}, m.level), el("td", {}, m.role))));
  const peers = o.peers.filter((p) => p.linked);
  $("peer-rows").replaceChildren(...(peers.length ? peers.map((p) => {
    const path = p.path === "relayed" ? `relayed via ${short(p.via)}` : p.path;
    return el("tr", { class: "peer" },
      el("td", { title: p.node }, p.name || short(p.node)),
      el("td", { class: `path-${p.path}` }, path),
      el("td", {}, p.rtt_ms_p50 == null ? "–" : `${p.rtt_ms_p50.toFixed(1)} ms`),
      el("td", {}, p.loss_pct == null ? "–" : `${p.loss_pct.toFixed(0)} %`));
  }) : [el("tr", {}, el("td", { colspan: 4, class: "muted" }, "no linked peer"))]));
  $("topic-rows").replaceChildren(...o.topics.map((t) => {
    const watch = el("a", { href: "#", class: "topic" }, t.topic);
    watch.addEventListener("click", (ev) => { ev.preventDefault(); $("tail-topic").value = t.topic; watchTopic(t.topic); });
    return el("tr", {}, el("td", {}, watch), el("td", {}, t.rate_per_s.toFixed(1)),
      el("td", {}, t.subscribers), el("td", {}, t.presence), el("td", {}, t.messages));
  }));
  renderRelays(o.relays);
  if (o.health) {
    const s = o.health.summary;
    $("health-info").replaceChildren(
      el("p", {}, `${o.health.path}, written ${new Date(o.health.written_ms).toLocaleString()}`),
      el("p", {}, `${s.nodes} nodes, ${s.links} links, ${(s.partitions || []).length} partitions, ` +
        `${(s.flapping_links || []).length} flapping links, relay-only: ${(s.relay_only_nodes || []).length}`));
  }
}

function watchTopic(pattern) {
  if (tail) tail.close();
  $("tail-messages").replaceChildren();
  $("tail-presence").replaceChildren();
  const rooms = new Map(); // topic -> client_id -> member
  const drawPresence = () => {
    const members = new Map();
    for (const room of rooms.values()) for (const [id, m] of room) members.set(id, m);
    $("tail-presence").replaceChildren(
      ...[...members.values()].map((m) => el("li", { title: m.identity }, `${m.name || short(m.identity)}${m.status ? " · " + m.status : ""}`)));
  };
  tail = client.subscribe([pattern], {
    since: { last: 20 },
    presence: { name: "console", status: "watching" },
    onState: (state, detail) => {
      if (state === "live") { rooms.clear(); drawPresence(); } // (re)subscribed: snapshots follow
      $("tail-state").textContent = `${pattern}: ${state}${state === "live" && tail.transport ? " (" + tail.transport + ")" : ""}`;
    },
    onError: (err) => $("tail-messages").append(el("li", { class: "error" }, err.message)),
    onMessage: (m, at) => {
      const list = $("tail-messages");
      list.append(el("li", { class: "message" }, el("b", {}, `${m.topic} `), `[${m.type}] `, JSON.stringify(m.data), el("span", { class: "muted" }, ` #${at.seq}`)));
      while (list.children.length > 200) list.firstChild.remove();
      list.scrollTop = list.scrollHeight;
    },
    onGap: (g) => $("tail-messages").append(el("li", { class: "error" }, `gap: ${g.from_seq}..${g.to_seq} dropped`)),
    onPresence: (p) => {
      if (p.kind === "snapshot") rooms.set(p.topic, new Map(p.members.map((m) => [m.client_id, m])));
      else {
        if (!rooms.has(p.topic)) rooms.set(p.topic, new Map());
        if (p.kind === "leave") rooms.get(p.topic).delete(p.member.client_id);
        else rooms.get(p.topic).set(p.member.client_id, p.member);
      }
      drawPresence();
    },
  });
}

function joinRoom(topic) {
  if (room) room.close();
  const log = $("chat-log");
  log.replaceChildren();
  const answers = new Map();
  const answer = (call) => {
    if (!answers.has(call)) {
      const body = el("span", {});
      log.append(el("p", { class: "answer", "data-call": call }, el("b", {}, "model: "), body));
      answers.set(call, body);
    }
    return answers.get(call);
  };
  room = client.subscribe([topic], {
    since: { last: 1000 },
    onState: (state) => { $("chat-room-form").dataset.state = state; },
    onError: (err) => log.append(el("p", { class: "error" }, err.message)),
    onMessage: (m) => {
      if (m.type === "token") answer(m.data.call).textContent += m.data.text;
      else if (m.type === "message.complete" && m.data.role === "assistant") {
        const body = answer(m.data.call);
        body.textContent = m.data.text;
        body.parentNode.dataset.complete = "1";
      }
      else if (m.type === "message.complete") log.append(el("p", { class: "question" }, el("b", {}, `${m.data.name || "someone"}: `), m.data.text));
      log.scrollTop = log.scrollHeight;
    },
  });
}

async function ask(text) {
  const topic = $("chat-room").value;
  await client.publish(topic, "message.complete", { role: "user", name: "console", text });
  await client.chat([{ role: "user", content: text }], { publishTo: topic });
}

// for people poking at the console from the browser's devtools (and for tests)
window.hearthnetConsole = { get client() { return client; }, get tail() { return tail; }, get room() { return room; } };

window.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (ev) => { ev.preventDefault(); start($("login-token").value.trim()); });
  $("tail-form").addEventListener("submit", (ev) => { ev.preventDefault(); watchTopic($("tail-topic").value.trim()); });
  $("chat-room-form").addEventListener("submit", (ev) => { ev.preventDefault(); joinRoom($("chat-room").value.trim()); });
  $("chat-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = $("chat-input");
    const text = input.value.trim();
    input.value = "";
    if (text) ask(text).catch((err) => $("chat-log").append(el("p", { class: "error" }, err.message)));
  });
  $("logout").addEventListener("click", () => { sessionStorage.removeItem(KEY); location.reload(); });
  const fromUrl = new URLSearchParams(location.hash.slice(1)).get("token");
  if (fromUrl) history.replaceState(null, "", location.pathname); // keep it out of history
  const token = fromUrl || sessionStorage.getItem(KEY);
  if (token) start(token);
  else showLogin();
});

// Relays: the configured relay URLs, then the relaying counters as a key/value list.
function renderRelays(relays) {
  const { attached = [], ...counters } = relays || {};
  const rows = [];
  if (counters.relay) rows.push(el("p", {}, "this node serves as a relay (node start --relay)"));
  if (!attached.length && !counters.relay) rows.push(el("p", { class: "muted" }, "no relay configured (node start --relay-url URL)"));
  else rows.push(el("ul", {}, ...attached.map((url) => el("li", { class: "mono" }, url))));
  const dl = el("dl", {});
  for (const [k, v] of Object.entries(counters)) {
    dl.append(el("dt", {}, k.replaceAll("_", " ")),
      el("dd", {}, typeof v === "object" ? JSON.stringify(v) : String(v)));
  }
  if (dl.childElementCount) rows.push(dl);
  $("relay-info").replaceChildren(...rows);
}
