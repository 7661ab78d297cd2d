// hearthnet.js: the browser client of a HearthNet node (an ES module, no dependencies).
// Served by every node at /client/hearthnet.js. Documentation: docs/browser.md.
//
//   import { HearthNet } from "http://NODE:7080/client/hearthnet.js";
//   const hn = new HearthNet("http://NODE:7080", { token: "hnt1:..." });
//   const sub = hn.subscribe(["chat.room.*"], { onMessage: (m) => console.log(m.data) });
//   await hn.publish("chat.room.kitchen", "message.complete", { text: "hello" });
//
// Subscriptions run over WebSocket with acks and resume by (epoch, seq) after a drop
// (backoff 0.5 s doubling to 30 s; at once when the browser is back online or the page
// visible again), with no loss and no duplicate within retention; when
// WebSocket is blocked they fall back to Server-Sent Events. Loss the node reports is a
// `gap` given to onGap, never silent. Tokens are refreshed (refreshToken) before expiry.

const SUBPROTOCOL_BUS = "hearthnet-bus.v2";
const BACKOFF_MIN_MS = 500;
const BACKOFF_MAX_MS = 30_000;
const REFRESH_BEFORE_MS = 65_000; // the node warns (auth.expiring) 60 s before expiry
// A socket can die without a close (Wi-Fi changed, a NAT forgot it): the browser does not
// see that for many minutes, and it answers the node's pings itself. After this long
// with no frame the client sends a ping frame, and gives the socket up when the pong
// (or any frame) does not come within PONG_WAIT_MS.
const QUIET_MS = 25_000;
const PONG_WAIT_MS = 10_000;
const SEEN_IDS = 4096; // message ids remembered per subscription (duplicates dropped)
// Refusals that waiting cannot fix: a subscription ends with one (unless refreshToken gives
// a new token); load refusals (capacity_exceeded, rate_limited, unavailable) are retried.
const FINAL_CODES = new Set([
  "bad_request", "forbidden", "unauthorized", "revoked", "expired", "invalid_signature",
]);
const CREDENTIAL_CODES = new Set(["unauthorized", "expired", "invalid_signature"]); // a new token may do
const CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/** A ULID (spec §1.1): 48 bits of milliseconds, 80 random bits, Crockford base32. */
export function ulid(nowMs = Date.now()) {
  let time = "";
  let t = nowMs;
  for (let i = 0; i < 10; i++) {
    time = CROCKFORD[t % 32] + time;
    t = Math.floor(t / 32);
  }
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  let rand = "";
  for (let i = 0; i < 16; i++) rand += CROCKFORD[bytes[i] % 32];
  return time + rand;
}

/** The JSON object inside an `hnt1:` token (not verified: the node does that). */
export function decodeToken(token) {
  if (typeof token !== "string" || !token.startsWith("hnt1:")) {
    throw new HearthNetError("bad_request", "a token starts with hnt1:");
  }
  let claims;
  try {
    claims = JSON.parse(new TextDecoder().decode(base64urlToBytes(token.slice(5))));
  } catch (err) {
    throw new HearthNetError("bad_request", "not a token: hnt1: is followed by base64url JSON");
  }
  if (claims === null || typeof claims !== "object") {
    throw new HearthNetError("bad_request", "not a token: hnt1: is followed by base64url JSON");
  }
  return claims;
}

/** Bytes as base64url without padding (RFC 4648 §5): the JSON form of a binary payload. */
export function bytesToBase64url(bytes) {
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

/** The bytes of base64url text (padding optional). */
export function base64urlToBytes(text) {
  let b64 = text.replace(/-/g, "+").replace(/_/g, "/");
  while (b64.length % 4) b64 += "=";
  return Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
}

/**
 * A message's payload as published (docs/pubsub.md, binary payloads): a Uint8Array when
 * the envelope says `data_enc: "base64url"` (its `data` is then the bytes as unpadded
 * base64url text, which is what the origin signed), else the JSON value `data`.
 */
export function messagePayload(envelope) {
  const enc = envelope.data_enc;
  if (enc === undefined || enc === null) return envelope.data;
  if (enc !== "base64url") throw new HearthNetError("bad_request", `unknown data_enc ${enc}`);
  return base64urlToBytes(envelope.data);
}

/**
 * JCS (RFC 8785) of a parsed JSON value: the text a signature covers (spec §1.3). Keys in
 * UTF-16 order, numbers and strings as JSON.stringify writes them (what JCS specifies).
 */
export function canonicalJson(value) {
  if (value === null || typeof value !== "object") return JSON.stringify(value);
  if (Array.isArray(value)) return "[" + value.map(canonicalJson).join(",") + "]";
  const keys = Object.keys(value).filter((k) => value[k] !== undefined).sort();
  return "{" + keys.map((k) => JSON.stringify(k) + ":" + canonicalJson(value[k])).join(",") + "}";
}

const VERIFIED_BATCHES = 4096; // batch statements whose signature this page checked (LRU)
const MAX_BATCH = 65_536;
const MAX_PATH = 16;
const HASH_TEXT = /^[A-Za-z0-9_-]{43}$/;
const B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const B64URL_VALUE = new Uint8Array(128);
for (let i = 0; i < 64; i++) B64URL_VALUE[B64URL.charCodeAt(i)] = i;
const verifiedBatches = new Map(); // statement -> the promise of its check (one per batch)
const verifyKeys = new Map(); // NodeID -> the promise of its CryptoKey

function invalid(message) {
  return new HearthNetError("invalid_signature", message);
}

// SHA-256 (FIPS 180-4) in plain JavaScript: a message's leaf and path take a few hashes
// of a few hundred bytes, which crypto.subtle.digest (asynchronous, a round trip each)
// makes tens of times slower than hashing them here.
const SHA256_K = new Uint32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]);
const SHA256_W = new Uint32Array(64);
const SHA_BUF = new Uint8Array(4096); // reused for small inputs (most: a page hashes many)
const SHA_VIEW = new DataView(SHA_BUF.buffer);

/** SHA-256 of the byte `prefix` then `a` then `b` (Uint8Arrays; `b` may be absent): an
 * RFC 6962 leaf (prefix 0) or interior node (prefix 1). */
function sha256(prefix, a, b) {
  const n = 1 + a.length + (b ? b.length : 0);
  const size = (n + 72) & ~63; // the input, 0x80, zeros, the 64-bit bit length
  const buf = size > SHA_BUF.length ? new Uint8Array(size) : SHA_BUF;
  const view = buf === SHA_BUF ? SHA_VIEW : new DataView(buf.buffer);
  buf[0] = prefix;
  buf.set(a, 1);
  if (b) buf.set(b, 1 + a.length);
  buf.fill(0, n, size);
  buf[n] = 0x80;
  view.setUint32(size - 8, Math.floor(n / 0x20000000));
  view.setUint32(size - 4, (n * 8) >>> 0);
  const w = SHA256_W;
  let h0 = 0x6a09e667, h1 = 0xbb67ae85, h2 = 0x3c6ef372, h3 = 0xa54ff53a;
  let h4 = 0x510e527f, h5 = 0x9b05688c, h6 = 0x1f83d9ab, h7 = 0x5be0cd19;
  for (let off = 0; off < size; off += 64) {
    for (let i = 0; i < 16; i++) w[i] = view.getUint32(off + i * 4);
    for (let i = 16; i < 64; i++) {
      const x = w[i - 15];
      const y = w[i - 2];
      const s0 = ((x >>> 7) | (x << 25)) ^ ((x >>> 18) | (x << 14)) ^ (x >>> 3);
      const s1 = ((y >>> 17) | (y << 15)) ^ ((y >>> 19) | (y << 13)) ^ (y >>> 10);
      w[i] = (w[i - 16] + s0 + w[i - 7] + s1) | 0;
    }
    let a = h0, b = h1, c = h2, d = h3, e = h4, f = h5, g = h6, h = h7;
    for (let i = 0; i < 64; i++) {
      const s1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
      const t1 = (h + s1 + ((e & f) ^ (~e & g)) + SHA256_K[i] + w[i]) | 0;
      const s0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
      const t2 = (s0 + ((a & b) ^ (a & c) ^ (b & c))) | 0;
      h = g;
      g = f;
      f = e;
      e = (d + t1) | 0;
      d = c;
      c = b;
      b = a;
      a = (t1 + t2) | 0;
    }
    h0 = (h0 + a) | 0;
    h1 = (h1 + b) | 0;
    h2 = (h2 + c) | 0;
    h3 = (h3 + d) | 0;
    h4 = (h4 + e) | 0;
    h5 = (h5 + f) | 0;
    h6 = (h6 + g) | 0;
    h7 = (h7 + h) | 0;
  }
  const out = new Uint8Array(32);
  const words = [h0, h1, h2, h3, h4, h5, h6, h7];
  for (let i = 0; i < 8; i++) {
    const v = words[i];
    out[i * 4] = v >>> 24;
    out[i * 4 + 1] = v >>> 16;
    out[i * 4 + 2] = v >>> 8;
    out[i * 4 + 3] = v;
  }
  return out;
}

/** The 32 bytes of a hash's 43 base64url characters (checked by HASH_TEXT already). */
function hashBytes(text) {
  const out = new Uint8Array(32);
  let bits = 0;
  let held = 0;
  let at = 0;
  for (let i = 0; i < 43; i++) {
    held = (held << 6) | B64URL_VALUE[text.charCodeAt(i)];
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out[at++] = (held >> bits) & 0xff;
    }
  }
  return out;
}

/** Check an `ed25519:` signature by `nodeId` over `bytes` (WebCrypto's Ed25519). */
async function checkSignature(nodeId, signature, bytes) {
  if (typeof nodeId !== "string" || !/^ed25519:[A-Za-z0-9_-]{43}$/.test(nodeId)) {
    throw invalid("the origin is not a NodeID");
  }
  if (typeof signature !== "string" || !/^ed25519:[A-Za-z0-9_-]{86}$/.test(signature)) {
    throw invalid("a signature is ed25519: and 64 bytes of base64url");
  }
  let key = verifyKeys.get(nodeId);
  if (key === undefined) {
    if (verifyKeys.size >= VERIFIED_BATCHES) verifyKeys.clear();
    const raw = base64urlToBytes(nodeId.slice(8));
    key = crypto.subtle.importKey("raw", raw, { name: "Ed25519" }, false, ["verify"]);
    verifyKeys.set(nodeId, key);
  }
  const raw = base64urlToBytes(signature.slice(8));
  if (!(await crypto.subtle.verify({ name: "Ed25519" }, await key, raw, bytes))) {
    throw invalid("the signature does not verify");
  }
}

/** The Merkle root an RFC 6962 audit path leads to from a leaf hash (RFC 9162 §2.1.3.2),
 * or null when the path cannot belong to a tree of `size` leaves. */
function rootFromPath(leaf, index, size, path) {
  let fn = index;
  let sn = size - 1;
  let r = leaf;
  for (const p of path) {
    if (sn === 0) return null;
    if (fn & 1 || fn === sn) {
      r = sha256(1, p, r);
      while (!(fn & 1) && fn !== 0) {
        fn >>= 1;
        sn >>= 1;
      }
    } else {
      r = sha256(1, r, p);
    }
    fn >>= 1;
    sn >>= 1;
  }
  return sn === 0 ? r : null;
}

/**
 * Check a message envelope's origin signature (spec §6.2), as the Python client's
 * verify=True does: signed alone (`sig` a signature over the JCS of every other field),
 * or in a batch (`sig` {batch, first, n, path}: the message's leaf and path give the
 * Merkle root, and the origin signed {origin, first_origin_seq, n, root}; a page checks
 * each batch's signature once). Resolves when it verifies; rejects with a HearthNetError
 * `invalid_signature` otherwise, or when the envelope has no `sig` (subscribe with
 * `verify: true`: the node leaves it out otherwise).
 */
export async function verifyMessage(envelope) {
  if (envelope === null || typeof envelope !== "object" || Array.isArray(envelope)) {
    throw invalid("a message envelope is an object");
  }
  const { sig, ...body } = envelope;
  const origin = body.origin;
  const leaf = new TextEncoder().encode(canonicalJson(body));
  if (typeof sig === "string") return checkSignature(origin, sig, leaf);
  if (sig === null || typeof sig !== "object") {
    throw invalid("the message carries no sig (subscribe with verify: true)");
  }
  const { batch, first, n, path } = sig;
  const seq = body.origin_seq;
  if (
    Object.keys(sig).sort().join() !== "batch,first,n,path" ||
    !Number.isInteger(first) || !Number.isInteger(n) || !Number.isInteger(seq) ||
    n < 1 || n > MAX_BATCH || first < 0 || seq < first || seq >= first + n ||
    !Array.isArray(path) || path.length > MAX_PATH ||
    !path.every((h) => typeof h === "string" && HASH_TEXT.test(h))
  ) {
    throw invalid("a batch sig's first, n or path does not fit the message");
  }
  const root = rootFromPath(sha256(0, leaf), seq - first, n, path.map(hashBytes));
  if (root === null) throw invalid("the batch path does not fit a tree of n messages");
  const rootText = bytesToBase64url(root);
  const key = `${origin} ${first} ${n} ${rootText} ${batch}`;
  let check = verifiedBatches.get(key);
  if (check === undefined) {
    const statement = canonicalJson({ origin, first_origin_seq: first, n, root: rootText });
    check = checkSignature(origin, batch, new TextEncoder().encode(statement));
    check.catch(() => verifiedBatches.delete(key)); // a forgery is never remembered
    if (verifiedBatches.size >= VERIFIED_BATCHES) {
      verifiedBatches.delete(verifiedBatches.keys().next().value);
    }
  } else {
    verifiedBatches.delete(key); // most recently used last
  }
  verifiedBatches.set(key, check);
  return check;
}

/** Whether `topic` matches `pattern` (spec §6.1: `*` one segment, `**` one or more). */
export function topicMatches(pattern, topic) {
  const p = pattern.split(".");
  const t = topic.split(".");
  const match = (i, j) => {
    if (i === p.length) return j === t.length;
    if (p[i] === "**") {
      for (let k = j + 1; k <= t.length; k++) if (match(i + 1, k)) return true;
      return false;
    }
    if (j === t.length) return false;
    return (p[i] === "*" || p[i] === t[j]) && match(i + 1, j + 1);
  };
  return match(0, 0);
}

/** An error the node answered with (spec §2.4): `code` is the wire code. */
export class HearthNetError extends Error {
  constructor(code, message, extra = {}) {
    super(`${code}: ${message}`);
    this.name = "HearthNetError";
    this.code = code;
    Object.assign(this, extra);
  }
}

/** A client of one node, acting with a capability token. */
export class HearthNet {
  /**
   * @param {string} url  the node, e.g. "http://192.168.1.20:7080" (default: this page's)
   * @param {object} opts
   *   token: "hnt1:..."                       required
   *   refreshToken: async (oldToken) => "hnt1:..."   called before the token expires
   *   transport: "auto" | "ws" | "sse"        (default "auto": WebSocket, else SSE)
   *   window: pub/sub ack window (default 1,024)
   *   onTokenError: (error) => void           refresh failed (tried again halfway to
   *                                           the expiry; the sessions end at expiry)
   */
  constructor(url, opts = {}) {
    this.url = (url || location.origin).replace(/\/+$/, "");
    this.wsUrl = this.url.replace(/^http/, "ws");
    this.refreshToken = opts.refreshToken || null;
    this.transport = opts.transport || "auto";
    this.window = opts.window || 1024; // spec §3.6: the pub/sub default
    this.onTokenError = opts.onTokenError || (() => {});
    this.subscriptions = new Set();
    this.closed = false;
    this._refreshTimer = null;
    this._refreshDueMs = Infinity; // when the planned refresh runs (this page's clock)
    this._refreshing = null;
    // the browser is back (online, the page visible again): subscriptions retry now
    this._wake = (ev) => {
      if (ev.type === "visibilitychange" && document.visibilityState !== "visible") return;
      for (const sub of [...this.subscriptions]) sub._resume();
    };
    this._setToken(opts.token);
  }

  /** Listen for `online` (on window, or a worker's scope) and `visibilitychange` (on
   * document) while there are subscriptions; where there is neither (Node.js), nothing. */
  _listen(on) {
    const method = on ? "addEventListener" : "removeEventListener";
    const scope = typeof window !== "undefined" ? window : globalThis;
    if (typeof scope[method] === "function") scope[method]("online", this._wake);
    if (typeof document !== "undefined" && typeof document[method] === "function") {
      document[method]("visibilitychange", this._wake);
    }
  }

  /** The token in use now. */
  get token() {
    return this._token;
  }

  /** The community the token is for. */
  get community() {
    return this._claims.community;
  }

  _setToken(token) {
    this._claims = decodeToken(token);
    this._token = token;
    this._scheduleRefresh();
    for (const sub of this.subscriptions) sub._tokenChanged();
  }

  _scheduleRefresh() {
    clearTimeout(this._refreshTimer);
    if (!this.refreshToken || this.closed || !Number.isFinite(this._claims.exp_ms)) return;
    // 65 s before expiry; halfway through what is left of a shorter-lived token (a refresh
    // a second for a token of a minute would only load the page's token service)
    const left = this._claims.exp_ms - Date.now();
    const due = left - Math.min(REFRESH_BEFORE_MS, left / 2);
    // setTimeout fires at once past 2^31-1 ms: a long-lived token is looked at again later
    const wait = Math.min(Math.max(1_000, due), 2 ** 31 - 1);
    this._refreshDueMs = Date.now() + Math.max(1_000, due);
    this._refreshTimer = setTimeout(() => (wait < due ? this._scheduleRefresh() : this.refresh()), wait);
  }

  /** The node's auth.expiring: the token it holds ends at `expiresMs` (its clock), in 60 s
   * or less. Refresh now when that is earlier than the token's own end (a topic key
   * rotation voided it), or when the planned refresh is more than 30 s away (this page's
   * clock is behind the node's); else the plan stands (a token of a minute is warned
   * about at once, and would be refreshed on every warning). */
  _expiring(expiresMs) {
    if (!(expiresMs >= this._claims.exp_ms) || this._refreshDueMs - Date.now() > 30_000) {
      this.refresh();
    }
  }

  /** Get a fresh token from refreshToken now and hand it to every open session. */
  async refresh() {
    if (!this.refreshToken) return this._token;
    if (!this._refreshing) {
      this._refreshing = (async () => {
        try {
          this._setToken(await this.refreshToken(this._token));
        } catch (err) {
          this.onTokenError(err);
          this._scheduleRefresh(); // again, halfway to the expiry
        } finally {
          this._refreshing = null;
        }
        return this._token;
      })();
    }
    return this._refreshing;
  }

  _headers(extra = {}) {
    return { "X-HearthNet-Token": this._token, ...extra };
  }

  /** GET or POST a JSON endpoint of the node; throws HearthNetError on refusal. A request
   * refused `expired` is sent once more with a token from refreshToken (the node stored
   * nothing of it). */
  async request(method, path, body, headers = {}, again = true) {
    const init = { method, headers: this._headers(headers) };
    if (body !== undefined) {
      init.headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(this.url + path, init);
    } catch (err) {
      throw new HearthNetError("unavailable", `${this.url} did not answer (${err.message})`);
    }
    const text = await resp.text();
    let obj = null;
    try {
      obj = text ? JSON.parse(text) : null;
    } catch (err) {
      if (resp.ok) throw new HearthNetError("unavailable", "the answer is not JSON");
    }
    if (!resp.ok) {
      const err = obj || {}; // a proxy's error page is not JSON
      if (err.error === "expired" && again && this.refreshToken) {
        const before = this._token;
        await this.refresh();
        if (this._token !== before) return this.request(method, path, body, headers, false);
      }
      const extra = { status: resp.status };
      if (Number.isInteger(err.retry_after_ms)) extra.retry_after_ms = err.retry_after_ms;
      throw new HearthNetError(err.error || "unavailable", err.message || resp.statusText, extra);
    }
    return obj;
  }

  /**
   * Publish one message; resolves to {id, seq, origin_seq, ts} once it is durable. A
   * Uint8Array `data` is a binary payload (sent as base64url text with data_enc).
   * `opts.idempotency_key` (1..64 printable ASCII characters): the node publishes a key
   * once within its window; the same publish sent again (after a lost answer) resolves
   * to the first's answer with `duplicate: true`. The one publish this client sends
   * again by itself, after an `expired` refusal, needs none: the node refused it before
   * publishing anything.
   */
  publish(topic, type, data, opts = {}) {
    const body = data instanceof Uint8Array
      ? { type, data: bytesToBase64url(data), data_enc: "base64url" }
      : { type, data };
    if (opts.ttl_s) body.ttl_s = opts.ttl_s;
    if (opts.idempotency_key !== undefined) body.idempotency_key = opts.idempotency_key;
    return this.request("POST", `/pubsub/v1/topics/${encodeURIComponent(topic)}/messages`, body);
  }

  /** The presence members of a topic. */
  async presence(topic) {
    const out = await this.request("GET", `/pubsub/v1/topics/${encodeURIComponent(topic)}/presence`);
    return out.members;
  }

  /**
   * A page of a topic's history (oldest first): {messages: [frame], has_more, epoch}. With
   * `verify: true` among the options every message's signature is checked first
   * (verifyMessage; rejects with invalid_signature if one fails).
   */
  async history(topic, query = {}) {
    const { verify, ...rest } = query;
    const q = new URLSearchParams(rest).toString();
    const page = await this.request("GET", `/pubsub/v1/topics/${encodeURIComponent(topic)}/history${q ? "?" + q : ""}`);
    if (verify) await Promise.all(page.messages.map((frame) => verifyMessage(frame.data)));
    return page;
  }

  /**
   * Subscribe to topic patterns. Returns a Subscription at once; it connects, and
   * reconnects after a drop, by itself.
   *   since: {epoch, seq} | {ts} | {last: N}      where to start (default: now)
   *   onMessage(envelope, {seq, epoch})           each message, once, in order
   *                                               (messagePayload(envelope): its payload,
   *                                               a Uint8Array for a binary one)
   *   onGap({from_seq, to_seq})                   the node dropped these for us (spec §6.7)
   *   onReset({reason, epoch, head_seq, since})   the node could not use the start
   *                                               `since` (spec §6.5) and the
   *                                               subscription resumed: "cursor_ahead"
   *                                               from the node's head, "epoch_changed"
   *                                               by the time of the last message
   *   onPresence({topic, kind, member} | {topic, kind: "snapshot", members})
   *   onState("connecting" | "live" | "retrying" | "closed", detail)
   *                                               ("closed" with an error: a refusal that
   *                                               waiting cannot fix ended it, see onError)
   *   onError(HearthNetError)                     a refusal or error frame of the node
   *   presence: {name, status, meta}              join the topics' presence
   *   verify: true                                envelopes keep their sig (spec §6.2)
   *                                               and each one's signature (alone or its
   *                                               batch's) is checked before onMessage
   *                                               (verifyMessage); one that fails is
   *                                               skipped, counted in sub.rejected and
   *                                               given to onError
   *   fields: ["topic", "type", "data"]           lean frames: the envelope carries only
   *                                               these fields (not with verify; without
   *                                               "id", no dedupe by id)
   */
  subscribe(patterns, opts = {}) {
    const sub = new Subscription(this, Array.isArray(patterns) ? patterns : [patterns], opts);
    this.subscriptions.add(sub);
    if (this.subscriptions.size === 1) this._listen(true);
    // after subscribe() returned: callbacks may use the Subscription it returns
    queueMicrotask(() => sub._connect());
    return sub;
  }

  /**
   * Call a streaming capability; returns a Call (async iterable of frames {event, data}).
   *   version: "2.0"; params: {...}; onToolCall: async ({id, name, arguments}) => result
   * Over WebSocket tool results go back inline; without WebSocket the call runs over SSE.
   */
  stream(capability, input, opts = {}) {
    return new Call(this, capability, input, opts);
  }

  /** Call a non-streaming capability: resolves to its output. */
  async call(capability, input, opts = {}) {
    const headers = callHeaders(capability, opts.version || "1.0", this.community);
    const body = { params: opts.params || {}, input };
    return (await this.request("POST", "/bus/v1/call", body, headers)).output;
  }

  /**
   * llm.chat@2.0 with tools answered by this page (spec §5). Resolves to
   * {text, done}; rejects with a HearthNetError when the call fails (its error frame).
   * Over SSE the tool round trips are re-calls; the caller sees no difference.
   *   tools: [{name, description, parameters}]; toolHandler: async (call) => result
   *   onToken(text); publishTo: "topic" (tokens also go to that topic, spec llm.md)
   *   params: {backend, model, script}
   */
  async chat(messages, opts = {}) {
    let history = [...messages];
    let text = "";
    for (let round = 0; round < 8; round++) {
      const input = { messages: history, stream: true };
      if (opts.tools) input.tools = opts.tools;
      if (opts.publishTo) input.publish_to = opts.publishTo;
      const call = this.stream("llm.chat", input, {
        version: "2.0",
        params: opts.params,
        onToolCall: opts.toolHandler,
      });
      const calls = [];
      let done = null;
      let failed = null;
      for await (const frame of call) {
        if (frame.event === "token") {
          text += frame.data.text;
          if (opts.onToken) opts.onToken(frame.data.text);
        } else if (frame.event === "tool_call") {
          calls.push(frame.data);
        } else if (frame.event === "done") {
          done = frame.data;
        } else if (frame.event === "error") {
          failed = frame.data; // the last frame: the call's socket closes after it
        }
      }
      if (failed) throw new HearthNetError(failed.code, failed.message, extraOf(failed));
      if (!done || done.stop_reason !== "tool_calls" || call.inline) return { text, done };
      // SSE: run the tools here and call again with the results appended (spec §5)
      history = [
        ...history,
        { role: "assistant", content: null, tool_calls: calls.map((c) => ({ id: c.id, name: c.name, arguments: c.arguments })) },
      ];
      for (const c of calls) {
        const result = await opts.toolHandler(c);
        history.push({ role: "tool", tool_call_id: c.id, content: JSON.stringify(result) });
      }
    }
    throw new HearthNetError("bad_request", "too many tool rounds");
  }

  /** Close every subscription and stop refreshing the token. */
  close() {
    this.closed = true;
    clearTimeout(this._refreshTimer);
    for (const sub of [...this.subscriptions]) sub.close();
  }
}

/** Why the node refuses an event stream's URL (a HearthNetError), or null when it does
 * not (it opens the stream, which is closed at once) or does not answer. */
async function refusalOf(url) {
  const abort = new AbortController();
  try {
    const resp = await fetch(url, { headers: { Accept: "text/event-stream" }, signal: abort.signal });
    if (resp.ok) return null;
    const body = await resp.json().catch(() => ({}));
    const extra = { status: resp.status };
    if (Number.isInteger(body.retry_after_ms)) extra.retry_after_ms = body.retry_after_ms;
    return new HearthNetError(body.error || "unavailable", body.message || resp.statusText, extra);
  } catch (err) {
    return null;
  } finally {
    abort.abort();
  }
}

/** What an error frame carries besides code and message (retry_after_ms, ...). */
function extraOf(data) {
  const { code, message, ...extra } = data;
  return extra;
}

function callHeaders(capability, version, community) {
  return {
    "Content-Type": "application/json",
    "X-HearthNet-Capability": capability,
    "X-HearthNet-Capability-Version": version,
    "X-HearthNet-Request-Id": ulid(),
    "X-HearthNet-Community": community,
    "X-HearthNet-Timestamp": String(Date.now()),
  };
}

/** One subscription: its own socket (or event stream), its own cursor. */
export class Subscription {
  constructor(client, patterns, opts) {
    this.client = client;
    this.patterns = patterns;
    this.opts = opts;
    this.epoch = null; // the node's log epoch (spec §6.3)
    this.seq = null; // the cursor: the last seq delivered (a start from now: the head first)
    this.lastTs = null;
    this.since = opts.since || null;
    this.presenceFields = opts.presence || null;
    this.closed = false;
    this.state = "connecting";
    this.transport = null; // "ws" | "sse" once connected
    this.expiresMs = null; // expiry of the token the node accepted last (WebSocket)
    this.delivered = 0;
    this.gaps = [];
    this.resets = []; // each reset the node answered, with the start it refused
    this._seen = new Set();
    this._seenOrder = [];
    this._backoff = BACKOFF_MIN_MS;
    this._ws = null;
    this._es = null;
    this._timer = null;
    this._ackTimer = null;
    this._refusal = null; // the auth.error of the socket that is about to close
    this._watchTimer = null;
    this._heardMs = 0; // when the socket last brought a frame
    this._pingedMs = null; // when a ping went unanswered since (null: none)
    this._notBeforeMs = 0; // a reconnect not before this (the node's retry_after_ms)
    this._acked = 0;
    this._wsFailures = 0;
    this.rejected = 0; // messages whose signature failed (verify: true)
    this._inOrder = Promise.resolve(); // frames waiting for the checks before them
  }

  _state(state, detail) {
    this.state = state;
    if (this.opts.onState) this.opts.onState(state, detail);
  }

  /** Where the next connection resumes: the cursor once there is one (for a live-only
   * start, the head it was subscribed at); until a message came, the same start again (a
   * `last: N` backlog not received yet is asked for again, not skipped). */
  _resumePoint() {
    if (this.epoch !== null && this.seq !== null) return { epoch: this.epoch, seq: this.seq };
    return this.since;
  }

  _connect() {
    if (this.closed || this._ws || this._es) return; // one socket at a time
    this._state("connecting");
    const mode = this.client.transport;
    // "auto": SSE once WebSocket failed twice while the node answered HTTP (spec §3.5)
    if (mode === "sse" || (mode === "auto" && this._wsFailures >= 2)) this._openSse();
    else this._openWs();
  }

  _retry(reason, error = null) {
    if (error && !this.closed && this.opts.onError) this.opts.onError(error);
    this._ws = null;
    if (this._es) {
      this._es.close();
      this._es = null;
    }
    if (this.closed) return;
    this._state("retrying", reason);
    clearTimeout(this._timer);
    const delay = this._backoff * (0.8 + Math.random() * 0.4);
    this._backoff = Math.min(BACKOFF_MAX_MS, this._backoff * 2);
    // never sooner than the node asked (capacity_exceeded, rate_limited, unavailable)
    const after = error && Number.isInteger(error.retry_after_ms) ? error.retry_after_ms : 0;
    this._notBeforeMs = Date.now() + after;
    this._timer = setTimeout(() => this._connect(), Math.max(delay, after));
  }

  /** The browser is back (online, or the page visible again). Waiting out its backoff,
   * the subscription connects now (resuming from its cursor; not before the node's
   * retry_after_ms); a live WebSocket is pinged now, not after QUIET_MS of silence, and
   * given up when nothing answers within PONG_WAIT_MS. */
  _resume() {
    if (this.closed) return;
    if (this.state === "retrying" && !this._ws && !this._es) {
      clearTimeout(this._timer);
      const wait = this._notBeforeMs - Date.now();
      if (wait > 0) this._timer = setTimeout(() => this._connect(), wait);
      else this._connect();
    } else if (this.state === "live" && this._ws && this._pingedMs === null) {
      this._pingedMs = Date.now();
      this._sendWs({ type: "ping" });
    }
  }

  /** The node refused this subscription (`error` null: its credentials, unsaid): a fresh
   * token from refreshToken may help when credentials were refused, the same one will
   * not; a final refusal with no new token ends the subscription, another is retried. */
  _refused(error, reason) {
    const before = this.client.token;
    const credentials = error === null || CREDENTIAL_CODES.has(error.code);
    (credentials ? this.client.refresh() : Promise.resolve()).then(() => {
      if (this.client.token !== before) this._retry(reason); // a fresh token
      else if (error && FINAL_CODES.has(error.code)) this._fail(error);
      else this._retry(reason, error);
    });
  }

  /** A refusal that waiting cannot fix: onError, then the end ("closed" with the error). */
  _fail(error) {
    if (this.closed) return;
    if (this.opts.onError) this.opts.onError(error);
    this._end(error);
  }

  _openWs() {
    const ws = new WebSocket(this.client.wsUrl + "/pubsub/v1/subscribe");
    this._ws = ws;
    let opened = false;
    ws.onopen = () => {
      opened = true;
      ws.send(JSON.stringify({ type: "auth", token: this.client.token, window: this.client.window }));
      this._watch(ws);
    };
    ws.onmessage = (ev) => {
      if (this._ws === ws) {
        this._heardMs = Date.now();
        this._pingedMs = null; // any frame answers a ping
      }
      this._take(JSON.parse(ev.data), ws);
    };
    ws.onclose = (ev) => {
      if (this._ws !== ws) return;
      if (!opened) {
        // refused before it opened: is the node down, or is WebSocket blocked on the way?
        // A browser does not say; a plain request to the node does.
        this._ws = null;
        fetch(this.client.url + "/health").then(
          (r) => { if (r.ok) this._wsFailures++; },
          () => {},
        ).finally(() => this._retry("websocket refused"));
        return;
      }
      const refused = this._refusal;
      this._refusal = null;
      if (ev.code === 1008 || ev.code === 4401) this._refused(refused, `closed ${ev.code}`);
      else this._retry(`closed ${ev.code}`, refused);
    };
  }

  /** Give up `ws` when the node stays silent (QUIET_MS, then a ping, PONG_WAIT_MS). */
  _watch(ws) {
    this._heardMs = Date.now();
    this._pingedMs = null;
    clearInterval(this._watchTimer);
    this._watchTimer = setInterval(() => {
      if (this._ws !== ws) {
        clearInterval(this._watchTimer);
        return;
      }
      const now = Date.now();
      if (this._pingedMs === null) {
        if (now - this._heardMs >= QUIET_MS) {
          this._pingedMs = now;
          this._sendWs({ type: "ping" });
        }
      } else if (now - this._pingedMs >= PONG_WAIT_MS) {
        clearInterval(this._watchTimer);
        this._ws = null; // its close event, whenever it comes, is not ours to handle
        ws.close(1000);
        this._retry("no answer from the node");
      }
    }, 5_000);
  }

  _sendWs(obj) {
    if (this._ws && this._ws.readyState === WebSocket.OPEN) this._ws.send(JSON.stringify(obj));
  }

  _openSse() {
    const q = new URLSearchParams({ topics: this.patterns.join(","), token: this.client.token });
    if (this.opts.verify) q.set("verify", "true");
    if (this.opts.fields) q.set("fields", this.opts.fields.join(","));
    const at = this._resumePoint();
    if (at && at.seq !== undefined) {
      if (at.epoch) q.set("since_epoch", at.epoch);
      q.set("since_seq", String(at.seq));
    } else if (at && at.ts !== undefined) q.set("since_ts", String(at.ts));
    else if (at && at.last !== undefined) q.set("last", String(at.last));
    const url = `${this.client.url}/pubsub/v1/subscribe?${q}`;
    const es = new EventSource(url);
    this._es = es;
    let opened = false;
    es.addEventListener("open", () => { opened = true; });
    this.transport = "sse";
    const on = (event) => (ev) => {
      const frame = { event, data: JSON.parse(ev.data) };
      if (ev.lastEventId) frame.seq = Number(ev.lastEventId);
      this._take(frame, null);
    };
    for (const name of ["subscribed", "message", "gap", "presence", "reset", "auth.expiring"]) {
      es.addEventListener(name, on(name));
    }
    es.addEventListener("error", (ev) => {
      // the browser would reconnect with the old URL (and token): we do it ourselves
      if (this._es !== es) return;
      this._es = null;
      es.close();
      if (ev.data) {
        // the node's own error event (spec §3.3), not the browser's "connection lost"
        const data = JSON.parse(ev.data);
        const error = new HearthNetError(data.code, data.message, extraOf(data));
        if (data.code === "expired") this._refused(error, "token expired");
        else if (FINAL_CODES.has(data.code)) this._fail(error);
        else this._retry("event stream ended", error);
      } else if (opened) {
        this._retry("event stream ended");
      } else {
        // refused before it opened: an EventSource does not say why, the same request does
        refusalOf(url).then((error) => {
          if (error) this._refused(error, "event stream refused");
          else this._retry("event stream ended");
        });
      }
    });
  }

  /** A frame from the node. With opts.verify, message signatures are checked side by
   * side and the frames handled in the order they came, each message once its check
   * passed (or skipped when it failed). */
  _take(frame, ws) {
    if (!this.opts.verify) {
      this._onFrame(frame, ws);
      return;
    }
    const check = frame.event === "message"
      ? verifyMessage(frame.data).then(() => null, (err) => err)
      : null;
    this._inOrder = this._inOrder
      .then(async () => {
        const failed = await check;
        if (this.closed) return;
        if (failed) this._reject(frame.seq, ws, failed);
        else this._onFrame(frame, ws);
      })
      .catch((err) => setTimeout(() => { throw err; })); // the page's callback threw
  }

  /** A message whose signature failed: not delivered; its seq is passed (and acked). */
  _reject(seq, ws, err) {
    if (seq !== undefined && this.seq !== null && seq <= this.seq) return; // already had it
    this.rejected++;
    if (seq !== undefined) {
      this.seq = seq;
      if (ws) this._ack(seq, ws);
    }
    if (this.opts.onError) this.opts.onError(err);
  }

  _onFrame(frame, ws) {
    const { event, data } = frame;
    if (event === "auth.ok") {
      this.expiresMs = data.expires_ms ?? null; // the token the node holds now
      if (ws._hearthnetSubscribed) {
        ws._hearthnetReauth = false; // the node took the refreshed token
        return;
      }
      ws._hearthnetSubscribed = true;
      const sub = { type: "subscribe", topics: this.patterns };
      const at = this._resumePoint();
      if (at) sub.since = at;
      if (this.presenceFields) sub.presence = this.presenceFields;
      if (this.opts.verify) sub.verify = true;
      if (this.opts.fields) sub.fields = this.opts.fields;
      ws.send(JSON.stringify(sub));
    } else if (event === "subscribed") {
      if (this.epoch !== null && data.epoch !== this.epoch) this.seq = null;
      this.epoch = data.epoch;
      // a live-only start: nothing at or below the head is for us, and a reconnect must
      // resume from it (not from the head then), or what came in between is lost
      if (this.seq === null && this.since === null && Number.isInteger(data.head_seq)) {
        this.seq = data.head_seq;
      }
      this.transport = ws ? "ws" : "sse";
      this._backoff = BACKOFF_MIN_MS;
      this._acked = this.seq || 0;
      this._state("live", { epoch: data.epoch, head_seq: data.head_seq });
    } else if (event === "message") {
      this._onMessage(data, frame.seq, ws);
    } else if (event === "gap") {
      this.gaps.push(data);
      if (this.opts.onGap) this.opts.onGap(data);
      if (ws) this._ack(data.to_seq, ws);
    } else if (event === "presence") {
      if (this.opts.onPresence) this.opts.onPresence(data);
    } else if (event === "reset") {
      // the node cannot use our cursor (spec §6.5): the subscription was not made
      const refused = this._resumePoint();
      if (data.reason === "cursor_ahead" && data.epoch && Number.isInteger(data.head_seq)) {
        // beyond the head of the node's epoch: nothing after the head exists yet
        this.epoch = data.epoch;
        this.seq = data.head_seq;
      } else {
        // epoch_changed, or a reason we do not know: the seqs mean other messages now
        this.epoch = null;
        this.seq = null;
        this.since = this.lastTs !== null ? { ts: this.lastTs + 1 } : null;
      }
      this.resets.push({ ...data, since: refused });
      if (this.opts.onReset) this.opts.onReset({ ...data, since: refused });
      if (ws) ws.close(1000);
      else this._retry("reset");
    } else if (event === "auth.expiring") {
      this.client._expiring(data.expires_ms);
    } else if (event === "auth.error") {
      // the socket closes next (1008, or 1013 when the node is full): decided there
      this._refusal = new HearthNetError(data.code, data.message, extraOf(data));
    } else if (event === "error") {
      const error = new HearthNetError(data.code, data.message, extraOf(data));
      if (ws && ws._hearthnetReauth) {
        // the session refused the refreshed token (say one for another client: another
        // sub); a new session takes any valid one, and resumes from the cursor
        ws._hearthnetReauth = false;
        this._ws = null;
        ws.close(1000);
        this._retry(`refreshed token refused on the session (${error.code})`);
      } else if (
        FINAL_CODES.has(error.code) &&
        (this.state === "connecting" || error.code === "forbidden" || error.code === "revoked")
      ) {
        // the subscribe refused (a forbidden topic, a bad start), or the subscription
        // dropped (new access rules refuse it, the token was revoked): nothing more comes.
        // (A live session's other refusals, say of a presence update, leave it as it was.)
        this._fail(error);
      } else if (this.state !== "connecting" || !ws) {
        if (this.opts.onError) this.opts.onError(error);
      } else {
        this._ws = null; // refused for load: again after the backoff
        ws.close(1000);
        this._retry("subscribe refused", error);
      }
    }
  }

  _onMessage(envelope, seq, ws) {
    if (seq !== undefined && this.seq !== null && seq <= this.seq) return; // already had it
    if (envelope.id !== undefined) {
      // a lean frame (opts.fields) may come without id: its seq alone orders it
      if (this._seen.has(envelope.id)) {
        if (seq !== undefined) this.seq = seq;
        return;
      }
      this._seen.add(envelope.id);
      this._seenOrder.push(envelope.id);
      if (this._seenOrder.length > SEEN_IDS) this._seen.delete(this._seenOrder.shift());
    }
    if (seq !== undefined) this.seq = seq;
    if (envelope.ts !== undefined) this.lastTs = envelope.ts;
    this.delivered++;
    if (this.opts.onMessage) this.opts.onMessage(envelope, { seq, epoch: this.epoch });
    if (ws) this._ack(seq, ws);
  }

  _ack(seq, ws) {
    // spec §3.6: at least every half window; the rest within 50 ms (one timer at a time)
    if (seq - this._acked >= Math.max(1, Math.floor(this.client.window / 2)) || seq < this._acked) {
      this._acked = seq;
      ws.send(JSON.stringify({ type: "ack", upto: seq }));
    } else if (this._ackTimer === null) {
      this._ackTimer = setTimeout(() => {
        this._ackTimer = null;
        if (this.seq !== null && this.seq > this._acked && this._ws === ws) {
          this._acked = this.seq;
          this._sendWs({ type: "ack", upto: this.seq });
        }
      }, 50);
    }
  }

  _tokenChanged() {
    const ws = this._ws;
    if (ws) {
      if (ws.readyState === WebSocket.OPEN) ws._hearthnetReauth = true; // answered auth.ok or error
      this._sendWs({ type: "auth", token: this.client.token, window: this.client.window });
    } else if (this._es) this._retry("token refreshed"); // an event stream's token is in its URL
  }

  /** Change this subscriber's presence ({name, status, meta}) on its topics. */
  setPresence(fields) {
    // checked here: kept for every reconnect, a field the node refuses would end the
    // subscription then (the node checks the lengths as well)
    for (const [key, value] of Object.entries(fields)) {
      const ok = key === "meta"
        ? value !== null && typeof value === "object" && !Array.isArray(value)
        : (key === "name" || key === "status") && typeof value === "string";
      if (!ok) {
        const given = `${key}: ${JSON.stringify(value)}`;
        throw new HearthNetError("bad_request", `presence has name, status (text) and meta (an object), not ${given}`);
      }
    }
    this.presenceFields = { ...(this.presenceFields || {}), ...fields };
    this._sendWs({ type: "presence.update", ...fields });
  }

  /** Drop the connection now (it reconnects and resumes); for tests and "retry now". */
  reconnect() {
    if (this._ws) this._ws.close(1000);
    else this._retry("reconnect");
  }

  /** Stop: closes the socket; no more callbacks. */
  close() {
    this._end();
  }

  _end(error) {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this._timer);
    clearTimeout(this._ackTimer);
    clearInterval(this._watchTimer);
    if (this._ws) this._ws.close(1000);
    if (this._es) this._es.close();
    this._ws = this._es = null;
    this.client.subscriptions.delete(this);
    if (this.client.subscriptions.size === 0) this.client._listen(false);
    this._state("closed", error);
  }
}

/** One streaming call (spec §3.5-3.6): async iterable of frames, cancel(). */
export class Call {
  constructor(client, capability, input, opts) {
    this.client = client;
    this.capability = capability;
    this.version = opts.version || "1.0";
    this.body = { params: opts.params || {}, input };
    this.onToolCall = opts.onToolCall || null;
    this.inline = false; // tool results went back on the socket (WebSocket)
    this._queue = [];
    this._wake = null;
    this._ended = false;
    this._ws = null;
    this._abort = null;
    this._pushed = 0; // frames of the stream given to the caller
    this._again = true; // an `expired` refusal at the start may be retried (once)
    this._cancelled = false;
    const useSse = client.transport === "sse";
    this._started = useSse ? this._overSse() : this._overWs();
  }

  _push(frame) {
    if (this._ended) return;
    this._pushed++;
    this._queue.push(frame);
    if (frame.event === "done" || frame.event === "error") this._ended = true;
    if (this._wake) this._wake();
  }

  /** The error frame that ends the call, unless it is an `expired` refusal before any
   * frame of the stream: then, once, the call is opened again by `open` with a fresh
   * token from refreshToken (the node started nothing of it; publish and history do the
   * same), and nothing is repeated. */
  async _endOrRenew(frame, open) {
    const data = frame.data || {};
    if (data.code === "expired" && this._pushed === 0 && this._again && this.client.refreshToken) {
      this._again = false;
      const before = this.client.token;
      await this.client.refresh();
      if (this._cancelled) {
        this._push({ event: "error", data: { code: "cancelled", message: "cancelled by the client" } });
        return;
      }
      if (this.client.token !== before) {
        await open();
        return;
      }
    }
    this._push(frame);
  }

  _envelope() {
    return {
      body: this.body,
      capability: this.capability,
      version: this.version,
      request_id: ulid(),
      community: this.client.community,
      ts: Date.now(),
    };
  }

  _overWs() {
    return new Promise((resolve) => {
      const ws = new WebSocket(this.client.wsUrl + "/bus/v1/call", [SUBPROTOCOL_BUS]);
      this._ws = ws;
      let opened = false;
      let acked = 0;
      ws.onopen = () => {
        opened = true;
        this.inline = true;
        ws.send(JSON.stringify({ type: "call", envelope: this._envelope(), token: this.client.token }));
        resolve();
      };
      ws.onmessage = async (ev) => {
        if (this._ws !== ws) return;
        const frame = JSON.parse(ev.data);
        if (frame.event === "error") {
          // the last frame (the socket closes next); an `expired` one at the start is
          // retried on a new socket
          this._ws = null;
          ws.close(1000);
          this._endOrRenew(frame, () => this._overWs());
          return;
        }
        if (frame.seq !== undefined && frame.seq - acked >= 8) {
          acked = frame.seq;
          ws.send(JSON.stringify({ type: "ack", upto: frame.seq }));
        }
        this._push(frame);
        if (frame.event === "tool_call" && this.onToolCall) {
          let result;
          try {
            result = await this.onToolCall(frame.data);
          } catch (err) {
            result = { error: String(err) };
          }
          if (ws.readyState === WebSocket.OPEN) {
            ws.send(JSON.stringify({ type: "tool_result", tool_call_id: frame.data.id, body: result }));
          }
        }
      };
      ws.onclose = (ev) => {
        if (this._ws !== ws) return; // after its error frame, or given up
        if (!opened) {
          // WebSocket blocked or refused: the same call over SSE (spec §3.5 fallback)
          this._overSse().then(resolve);
          return;
        }
        this._push({ event: "error", data: { code: "unavailable", message: `socket closed ${ev.code}` } });
      };
    });
  }

  async _overSse() {
    this.inline = false;
    this._abort = new AbortController();
    let resp;
    try {
      resp = await fetch(this.client.url + "/bus/v1/call", {
        method: "POST",
        headers: this.client._headers({
          ...callHeaders(this.capability, this.version, this.client.community),
          Accept: "text/event-stream",
        }),
        body: JSON.stringify(this.body),
        signal: this._abort.signal,
      });
    } catch (err) {
      this._push(this._lost(err));
      return;
    }
    if (!resp.ok) {
      const obj = await resp.json().catch(() => ({}));
      const data = { code: obj.error || "unavailable", message: obj.message || "" };
      await this._endOrRenew({ event: "error", data }, () => this._overSse());
      return;
    }
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    (async () => {
      try {
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += decoder.decode(value, { stream: true });
          let end;
          while ((end = buf.indexOf("\n\n")) >= 0) {
            const block = buf.slice(0, end);
            buf = buf.slice(end + 2);
            const frame = {};
            for (const line of block.split("\n")) {
              if (line.startsWith("event:")) frame.event = line.slice(6).trim();
              else if (line.startsWith("data:")) frame.data = JSON.parse(line.slice(5));
            }
            if (frame.event) this._push(frame);
          }
        }
      } catch (err) {
        this._push(this._lost(err));
      }
      this._push({ event: "error", data: { code: "unavailable", message: "stream ended early" } });
    })();
  }

  /** The error frame that ends a call whose request failed: `cancelled` when cancel()
   * aborted it (as over WebSocket), else `unavailable`. */
  _lost(err) {
    const code = this._abort && this._abort.signal.aborted ? "cancelled" : "unavailable";
    return { event: "error", data: { code, message: String(err) } };
  }

  /** Ask the node to stop this call; the stream ends with error{cancelled} or done. */
  cancel() {
    this._cancelled = true;
    if (this._ws && this._ws.readyState === WebSocket.OPEN) this._ws.send(JSON.stringify({ type: "cancel" }));
    else if (this._abort) this._abort.abort();
  }

  async *[Symbol.asyncIterator]() {
    await this._started;
    for (;;) {
      while (this._queue.length) {
        const frame = this._queue.shift();
        yield frame;
        if (frame.event === "done" || frame.event === "error") {
          if (this._ws) this._ws.close(1000);
          return;
        }
      }
      await new Promise((r) => (this._wake = r));
      this._wake = null;
    }
  }
}
