// A small RFC 6455 client for the load generator: the part of `ws`'s surface the
// generator uses (events open/message/close/error, send, pause/resume, close, terminate,
// readyState), over a plain TCP socket.
//
// Why: at fan-out rates the load generator spends most of its CPU inside the WebSocket
// library, once per received frame. Servers that put many messages in one frame (NATS)
// pay that once per batch; servers that send one message per frame (HearthNet, MQTT) pay
// it per message, so the library's per-frame cost decides who looks faster. This client
// parses frames in one loop over each TCP chunk and, when `onframe` is set, hands each
// whole data frame to it as (chunk, start, end, isBinary): no copy, no Buffer and no event
// per frame, so the generator measures servers, not itself. Without `onframe` (and for
// fragmented messages) it emits 'message' with the payload, as `ws` does.
//
// Scope: no TLS, no extensions (no compression), text and binary frames, fragmentation,
// ping -> pong, close handshake. Frames it sends are masked with a random key, as a client
// must.

import { EventEmitter } from 'node:events';
import net from 'node:net';
import { createHash, randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
let nativeMask = null;
try {
  nativeMask = require('bufferutil').mask; // optional native helper, as `ws` uses it
} catch {
  nativeMask = null;
}

const GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';
const CONNECTING = 0;
const OPEN = 1;
const CLOSING = 2;
const CLOSED = 3;

function maskInto(src, key, dst, offset) {
  if (nativeMask !== null && src.length >= 32) {
    nativeMask(src, key, dst, offset, src.length);
    return;
  }
  for (let i = 0; i < src.length; i++) dst[offset + i] = src[i] ^ key[i & 3];
}

/** One client frame: FIN, opcode, mask bit, length, mask key, masked payload. */
function clientFrame(opcode, payload) {
  const n = payload.length;
  const head = n < 126 ? 2 : n < 65536 ? 4 : 10;
  const out = Buffer.allocUnsafe(head + 4 + n);
  out[0] = 0x80 | opcode;
  if (n < 126) {
    out[1] = 0x80 | n;
  } else if (n < 65536) {
    out[1] = 0x80 | 126;
    out.writeUInt16BE(n, 2);
  } else {
    out[1] = 0x80 | 127;
    out.writeUInt32BE(Math.floor(n / 2 ** 32), 2);
    out.writeUInt32BE(n >>> 0, 6);
  }
  const key = randomBytes(4);
  key.copy(out, head);
  maskInto(payload, key, out, head + 4);
  return out;
}

export class LeanWebSocket extends EventEmitter {
  static CONNECTING = CONNECTING;
  static OPEN = OPEN;
  static CLOSING = CLOSING;
  static CLOSED = CLOSED;

  constructor(url, protocols = [], options = {}) {
    super();
    const u = new URL(url);
    if (u.protocol !== 'ws:') throw new Error(`lean client speaks ws:// only, not ${u.protocol}`);
    this.readyState = CONNECTING;
    this.binaryType = 'nodebuffer'; // accepted for compatibility; payloads are Buffers
    this.maxPayload = options.maxPayload ?? 64 * 1024 * 1024;
    this._pending = null; // handshake bytes so far
    this.onframe = null; // (buf, start, end, isBinary) for whole unmasked data frames
    this._parts = null; // the start of an incomplete frame, gathered until it is whole
    this._partsLen = 0;
    this._need = 0; // bytes the incomplete frame needs in all (or its header, when unknown)
    this._fragments = null; // a fragmented message being assembled
    this._fragOpcode = 0;
    this._closeSent = false;
    this._closeCode = 1006;
    this._closeReason = Buffer.alloc(0);
    this._key = randomBytes(16).toString('base64');
    this._protocols = protocols;
    const port = Number(u.port || 80);
    this._socket = net.connect({ host: u.hostname, port, noDelay: true });
    this._timer = setTimeout(
      () => this._fail(new Error('handshake timeout')),
      options.handshakeTimeout ?? 10000,
    );
    this._socket.on('connect', () => {
      const lines = [
        `GET ${u.pathname}${u.search} HTTP/1.1`,
        `Host: ${u.host}`,
        'Upgrade: websocket',
        'Connection: Upgrade',
        `Sec-WebSocket-Key: ${this._key}`,
        'Sec-WebSocket-Version: 13',
      ];
      if (protocols.length) lines.push(`Sec-WebSocket-Protocol: ${protocols.join(', ')}`);
      this._socket.write(`${lines.join('\r\n')}\r\n\r\n`);
    });
    this._onData = (chunk) => this._handshake(chunk);
    this._socket.on('data', (chunk) => this._onData(chunk));
    this._socket.on('error', (err) => this._fail(err));
    this._socket.on('close', () => this._closed());
  }

  _handshake(chunk) {
    const buf = this._pending ? Buffer.concat([this._pending, chunk]) : chunk;
    const end = buf.indexOf('\r\n\r\n');
    if (end < 0) {
      if (buf.length > 16384) this._fail(new Error('handshake response too long'));
      else this._pending = buf;
      return;
    }
    this._pending = null;
    const head = buf.toString('latin1', 0, end);
    const [status, ...fields] = head.split('\r\n');
    const headers = {};
    for (const f of fields) {
      const i = f.indexOf(':');
      if (i > 0) headers[f.slice(0, i).trim().toLowerCase()] = f.slice(i + 1).trim();
    }
    const accept = createHash('sha1').update(this._key + GUID).digest('base64');
    if (!/^HTTP\/1\.1 101 /.test(status)) {
      this._fail(new Error(`Unexpected server response: ${status.split(' ')[1] ?? status}`));
      return;
    }
    if (headers['sec-websocket-accept'] !== accept) {
      this._fail(new Error('bad Sec-WebSocket-Accept'));
      return;
    }
    const proto = headers['sec-websocket-protocol'];
    if (proto !== undefined && !this._protocols.includes(proto)) {
      this._fail(new Error(`server chose subprotocol ${proto}`));
      return;
    }
    clearTimeout(this._timer);
    this.readyState = OPEN;
    this._onData = (c) => this._frames(c);
    this.emit('open');
    if (end + 4 < buf.length) this._frames(buf.subarray(end + 4));
  }

  _frames(chunk) {
    let buf = chunk;
    while (this._parts !== null) {
      // A frame spanning TCP chunks: take only the bytes it still needs from this chunk
      // and copy those once (joining whole chunks would copy every byte a second time).
      const take = Math.min(buf.length, this._need - this._partsLen);
      this._parts.push(take === buf.length ? buf : buf.subarray(0, take));
      this._partsLen += take;
      buf = buf.subarray(take);
      if (this._partsLen < this._need) return;
      const joined = Buffer.concat(this._parts, this._partsLen);
      this._parts = null;
      this._parse(joined); // a whole frame, or a whole header that says how much more
      if (buf.length === 0 || this.readyState === CLOSED) return;
    }
    this._parse(buf);
  }

  _parse(buf) {
    const n = buf.length;
    let pos = 0;
    let need = 2; // bytes from pos the next frame needs (header first)
    while (this.readyState !== CLOSED) {
      need = 2;
      if (pos + 2 > n) break;
      const b0 = buf[pos];
      const b1 = buf[pos + 1];
      let len = b1 & 0x7f;
      let at = pos + 2;
      if (len === 126) {
        need = 4;
        if (at + 2 > n) break;
        len = buf.readUInt16BE(at);
        at += 2;
      } else if (len === 127) {
        need = 10;
        if (at + 8 > n) break;
        len = buf.readUInt32BE(at) * 2 ** 32 + buf.readUInt32BE(at + 4);
        at += 8;
      }
      if (len > this.maxPayload) {
        this._protocolError(1009, 'frame too large');
        return;
      }
      const masked = (b1 & 0x80) !== 0;
      const keyAt = at;
      if (masked) at += 4;
      need = at + len - pos;
      if (at + len > n) break;
      pos = at + len;
      const opcode = b0 & 0x0f;
      if (!masked && (b0 & 0x80) !== 0 && (opcode === 1 || opcode === 2)
          && this.onframe !== null && this._fragments === null) {
        this.onframe(buf, at, at + len, opcode === 2);
        continue;
      }
      let payload = buf.subarray(at, at + len);
      if (masked) {
        const key = buf.subarray(keyAt, keyAt + 4);
        const plain = Buffer.allocUnsafe(len);
        maskInto(payload, key, plain, 0);
        payload = plain;
      }
      this._frame(b0 & 0x80, opcode, payload);
    }
    if (pos < n && this.readyState !== CLOSED) {
      this._parts = [buf.subarray(pos)];
      this._partsLen = n - pos;
      this._need = need;
    }
  }

  _frame(fin, opcode, payload) {
    if (opcode === 1 || opcode === 2) {
      if (this._fragments !== null) {
        this._protocolError(1002, 'new message inside a fragmented one');
        return;
      }
      if (fin) {
        this.emit('message', payload, opcode === 2);
      } else {
        this._fragments = [Buffer.from(payload)];
        this._fragOpcode = opcode;
      }
    } else if (opcode === 0) {
      if (this._fragments === null) {
        this._protocolError(1002, 'continuation without a message');
        return;
      }
      this._fragments.push(Buffer.from(payload));
      if (fin) {
        const whole = Buffer.concat(this._fragments);
        this._fragments = null;
        this.emit('message', whole, this._fragOpcode === 2);
      }
    } else if (opcode === 8) {
      this._closeCode = payload.length >= 2 ? payload.readUInt16BE(0) : 1005;
      this._closeReason = Buffer.from(payload.subarray(2));
      if (!this._closeSent) this._sendClose(this._closeCode === 1005 ? 1000 : this._closeCode);
      this.readyState = CLOSING;
      this._socket.end();
    } else if (opcode === 9) {
      if (this.readyState === OPEN) this._socket.write(clientFrame(10, payload));
    } else if (opcode !== 10) {
      this._protocolError(1002, `unknown opcode ${opcode}`);
    }
  }

  _protocolError(code, reason) {
    this.emit('error', new Error(reason));
    this._closeCode = code;
    this._closeReason = Buffer.from(reason);
    if (!this._closeSent) this._sendClose(code);
    this._socket.destroy();
  }

  _sendClose(code) {
    this._closeSent = true;
    const body = Buffer.alloc(2);
    body.writeUInt16BE(code, 0);
    if (!this._socket.destroyed) this._socket.write(clientFrame(8, body));
  }

  _fail(err) {
    clearTimeout(this._timer);
    if (this.readyState === CLOSED) return;
    this.emit('error', err);
    this._socket.destroy();
  }

  _closed() {
    clearTimeout(this._timer);
    if (this.readyState === CLOSED) return;
    this.readyState = CLOSED;
    this.emit('close', this._closeCode, this._closeReason);
  }

  /** Send a text (string) or binary (Buffer) message. */
  send(data) {
    if (this.readyState !== OPEN) return;
    const isText = typeof data === 'string';
    this._socket.write(clientFrame(isText ? 1 : 2, isText ? Buffer.from(data) : data));
  }

  pause() {
    this._socket.pause();
  }

  resume() {
    this._socket.resume();
  }

  close(code = 1000) {
    if (this.readyState === CLOSED || this.readyState === CLOSING) return;
    if (this.readyState === CONNECTING) {
      this.terminate();
      return;
    }
    this.readyState = CLOSING;
    this._sendClose(code);
    this._socket.end();
  }

  terminate() {
    if (this.readyState === CLOSED) return;
    this._socket.destroy();
  }
}
