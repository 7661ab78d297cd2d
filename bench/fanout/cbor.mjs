// The little CBOR (RFC 8949) the load generator needs for HearthNet's
// `hearthnet-bus.v2+cbor` subprotocol: encoding its few client frames (auth, subscribe,
// ack) and decoding the server's control frames (auth.ok, subscribed, published.ok, gap,
// error). Message frames never go through here: the adapter reads the payload and the
// seq straight out of the received bytes. Definite lengths only, as the node writes them.

function head(major, n) {
  if (n < 24) return Buffer.from([(major << 5) | n]);
  if (n < 0x100) return Buffer.from([(major << 5) | 24, n]);
  if (n < 0x10000) return Buffer.from([(major << 5) | 25, n >> 8, n & 0xff]);
  if (n < 2 ** 32) {
    const b = Buffer.alloc(5);
    b[0] = (major << 5) | 26;
    b.writeUInt32BE(n, 1);
    return b;
  }
  const b = Buffer.alloc(9);
  b[0] = (major << 5) | 27;
  b.writeBigUInt64BE(BigInt(n), 1);
  return b;
}

/** CBOR bytes of a JSON-like value (null, booleans, safe integers, floats, strings,
 *  arrays, plain objects, Buffers). */
export function encode(value) {
  const parts = [];
  const walk = (v) => {
    if (v === null || v === undefined) parts.push(Buffer.from([0xf6]));
    else if (v === true) parts.push(Buffer.from([0xf5]));
    else if (v === false) parts.push(Buffer.from([0xf4]));
    else if (typeof v === 'number') {
      if (Number.isSafeInteger(v)) {
        parts.push(v >= 0 ? head(0, v) : head(1, -1 - v));
      } else {
        const b = Buffer.alloc(9);
        b[0] = 0xfb;
        b.writeDoubleBE(v, 1);
        parts.push(b);
      }
    } else if (typeof v === 'string') {
      const s = Buffer.from(v, 'utf8');
      parts.push(head(3, s.length), s);
    } else if (Buffer.isBuffer(v)) {
      parts.push(head(2, v.length), v);
    } else if (Array.isArray(v)) {
      parts.push(head(4, v.length));
      for (const x of v) walk(x);
    } else {
      const keys = Object.keys(v);
      parts.push(head(5, keys.length));
      for (const k of keys) { walk(k); walk(v[k]); }
    }
  };
  walk(value);
  return Buffer.concat(parts);
}

/** The CBOR head of a text string of `n` bytes (to splice a payload into a prefix). */
export function textHead(n) {
  return head(3, n);
}

/** Decode one CBOR item from buf[start, end); throws on what it does not know. */
export function decode(buf, start = 0, end = buf.length) {
  let pos = start;
  const need = (n) => { if (pos + n > end) throw new Error('truncated CBOR'); };
  const arg = (info) => {
    if (info < 24) return info;
    const n = info === 24 ? 1 : info === 25 ? 2 : info === 26 ? 4 : info === 27 ? 8 : 0;
    if (n === 0) throw new Error(`unsupported CBOR length ${info}`);
    need(n);
    let v = 0;
    for (let i = 0; i < n; i++) v = v * 256 + buf[pos + i];
    pos += n;
    return v;
  };
  const item = () => {
    need(1);
    const b = buf[pos++];
    const major = b >> 5;
    const info = b & 0x1f;
    if (major === 7) {
      if (info === 20) return false;
      if (info === 21) return true;
      if (info === 22 || info === 23) return null;
      if (info === 25) { need(2); const v = buf.readUInt16BE(pos); pos += 2; return halfFloat(v); }
      if (info === 26) { need(4); const v = buf.readFloatBE(pos); pos += 4; return v; }
      if (info === 27) { need(8); const v = buf.readDoubleBE(pos); pos += 8; return v; }
      throw new Error(`unsupported CBOR simple value ${info}`);
    }
    const n = arg(info);
    switch (major) {
      case 0: return n;
      case 1: return -1 - n;
      case 2: { need(n); const v = buf.subarray(pos, pos + n); pos += n; return v; }
      case 3: { need(n); const v = buf.toString('utf8', pos, pos + n); pos += n; return v; }
      case 4: { const out = []; for (let i = 0; i < n; i++) out.push(item()); return out; }
      case 5: {
        const out = {};
        for (let i = 0; i < n; i++) { const k = item(); out[k] = item(); }
        return out;
      }
      case 6: return item(); // a tag: its content
      default: throw new Error(`bad CBOR major type ${major}`);
    }
  };
  return item();
}

function halfFloat(h) {
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  const sign = h & 0x8000 ? -1 : 1;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}
