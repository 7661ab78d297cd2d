// One WebSocket load generator for pub/sub fan-out, with protocol adapters (HearthNet
// pub/sub in JSON or CBOR (--form), NATS core, NATS JetStream and MQTT 3.1.1, all over
// WebSocket) that share the same transport, payloads, pacing and measurement code. The
// transport is `--client`: `lean` (default, leanws.mjs: frames parsed in one loop per TCP
// chunk) or `ws` (the `ws` package, whose per-frame cost made the generator the
// bottleneck for servers that send one message per frame). `--consumer NAME` makes the
// subscribers durable consumers (HearthNet: `consumer` in `subscribe`; JetStream always
// subscribes through a durable push consumer).
//
// Modes:
//   throughput  one publisher, N subscribers; publish as fast as the server accepts,
//               bounded by outstanding publisher acks and (by default) by how far the
//               publisher may run ahead of the slowest live subscriber (--lead), so that
//               what is counted was really delivered; deliveries/s over the steady part.
//   latency     publish at a fixed rate (--rate msg/s); publish->deliver percentiles.
//   idle        open N subscribed connections, hold them until "stop" on stdin or --hold.
//
// Every payload is --payload bytes of ASCII: "@@" + 15-digit send time (microseconds of
// CLOCK_MONOTONIC, shared by all threads and processes) + ":" + 10-digit message index +
// ":" + padding. Subscribers count messages, detect missing/duplicate indexes, and record
// publish->deliver latency in a log histogram (1 % buckets).
//
// Output: JSON lines on stdout: {"event":"ready"}, {"event":"steady_start"},
// {"event":"steady_end"}, {"event":"done","result":{...}}; errors on stderr.
// Everything is bounded: --max-time kills the process, sockets are closed at the end.

import { Worker, isMainThread, parentPort, workerData } from 'node:worker_threads';
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import WebSocket from 'ws';
import { LeanWebSocket } from './leanws.mjs';
import { encode as cborEncode, decode as cborDecode, textHead as cborTextHead } from './cbor.mjs';

const OPEN = 1; // readyState of an open socket, for both clients

// --- shared helpers ------------------------------------------------------------------

const HR0 = process.hrtime.bigint();
const P0 = performance.now();
const HR0_US = Number(HR0 / 1000n);
/** Microseconds of CLOCK_MONOTONIC (comparable across threads and processes). */
const monoUs = () => HR0_US + (performance.now() - P0) * 1000;

const MARK = Buffer.from('@@');
const TS_DIGITS = 15;
const IDX_DIGITS = 10;
const HEADER_LEN = 2 + TS_DIGITS + 1 + IDX_DIGITS + 1;

function makePayload(size, idx) {
  const ts = Math.round(monoUs()).toString().padStart(TS_DIGITS, '0');
  const head = `@@${ts}:${idx.toString().padStart(IDX_DIGITS, '0')}:`;
  return head + 'x'.repeat(size - head.length);
}

/** The payload mark in buf[start, end): at `expect` when it is there (where the protocol
 *  puts it, or where it was in the previous message), else searched for; -1 if none. */
function findMark(buf, expect, start, end) {
  if (buf[expect] === 0x40 && buf[expect + 1] === 0x40 && expect + 1 < end) return expect;
  const at = buf.indexOf(MARK, start);
  return at >= 0 && at + 1 < end ? at : -1;
}

function readDigits(buf, pos, n) {
  let v = 0;
  for (let i = 0; i < n; i++) v = v * 10 + (buf[pos + i] - 48);
  return v;
}

// Latency histogram: bucket i holds values in [1.01^i, 1.01^(i+1)) microseconds.
const NB = 2200;
const LOG_STEP = Math.log(1.01);
function histAdd(hist, us) {
  const i = us < 1 ? 0 : Math.min(NB - 1, Math.floor(Math.log(us) / LOG_STEP));
  hist[i]++;
}
function histPercentiles(hist, ps) {
  let n = 0;
  for (let i = 0; i < NB; i++) n += hist[i];
  const out = {};
  for (const p of ps) {
    if (n === 0) { out[p] = null; continue; }
    const rank = Math.max(1, Math.ceil((p / 100) * n));
    let acc = 0;
    for (let i = 0; i < NB; i++) {
      acc += hist[i];
      if (acc >= rank) { out[p] = Math.exp((i + 0.5) * LOG_STEP) / 1000; break; }
    }
  }
  return { n, ms: out };
}

const WS_OPTS = {
  perMessageDeflate: false,
  skipUTF8Validation: true,
  maxPayload: 64 * 1024 * 1024,
  handshakeTimeout: 10000,
};

// Protocols whose server acknowledges every publish (HearthNet: published.ok after the
// commit; JetStream: the PubAck on the reply subject); NATS core and MQTT QoS 0 ask for a
// PONG / PINGRESP every --batch messages instead.
const ACK_PER_PUBLISH = new Set(['hearthnet', 'jetstream']);

function parseArgs(argv) {
  const a = {
    proto: 'hearthnet', url: '', mode: 'throughput', subs: 100, workers: 1,
    topic: 'bench.fanout', payload: 256, duration: 10, warmup: 2, rate: 2000,
    maxMsgs: 50_000_000, lead: 1000, outstanding: 256, batch: 64, window: 1024, client: 'lean',
    auth: '', drain: 10, hold: 60, connectConcurrency: 100, maxTime: 0, pauseSubs: 0,
    form: 'json', consumer: '', verify: 0, fields: '', stream: 'BENCH',
  };
  for (let i = 2; i < argv.length; i += 2) {
    const key = argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    if (!(key in a)) throw new Error(`unknown option ${argv[i]}`);
    const v = argv[i + 1];
    if (v === undefined) throw new Error(`missing value for ${argv[i]}`);
    a[key] = typeof a[key] === 'number' ? Number(v) : v;
  }
  if (!a.url) throw new Error('--url is required');
  if (!['hearthnet', 'nats', 'mqtt', 'jetstream'].includes(a.proto)) throw new Error(`unknown --proto ${a.proto}`);
  if (!['json', 'cbor'].includes(a.form)) throw new Error(`unknown --form ${a.form}`);
  if (!['lean', 'ws'].includes(a.client)) throw new Error(`unknown --client ${a.client}`);
  if (!['throughput', 'latency', 'idle'].includes(a.mode)) throw new Error(`unknown --mode ${a.mode}`);
  if (a.payload < HEADER_LEN) throw new Error(`--payload must be >= ${HEADER_LEN}`);
  if (!ACK_PER_PUBLISH.has(a.proto) && a.outstanding < a.batch) throw new Error('--outstanding must be >= --batch');
  if (!a.maxTime) a.maxTime = a.warmup + a.duration + a.drain + a.hold + 120;
  return a;
}

// --- protocol adapters ---------------------------------------------------------------
//
// An adapter owns one socket's protocol. Common surface:
//   subprotocol, open(ws), onData(buf, start, end) (one WebSocket message: buf[start, end)),
//   publish(idx) (publisher only)
// and calls back into the owner (sub/pub state) through `sink`:
//   sink.ready(), sink.message(buf, start, end), sink.gap(fromSeq, toSeq), sink.acked(n),
//   sink.fail(reason)

function mqttRemaining(n) {
  const out = [];
  do {
    let b = n % 128;
    n = Math.floor(n / 128);
    if (n > 0) b |= 0x80;
    out.push(b);
  } while (n > 0);
  return out;
}

function mqttString(s) {
  const b = Buffer.from(s);
  return Buffer.concat([Buffer.from([b.length >> 8, b.length & 0xff]), b]);
}

/** A HearthNet subscribe frame: the run's topic, a durable consumer, `verify` and lean
 *  frames' `fields` (comma-separated in --fields) when asked (spec §6.8, §6.2). */
function subscribeFrame(opts) {
  const frame = { type: 'subscribe', topics: [opts.topic] };
  if (opts.consumer) frame.consumer = opts.consumer;
  if (opts.verify) frame.verify = true;
  if (opts.fields) frame.fields = opts.fields.split(',');
  return frame;
}

class HearthNetAdapter {
  constructor(opts, sink, authFrame, role) {
    this.opts = opts;
    this.sink = sink;
    this.auth = authFrame;
    this.role = role;
    this.subprotocol = 'hearthnet-bus.v2';
    this.half = Math.max(1, Math.floor(opts.window / 2));
    this.sinceAck = 0;
    this.lastSeq = 0;
    this.ackedSeq = 0;
    this.markAt = 0; // where the payload began in the last message frame
    this.prefix = `{"type":"publish","topic":"${opts.topic}","msg_type":"bench","data":"`;
  }

  open(ws) {
    this.ws = ws;
    ws.send(JSON.stringify({ ...this.auth, type: 'auth', window: this.opts.window }));
  }

  onData(buf, start, end) {
    // {"event":"message",...,"seq":N}: 'm' at offset 10. Everything else is rare: parse it.
    if (buf[start + 10] === 0x6d && buf[start + 11] === 0x65) {
      // The envelope's fields come in the server's order; a node keeps that order and the
      // lengths before `data` rarely change, so look where the last payload began first.
      const at = findMark(buf, start + this.markAt, start, end);
      if (at >= 0) this.markAt = at - start;
      this.sink.message(buf, at);
      // ,"seq":N} at the tail: read digits backwards from the closing brace.
      let close = end - 1;
      while (buf[close] !== 0x7d) close--;
      let seq = 0;
      let mul = 1;
      for (let i = close - 1; buf[i] >= 48 && buf[i] <= 57; i--) {
        seq += (buf[i] - 48) * mul;
        mul *= 10;
      }
      this.lastSeq = seq;
      if (++this.sinceAck >= this.half) this.ack();
      return;
    }
    let frame;
    try {
      frame = JSON.parse(buf.toString('utf8', start, end));
    } catch {
      this.sink.fail('unparsable frame');
      return;
    }
    switch (frame.event) {
      case 'published.ok':
        this.sink.acked(1);
        break;
      case 'auth.ok':
        if (this.role === 'sub') {
          this.ws.send(JSON.stringify(subscribeFrame(this.opts)));
        } else {
          this.sink.ready();
        }
        break;
      case 'subscribed':
        this.sink.ready();
        break;
      case 'gap':
        this.sink.gap(frame.data.from_seq, frame.data.to_seq);
        break;
      case 'auth.error':
      case 'error':
        this.sink.fail(`${frame.event}: ${JSON.stringify(frame.data)}`);
        break;
      default:
        break; // presence, pong: not used here
    }
  }

  ack() {
    this.sinceAck = 0;
    if (this.lastSeq > this.ackedSeq && this.ws.readyState === OPEN) {
      this.ackedSeq = this.lastSeq;
      this.ws.send(`{"type":"ack","upto":${this.lastSeq}}`);
    }
  }

  publish(idx, withAckRequest) {
    void withAckRequest; // every publish is acknowledged (published.ok, after commit)
    this.ws.send(this.prefix + makePayload(this.opts.payload, idx) + '"}');
    return 1; // one ack expected per message
  }

  close() {}
}

// HearthNet over `hearthnet-bus.v2+cbor`: the same session in CBOR binary frames. A
// message frame is the map {"event":"message","data":<envelope>,"seq":N} in that order:
// 0xa3, "event" (0x65 + 5 bytes), "message" (0x67 + 7 bytes)... and "seq" (0x63 "seq")
// followed by an unsigned integer at its end.
const CBOR_SEQ_KEY = Buffer.from([0x63, 0x73, 0x65, 0x71]);

class HearthNetCborAdapter extends HearthNetAdapter {
  constructor(opts, sink, authFrame, role) {
    super(opts, sink, authFrame, role);
    this.subprotocol = 'hearthnet-bus.v2+cbor';
    const head = cborEncode({ type: 'publish', topic: opts.topic, msg_type: 'bench' });
    head[0] += 1; // one more pair: "data" and the payload, spliced in per publish
    this.pubPrefix = Buffer.concat([head, cborEncode('data'), cborTextHead(opts.payload)]);
  }

  open(ws) {
    this.ws = ws;
    ws.send(cborEncode({ ...this.auth, type: 'auth', window: this.opts.window }));
  }

  onData(buf, start, end) {
    if (buf[start] === 0xa3 && buf[start + 8] === 0x6d && buf[start + 9] === 0x65) {
      const at = findMark(buf, start + this.markAt, start, end);
      if (at >= 0) this.markAt = at - start;
      this.sink.message(buf, at);
      const key = buf.lastIndexOf(CBOR_SEQ_KEY, end - 2);
      let seq = 0;
      if (key >= start) {
        const b = buf[key + 4];
        const info = b & 0x1f;
        if (info < 24) seq = info;
        else if (info === 24) seq = buf[key + 5];
        else if (info === 25) seq = buf.readUInt16BE(key + 5);
        else if (info === 26) seq = buf.readUInt32BE(key + 5);
        else seq = Number(buf.readBigUInt64BE(key + 5));
      }
      this.lastSeq = seq;
      if (++this.sinceAck >= this.half) this.ack();
      return;
    }
    let frame;
    try {
      frame = cborDecode(buf, start, end);
    } catch {
      this.sink.fail('unparsable frame');
      return;
    }
    this.control(frame);
  }

  control(frame) {
    switch (frame.event) {
      case 'published.ok':
        this.sink.acked(1);
        break;
      case 'auth.ok':
        if (this.role === 'sub') this.ws.send(cborEncode(subscribeFrame(this.opts)));
        else this.sink.ready();
        break;
      case 'subscribed':
        this.sink.ready();
        break;
      case 'gap':
        this.sink.gap(frame.data.from_seq, frame.data.to_seq);
        break;
      case 'auth.error':
      case 'error':
        this.sink.fail(`${frame.event}: ${JSON.stringify(frame.data)}`);
        break;
      default:
        break;
    }
  }

  ack() {
    this.sinceAck = 0;
    if (this.lastSeq > this.ackedSeq && this.ws.readyState === OPEN) {
      this.ackedSeq = this.lastSeq;
      this.ws.send(cborEncode({ type: 'ack', upto: this.lastSeq }));
    }
  }

  publish(idx, withAckRequest) {
    void withAckRequest;
    const payload = Buffer.from(makePayload(this.opts.payload, idx), 'latin1');
    this.ws.send(Buffer.concat([this.pubPrefix, payload]));
    return 1;
  }
}

class NatsAdapter {
  constructor(opts, sink, _auth, role, id) {
    this.opts = opts;
    this.sink = sink;
    this.role = role;
    this.id = id;
    this.subprotocol = null;
    this.pending = null; // unparsed bytes
    this.state = 'info';
    this.subject = opts.topic;
    this.pubHead = Buffer.from(`PUB ${this.subject} ${opts.payload}\r\n`);
    this.pingTail = Buffer.from('\r\nPING\r\n');
    this.crlf = Buffer.from('\r\n');
  }

  open(ws) {
    this.ws = ws;
  }

  onData(chunk, from, to) {
    let buf = chunk.subarray(from, to);
    if (this.pending !== null) {
      buf = Buffer.concat([this.pending, buf]);
      this.pending = null;
    }
    let pos = 0;
    const n = buf.length;
    while (pos < n) {
      const eol = buf.indexOf(this.crlf, pos);
      if (eol < 0) break;
      const c0 = buf[pos];
      if (c0 === 0x4d /* M */ && buf[pos + 1] === 0x53 && buf[pos + 2] === 0x47) {
        // MSG <subject> <sid> [reply-to] <#bytes>\r\n<payload>\r\n
        let size = 0;
        let mul = 1;
        for (let i = eol - 1; buf[i] >= 48 && buf[i] <= 57; i--) {
          size += (buf[i] - 48) * mul;
          mul *= 10;
        }
        const start = eol + 2;
        if (start + size + 2 > n) break; // payload spans frames
        this.msg(buf, pos, eol, start, size);
        pos = start + size + 2;
        continue;
      }
      const line = buf.toString('latin1', pos, eol);
      pos = eol + 2;
      if (line === 'PING') {
        this.ws.send(Buffer.from('PONG\r\n'));
      } else if (line === 'PONG') {
        if (this.state === 'connecting') {
          this.state = 'ready';
          this.sink.ready();
        } else {
          this.sink.acked(this.opts.batch);
        }
      } else if (line.startsWith('INFO ')) {
        if (this.state === 'info') {
          this.state = 'connecting';
          const connect = JSON.stringify({
            verbose: false, pedantic: false, tls_required: false, name: `bench-${this.id}`,
            lang: 'node', version: '1', protocol: 1, echo: false, headers: false,
            no_responders: false,
          });
          this.ws.send(Buffer.from(`CONNECT ${connect}\r\n${this.afterConnect()}PING\r\n`));
        }
      } else if (line.startsWith('-ERR')) {
        this.sink.fail(line);
      }
      // +OK and anything else: ignore
    }
    if (pos < n) this.pending = buf.subarray(pos);
  }

  /** Protocol lines sent after CONNECT (and before the PING that ends the handshake). */
  afterConnect() {
    return this.role === 'sub' ? `SUB ${this.subject} 1\r\n` : '';
  }

  /** One MSG: its line is buf[line, eol), its payload buf[start, start + size). */
  msg(buf, line, eol, start, size) {
    this.sink.message(buf, findMark(buf, start, start, start + size));
  }

  publish(idx, withAckRequest) {
    const payload = Buffer.from(makePayload(this.opts.payload, idx), 'latin1');
    const parts = [this.pubHead, payload, withAckRequest ? this.pingTail : this.crlf];
    this.ws.send(Buffer.concat(parts));
    return 0;
  }

  close() {}
}

// NATS JetStream over the same WebSocket protocol. The harness creates the stream (file
// storage) before the run. The publisher publishes with a reply subject and counts the
// PubAck the server sends after storing each message (an {"error"} reply is a failure).
// Each subscriber is a durable push consumer (ack policy "all", at most --window
// unacknowledged): it acks the last message it got every half window, as HearthNet's
// subscribers do with `ack upto`.
class JetStreamAdapter extends NatsAdapter {
  constructor(opts, sink, auth, role, id) {
    super(opts, sink, auth, role, id);
    this.half = Math.max(1, Math.floor(opts.window / 2));
    this.sinceAck = 0;
    this.lastBuf = null; // the newest message not yet acked: buf[lastLine, lastEol)
    this.lastLine = 0;
    this.lastEol = 0;
    this.durable = `${opts.consumer || 'c'}_${process.pid}_${id}`;
    this.deliver = `dlv.${process.pid}.${id}`;
    this.inbox = `_INBOX.${process.pid}.${role}.${id}`;
    this.pubHead = Buffer.from(`PUB ${this.subject} ${this.inbox} ${opts.payload}\r\n`);
    this.created = false;
  }

  afterConnect() {
    if (this.role !== 'sub') return `SUB ${this.inbox} 1\r\n`;
    const config = {
      durable_name: this.durable, deliver_subject: this.deliver, ack_policy: 'all',
      max_ack_pending: this.opts.window, deliver_policy: 'all', filter_subject: this.subject,
      replay_policy: 'instant',
    };
    const body = JSON.stringify({ stream_name: this.opts.stream, config });
    const api = `$JS.API.CONSUMER.DURABLE.CREATE.${this.opts.stream}.${this.durable}`;
    return `SUB ${this.deliver} 1\r\nSUB ${this.inbox} 2\r\n`
      + `PUB ${api} ${this.inbox} ${Buffer.byteLength(body)}\r\n${body}\r\n`;
  }

  msg(buf, line, eol, start, size) {
    if (this.role === 'pub') {
      // {"stream":"BENCH","seq":N} or {"error":{...}}
      if (buf[start + 2] === 0x65 /* e */) this.sink.fail(buf.toString('utf8', start, start + size));
      else this.sink.acked(1);
      return;
    }
    if (buf[line + 4] === 0x5f /* _ of _INBOX: the consumer-create reply */) {
      const text = buf.toString('utf8', start, start + size);
      if (text.includes('"error"')) this.sink.fail(`consumer create: ${text}`);
      else { this.created = true; this.sink.ready(); }
      return;
    }
    this.sink.message(buf, findMark(buf, start, start, start + size));
    // the newest message's line, read only when acking (chunks are not reused)
    this.lastBuf = buf;
    this.lastLine = line;
    this.lastEol = eol;
    if (++this.sinceAck >= this.half) this.ack();
  }

  ack() {
    // MSG <deliver> <sid> <reply $JS.ACK...> <size>: with ack policy "all", acking the
    // newest message acks everything delivered before it
    this.sinceAck = 0;
    if (this.lastBuf === null || this.ws.readyState !== OPEN) return;
    const reply = this.lastBuf.toString('latin1', this.lastLine, this.lastEol).split(' ')[3];
    this.lastBuf = null;
    this.ws.send(Buffer.from(`PUB ${reply} 0\r\n\r\n`));
  }

  onData(chunk, from, to) {
    // The PONG of the handshake is not the end of it for a subscriber: the consumer is
    // ready when the create reply comes (msg above); PONGs after that are not acks here.
    if (this.role === 'sub' && this.state === 'connecting') this.state = 'awaiting-consumer';
    super.onData(chunk, from, to);
  }

  publish(idx) {
    const payload = Buffer.from(makePayload(this.opts.payload, idx), 'latin1');
    this.ws.send(Buffer.concat([this.pubHead, payload, this.crlf]));
    return 1; // one PubAck expected per message
  }

  close() {
    if (this.role === 'sub' && this.created && this.ws && this.ws.readyState === OPEN) {
      // the durable consumer is per run: delete it so the stream does not accumulate them
      const api = `$JS.API.CONSUMER.DELETE.${this.opts.stream}.${this.durable}`;
      this.ws.send(Buffer.from(`PUB ${api} 0\r\n\r\n`));
    }
  }
}

class MqttAdapter {
  constructor(opts, sink, _auth, role, id) {
    this.opts = opts;
    this.sink = sink;
    this.role = role;
    this.id = id;
    this.subprotocol = 'mqtt';
    this.pending = null;
    this.topic = opts.topic.replaceAll('.', '/');
    const t = mqttString(this.topic);
    const rem = t.length + opts.payload;
    this.pubHead = Buffer.concat([Buffer.from([0x30, ...mqttRemaining(rem)]), t]);
    this.pingreq = Buffer.from([0xc0, 0x00]);
  }

  open(ws) {
    this.ws = ws;
    const clientId = mqttString(`b${process.pid}-${this.role}-${this.id}`);
    const vh = Buffer.from([0x00, 0x04, 0x4d, 0x51, 0x54, 0x54, 0x04, 0x02, 0x00, 0x00]);
    const body = Buffer.concat([vh, clientId]);
    ws.send(Buffer.concat([Buffer.from([0x10, ...mqttRemaining(body.length)]), body]));
  }

  onData(chunk, from, to) {
    let buf = chunk.subarray(from, to);
    if (this.pending !== null) {
      buf = Buffer.concat([this.pending, buf]);
      this.pending = null;
    }
    let pos = 0;
    const n = buf.length;
    while (pos + 2 <= n) {
      const type = buf[pos] >> 4;
      let rem = 0;
      let mul = 1;
      let i = pos + 1;
      let complete = false;
      for (; i < n && i < pos + 5; i++) {
        rem += (buf[i] & 0x7f) * mul;
        mul *= 128;
        if ((buf[i] & 0x80) === 0) { complete = true; i++; break; }
      }
      if (!complete || i + rem > n) break; // packet spans frames
      const start = i;
      const end = i + rem;
      if (type === 3) {
        const tlen = (buf[start] << 8) | buf[start + 1];
        let p = start + 2 + tlen;
        if ((buf[pos] & 0x06) !== 0) p += 2; // packet id for QoS > 0 (not used here)
        this.sink.message(buf, findMark(buf, p, p, end));
      } else if (type === 2) {
        if (buf[start + 1] !== 0) this.sink.fail(`CONNACK return code ${buf[start + 1]}`);
        else if (this.role === 'sub') {
          const filter = mqttString(this.topic);
          const body = Buffer.concat([Buffer.from([0x00, 0x01]), filter, Buffer.from([0x00])]);
          this.ws.send(Buffer.concat([Buffer.from([0x82, ...mqttRemaining(body.length)]), body]));
        } else this.sink.ready();
      } else if (type === 9) {
        if (buf[start + 2] === 0x80) this.sink.fail('SUBACK refused');
        else this.sink.ready();
      } else if (type === 13) {
        this.sink.acked(this.opts.batch);
      }
      pos = end;
    }
    if (pos < n) this.pending = buf.subarray(pos);
  }

  publish(idx, withAckRequest) {
    const payload = Buffer.from(makePayload(this.opts.payload, idx), 'latin1');
    const parts = [this.pubHead, payload];
    if (withAckRequest) parts.push(this.pingreq);
    this.ws.send(Buffer.concat(parts));
    return 0;
  }

  close() {
    if (this.ws && this.ws.readyState === OPEN) this.ws.send(Buffer.from([0xe0, 0x00]));
  }
}

const ADAPTERS = {
  hearthnet: HearthNetAdapter, nats: NatsAdapter, mqtt: MqttAdapter, jetstream: JetStreamAdapter,
};

function adapterClass(opts) {
  return opts.proto === 'hearthnet' && opts.form === 'cbor' ? HearthNetCborAdapter : ADAPTERS[opts.proto];
}

function loadAuth(path) {
  if (!path) return { subscribers: null, shared: {}, publisher: {} };
  const obj = JSON.parse(readFileSync(path, 'utf8'));
  return {
    subscribers: obj.subscribers ?? null,
    shared: obj.shared ?? null,
    publisher: obj.publisher ?? obj.shared ?? null,
  };
}

function authFor(auth, i) {
  const frame = auth.subscribers ? auth.subscribers[i] : auth.shared;
  if (!frame) throw new Error(`no auth frame for subscriber ${i}`);
  return frame;
}

/** Open one socket with an adapter; resolves when the adapter says ready. */
function connect(opts, adapter, onClose) {
  return new Promise((resolve, reject) => {
    const protocols = adapter.subprotocol ? [adapter.subprotocol] : [];
    const Client = opts.client === 'ws' ? WebSocket : LeanWebSocket;
    const ws = new Client(opts.url, protocols, WS_OPTS);
    ws.binaryType = 'nodebuffer';
    let settled = false;
    const timer = setTimeout(() => {
      if (!settled) { settled = true; ws.terminate(); reject(new Error('ready timeout')); }
    }, 30000);
    const sink = adapter.sink;
    const origReady = sink.ready;
    sink.ready = () => {
      sink.ready = () => {};
      if (!settled) { settled = true; clearTimeout(timer); resolve(ws); }
      if (origReady) origReady();
    };
    const origFail = sink.fail;
    sink.fail = (reason) => {
      if (!settled) { settled = true; clearTimeout(timer); ws.terminate(); reject(new Error(reason)); return; }
      origFail(reason);
    };
    ws.on('open', () => adapter.open(ws));
    ws.on('message', (data) => adapter.onData(data, 0, data.length));
    if (ws instanceof LeanWebSocket) ws.onframe = (buf, start, end) => adapter.onData(buf, start, end);
    ws.on('error', (err) => {
      if (!settled) { settled = true; clearTimeout(timer); reject(err); }
    });
    ws.on('close', (code, reason) => {
      if (!settled) { settled = true; clearTimeout(timer); reject(new Error(`closed ${code} ${reason}`)); return; }
      onClose(code, reason.toString());
    });
  });
}

async function pool(items, concurrency, fn) {
  let next = 0;
  const runners = [];
  for (let k = 0; k < Math.min(concurrency, items.length); k++) {
    runners.push((async () => {
      while (next < items.length) {
        const i = next++;
        await fn(items[i]);
      }
    })());
  }
  await Promise.all(runners);
}

// --- subscriber worker ---------------------------------------------------------------

async function subscriberWorker() {
  const { opts, ids, countsBuf, deadBuf } = workerData;
  const counts = new Int32Array(countsBuf);
  const dead = new Int8Array(deadBuf);
  const auth = loadAuth(opts.auth);
  const Adapter = adapterClass(opts);
  const hist = new Float64Array(NB);
  const recordLatency = opts.mode !== 'idle';
  let maxLatUs = 0;
  const subs = [];
  let closing = false;
  let connectFailures = 0;
  const failReasons = {};

  const makeSub = (id) => {
    const s = {
      id, count: 0, last: -1, missing: 0, dupes: 0, gapFrames: 0, gapMsgs: 0,
      closed: null, errors: 0, ws: null,
    };
    s.sink = {
      message(buf, at) {
        s.count++;
        counts[id] = s.count;
        if (at < 0) { s.errors++; return; }
        const idx = readDigits(buf, at + 3 + TS_DIGITS, IDX_DIGITS);
        if (idx !== s.last + 1) {
          if (idx > s.last) s.missing += idx - s.last - 1;
          else s.dupes++;
        }
        if (idx > s.last) s.last = idx;
        if (recordLatency) {
          const lat = monoUs() - readDigits(buf, at + 2, TS_DIGITS);
          histAdd(hist, lat);
          if (lat > maxLatUs) maxLatUs = lat;
        }
      },
      gap(a, b) { s.gapFrames++; s.gapMsgs += b - a + 1; },
      acked() {},
      ready: null,
      fail(reason) { s.errors++; failReasons[reason] = (failReasons[reason] ?? 0) + 1; },
    };
    s.adapter = new Adapter(opts, s.sink, opts.proto === 'hearthnet' ? authFor(auth, id) : null, 'sub', id);
    return s;
  };

  const t0 = performance.now();
  await pool(ids, opts.connectConcurrency, async (id) => {
    const s = makeSub(id);
    try {
      s.ws = await connect(opts, s.adapter, (code, reason) => {
        if (!closing) {
          s.closed = `${code} ${reason}`.trim();
          if (!dead[id]) dead[id] = 1;
        }
      });
      subs.push(s);
    } catch (err) {
      connectFailures++;
      dead[id] = 1;
      const r = String(err.message ?? err).slice(0, 200);
      failReasons[r] = (failReasons[r] ?? 0) + 1;
    }
  });
  parentPort.postMessage({
    type: 'ready', connected: subs.length, connectFailures, setupMs: performance.now() - t0,
    failReasons,
  });

  parentPort.on('message', (msg) => {
    if (msg.type === 'pause' || msg.type === 'resume') {
      // diagnostic: subscribers that stop reading, to see how each server handles them
      for (const s of subs) {
        if (s.id >= opts.pauseSubs) continue;
        s.paused = true;
        dead[s.id] = 2; // not waited for by the publisher's lead
        if (msg.type === 'pause') s.ws.pause();
        else s.ws.resume();
      }
    } else if (msg.type === 'ack-all') {
      for (const s of subs) if (s.ws.readyState === OPEN && s.adapter.ack) s.adapter.ack();
    } else if (msg.type === 'report') {
      const per = subs.map((s) => ({
        id: s.id, count: s.count, last: s.last, missing: s.missing, dupes: s.dupes,
        gapFrames: s.gapFrames, gapMsgs: s.gapMsgs, closed: s.closed, errors: s.errors,
        paused: Boolean(s.paused),
      }));
      parentPort.postMessage({ type: 'report', per, hist, maxLatUs, failReasons });
    } else if (msg.type === 'close') {
      closing = true;
      let open = 0;
      const done = () => { if (--open <= 0) parentPort.postMessage({ type: 'closed' }); };
      for (const s of subs) {
        if (s.ws.readyState === OPEN) {
          open++;
          s.ws.once('close', done);
          s.adapter.close();
          s.ws.close(1000);
        }
      }
      if (open === 0) parentPort.postMessage({ type: 'closed' });
      setTimeout(() => {
        for (const s of subs) s.ws.terminate();
        parentPort.postMessage({ type: 'closed' });
      }, 3000).unref();
    }
  });
}

// --- publisher worker ----------------------------------------------------------------

async function publisherWorker() {
  const { opts, countsBuf, deadBuf, ctrlBuf } = workerData;
  const counts = new Int32Array(countsBuf);
  const dead = new Int8Array(deadBuf);
  const ctrl = new Int32Array(ctrlBuf); // [0] stop flag, [1] published, [2] acked
  const auth = loadAuth(opts.auth);
  const Adapter = adapterClass(opts);
  // Outstanding publisher acks: NATS/MQTT ask for one (PING/PINGREQ) every `batch` messages.
  const ackStep = ACK_PER_PUBLISH.has(opts.proto) ? 1 : opts.batch;
  let published = 0;
  let acked = 0;
  let expectedAcks = 0; // acks the publisher asked for (HearthNet: one per message)
  let errors = 0;
  let wakeup = null;
  let closedBy = null;
  const failReasons = {};
  // Publish -> ack round trips (protocols that ack every publish, in order): each
  // publish's send time in a ring, taken off by its ack; those sent in the steady window
  // go into a histogram (the publisher's own view of a durable round trip).
  const RING = 1 << 17;
  const sentAt = new Float64Array(RING);
  const ackHist = new Float64Array(NB);
  let windowFrom = Infinity;
  let windowTo = Infinity;
  const sink = {
    message() {},
    gap() {},
    acked(n) {
      if (ackStep === 1) {
        const now = monoUs();
        for (let i = acked; i < acked + n && i < published; i++) {
          const t = sentAt[i % RING];
          if (t >= windowFrom && t < windowTo) histAdd(ackHist, now - t);
        }
      }
      acked += n;
      ctrl[2] = acked;
      if (wakeup) { const w = wakeup; wakeup = null; w(); }
    },
    ready: null,
    fail(reason) { errors++; failReasons[reason] = (failReasons[reason] ?? 0) + 1; },
  };
  const adapter = new Adapter(opts, sink, opts.proto === 'hearthnet' ? auth.publisher : null, 'pub', 'p');
  const ws = await connect(opts, adapter, (code, reason) => {
    closedBy = `${code} ${reason}`.trim();
    if (wakeup) { const w = wakeup; wakeup = null; w(); }
  });
  parentPort.postMessage({ type: 'ready' });

  let cachedMin = 0;
  const minDelivered = () => {
    let m = Infinity;
    for (let i = 0; i < counts.length; i++) if (!dead[i] && counts[i] < m) m = counts[i];
    return m === Infinity ? published : m;
  };
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const waitAck = () => new Promise((r) => { wakeup = r; setTimeout(r, 5).unref(); });
  let maxBehindMs = 0;

  const stopped = () => Atomics.load(ctrl, 0) !== 0 || closedBy !== null || published >= opts.maxMsgs;

  async function runThroughput() {
    while (!stopped()) {
      if (published - acked >= opts.outstanding) { await waitAck(); continue; }
      if (opts.lead > 0 && published >= cachedMin + opts.lead) {
        cachedMin = minDelivered();
        if (published >= cachedMin + opts.lead) { await sleep(1); continue; }
      }
      const ask = (published + 1) % ackStep === 0;
      sentAt[published % RING] = monoUs();
      expectedAcks += adapter.publish(published, ask);
      if (ask && ackStep > 1) expectedAcks += ackStep;
      published++;
      ctrl[1] = published;
      // yield to the event loop now and then so acks and closes are seen
      if (published % 64 === 0) await new Promise((r) => setImmediate(r));
    }
  }

  async function runRate() {
    const start = performance.now();
    while (!stopped()) {
      const due = Math.floor(((performance.now() - start) / 1000) * opts.rate);
      if (due > published) {
        const behind = (due - published - 1) / opts.rate * 1000;
        if (behind > maxBehindMs) maxBehindMs = behind;
      }
      while (published < due && !stopped()) {
        if (published - acked >= 100000) { closedBy = closedBy ?? 'too many publishes unacknowledged'; break; }
        const ask = (published + 1) % ackStep === 0;
        sentAt[published % RING] = monoUs();
        expectedAcks += adapter.publish(published, ask);
        if (ask && ackStep > 1) expectedAcks += ackStep;
        published++;
        ctrl[1] = published;
      }
      await sleep(1);
    }
  }

  parentPort.on('message', async (msg) => {
    if (msg.type === 'start') {
      windowFrom = monoUs() + opts.warmup * 1e6; // the main thread's steady window
      windowTo = windowFrom + opts.duration * 1e6;
      if (opts.mode === 'latency') await runRate();
      else await runThroughput();
      // wait (bounded) for the publish acks still outstanding
      const until = performance.now() + 5000;
      while (acked < expectedAcks && closedBy === null && performance.now() < until) {
        await waitAck();
      }
      parentPort.postMessage({
        type: 'published', published, acked, errors, closedBy, failReasons, maxBehindMs,
        ackRtt: histPercentiles(ackHist, [50, 90, 99]),
      });
    } else if (msg.type === 'close') {
      adapter.close();
      ws.close(1000);
      setTimeout(() => { ws.terminate(); parentPort.postMessage({ type: 'closed' }); }, 1000).unref();
      ws.once('close', () => parentPort.postMessage({ type: 'closed' }));
    }
  });
}

// --- main ------------------------------------------------------------------------------

function emit(obj) {
  process.stdout.write(JSON.stringify(obj) + '\n');
}

function once(worker, type) {
  return new Promise((resolve, reject) => {
    const onExit = (code) => reject(new Error(`worker exited with ${code} before '${type}'`));
    const onMsg = (msg) => {
      if (msg.type === type) {
        worker.off('message', onMsg); worker.off('error', reject); worker.off('exit', onExit);
        resolve(msg);
      }
    };
    worker.on('message', onMsg);
    worker.once('error', reject);
    worker.once('exit', onExit);
  });
}

async function main() {
  const opts = parseArgs(process.argv);
  const killer = setTimeout(() => {
    process.stderr.write(`loadgen: --max-time ${opts.maxTime}s reached, exiting\n`);
    process.exit(3);
  }, opts.maxTime * 1000);
  killer.unref();

  const self = fileURLToPath(import.meta.url);
  const countsBuf = new SharedArrayBuffer(4 * Math.max(1, opts.subs));
  const deadBuf = new SharedArrayBuffer(Math.max(1, opts.subs));
  const ctrlBuf = new SharedArrayBuffer(4 * 4);
  const counts = new Int32Array(countsBuf);
  const ctrl = new Int32Array(ctrlBuf);
  const nWorkers = Math.max(1, Math.min(opts.workers, opts.subs));
  const workers = [];
  for (let w = 0; w < nWorkers; w++) {
    const ids = [];
    for (let i = w; i < opts.subs; i += nWorkers) ids.push(i);
    workers.push(new Worker(self, { workerData: { role: 'sub', opts, ids, countsBuf, deadBuf } }));
  }
  const setupStart = performance.now();
  const readies = await Promise.all(workers.map((w) => once(w, 'ready')));
  const connected = readies.reduce((a, r) => a + r.connected, 0);
  const failReasons = {};
  for (const r of readies) for (const [k, v] of Object.entries(r.failReasons)) failReasons[k] = (failReasons[k] ?? 0) + v;
  const setupS = (performance.now() - setupStart) / 1000;
  emit({ event: 'ready', connected, failed: opts.subs - connected, setup_s: setupS, fail_reasons: failReasons });

  const cpu = () => process.cpuUsage();
  const sumCounts = () => { let s = 0; for (let i = 0; i < counts.length; i++) s += counts[i]; return s; };
  const closeAll = async (extra) => {
    await Promise.all([...extra, ...workers].map((w) => { w.postMessage({ type: 'close' }); return once(w, 'closed'); }));
    await Promise.all([...extra, ...workers].map((w) => w.terminate()));
  };

  if (opts.mode === 'idle') {
    const cpu0 = cpu();
    let stop;
    const stopped = new Promise((r) => { stop = r; });
    const rl = createInterface({ input: process.stdin });
    rl.on('line', (line) => { if (line.trim() === 'stop') stop('stdin'); });
    rl.on('close', () => stop('stdin closed'));
    const holdTimer = setTimeout(() => stop('hold elapsed'), opts.hold * 1000);
    const reason = await stopped;
    clearTimeout(holdTimer);
    rl.close();
    const reports = await Promise.all(workers.map((w) => { w.postMessage({ type: 'report' }); return once(w, 'report'); }));
    const dropped = reports.flatMap((r) => r.per).filter((p) => p.closed !== null).length;
    const c = cpu();
    await closeAll([]);
    emit({
      event: 'done',
      result: {
        proto: opts.proto, mode: 'idle', subs: opts.subs, workers: nWorkers, connected,
        connect_failed: opts.subs - connected, fail_reasons: failReasons, setup_s: setupS,
        closed_while_held: dropped, stop_reason: reason,
        loadgen_cpu_s_hold: (c.user + c.system - cpu0.user - cpu0.system) / 1e6,
      },
    });
    return;
  }

  const pub = new Worker(self, { workerData: { role: 'pub', opts, countsBuf, deadBuf, ctrlBuf } });
  await once(pub, 'ready');
  const series = [];
  const tStart = performance.now();
  const publishedP = once(pub, 'published');
  if (opts.pauseSubs > 0) for (const w of workers) w.postMessage({ type: 'pause' });
  pub.postMessage({ type: 'start' });
  const sampler = setInterval(() => {
    series.push([Math.round(performance.now() - tStart), sumCounts(), ctrl[1]]);
  }, 250);

  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  await sleep(opts.warmup * 1000);
  const a = { t: performance.now(), delivered: sumCounts(), published: ctrl[1], cpu: cpu() };
  emit({ event: 'steady_start' });
  // bounded: a publisher that dies early ends the window early
  await Promise.race([sleep(opts.duration * 1000), publishedP]);
  const b = { t: performance.now(), delivered: sumCounts(), published: ctrl[1], cpu: cpu() };
  emit({ event: 'steady_end' });
  Atomics.store(ctrl, 0, 1);
  if (opts.pauseSubs > 0) for (const w of workers) w.postMessage({ type: 'resume' });
  const pubResult = await publishedP;

  // drain: until every live subscriber has everything, or no progress for 2 s, or --drain
  const drainStart = performance.now();
  let lastSum = -1;
  let lastProgress = performance.now();
  for (;;) {
    for (const w of workers) w.postMessage({ type: 'ack-all' });
    const s = sumCounts();
    if (s !== lastSum) { lastSum = s; lastProgress = performance.now(); }
    if (s >= pubResult.published * connected) break;
    if (performance.now() - lastProgress > 2000) break;
    if (performance.now() - drainStart > opts.drain * 1000) break;
    await sleep(50);
  }
  const drainS = (performance.now() - drainStart) / 1000;
  clearInterval(sampler);
  const reports = await Promise.all(workers.map((w) => { w.postMessage({ type: 'report' }); return once(w, 'report'); }));
  const cEnd = cpu();
  await closeAll([pub]);

  const hist = new Float64Array(NB);
  let maxLatUs = 0;
  const per = [];
  const subFail = {};
  for (const r of reports) {
    for (let i = 0; i < NB; i++) hist[i] += r.hist[i];
    maxLatUs = Math.max(maxLatUs, r.maxLatUs);
    per.push(...r.per);
    for (const [k, v] of Object.entries(r.failReasons)) subFail[k] = (subFail[k] ?? 0) + v;
  }
  const published = pubResult.published;
  const pausedPer = per.filter((p) => p.paused);
  const paused = {
    count: pausedPer.length,
    delivered: pausedPer.reduce((acc, p) => acc + p.count, 0),
    missing: pausedPer.reduce((acc, p) => acc + p.missing + Math.max(0, published - 1 - p.last), 0),
    gap_messages: pausedPer.reduce((acc, p) => acc + p.gapMsgs, 0),
    closed: pausedPer.filter((p) => p.closed !== null).length,
  };
  const delivered = per.reduce((acc, p) => acc + p.count, 0);
  const sumOf = (k) => per.reduce((acc, p) => acc + p[k], 0);
  const tailMissing = per.reduce((acc, p) => acc + Math.max(0, published - 1 - p.last), 0);
  const closed = per.filter((p) => p.closed !== null);
  const closeCodes = {};
  for (const p of closed) closeCodes[p.closed] = (closeCodes[p.closed] ?? 0) + 1;
  const complete = per.filter((p) => p.count === published && p.missing === 0).length;
  const lat = histPercentiles(hist, [50, 90, 99, 99.9]);
  const wall = (b.t - a.t) / 1000;
  const cpuS = (b.cpu.user + b.cpu.system - a.cpu.user - a.cpu.system) / 1e6;
  emit({
    event: 'done',
    result: {
      proto: opts.proto, mode: opts.mode, subs: opts.subs, workers: nWorkers,
      payload_bytes: opts.payload, lead: opts.lead, outstanding: opts.outstanding,
      rate: opts.mode === 'latency' ? opts.rate : null,
      connected, connect_failed: opts.subs - connected, setup_s: setupS,
      published, publish_acked: pubResult.acked, publish_errors: pubResult.errors,
      publisher_closed: pubResult.closedBy, publisher_fail_reasons: pubResult.failReasons,
      publisher_max_behind_ms: opts.mode === 'latency' ? pubResult.maxBehindMs : null,
      publish_ack_ms: pubResult.ackRtt.n ? { ...pubResult.ackRtt.ms, n: pubResult.ackRtt.n } : null,
      steady: {
        wall_s: wall,
        deliveries: b.delivered - a.delivered,
        deliveries_per_s: (b.delivered - a.delivered) / wall,
        published: b.published - a.published,
        publish_per_s: (b.published - a.published) / wall,
        loadgen_cpu_s: cpuS,
        loadgen_cpu_cores: cpuS / wall,
      },
      delivered_total: delivered,
      expected_total: published * connected,
      subscribers_complete: complete,
      missing_by_index: sumOf('missing') + tailMissing,
      duplicates_or_reordered: sumOf('dupes'),
      gap_frames: sumOf('gapFrames'),
      gap_messages: sumOf('gapMsgs'),
      subscriber_errors: sumOf('errors'),
      subscriber_fail_reasons: subFail,
      subscribers_closed: closed.length,
      close_codes: closeCodes,
      per_subscriber_min: per.length ? Math.min(...per.map((p) => p.count)) : 0,
      per_subscriber_max: per.length ? Math.max(...per.map((p) => p.count)) : 0,
      drain_s: drainS,
      paused_subscribers: paused,
      latency_ms: { ...lat.ms, max: maxLatUs / 1000, n: lat.n },
      loadgen_cpu_s_total: (cEnd.user + cEnd.system) / 1e6,
      series_ms_delivered_published: series,
    },
  });
}

if (isMainThread) {
  main().then(
    () => process.exit(0),
    (err) => {
      process.stderr.write(`loadgen: ${err.stack ?? err}\n`);
      process.exit(2);
    },
  );
} else if (workerData.role === 'sub') {
  subscriberWorker().catch((err) => { process.stderr.write(`loadgen sub worker: ${err.stack ?? err}\n`); process.exit(2); });
} else {
  publisherWorker().catch((err) => { process.stderr.write(`loadgen publisher: ${err.stack ?? err}\n`); process.exit(2); });
}
