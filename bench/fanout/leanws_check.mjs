// Self-check of leanws.mjs against a raw loopback server: `node leanws_check.mjs`.
// The server answers the handshake, then sends small frames, a frame of 1 MiB, a
// fragmented message, a ping and a close, with its writes cut at random sizes (down to
// one byte), and checks the client's pong, echo and close; once with 'message' events and
// once with the `onframe` hook the load generator uses. Exits 0 when all arrived intact.

import net from 'node:net';
import { createHash } from 'node:crypto';
import assert from 'node:assert/strict';
import { LeanWebSocket } from './leanws.mjs';

function frame(opcode, payload, fin = true) {
  const n = payload.length;
  const head = n < 126 ? Buffer.from([0, n]) : n < 65536 ? Buffer.from([0, 126, n >> 8, n & 255]) : Buffer.alloc(10);
  if (n >= 65536) {
    head[1] = 127;
    head.writeUInt32BE(n >>> 0, 6);
  }
  head[0] = (fin ? 0x80 : 0) | opcode;
  return Buffer.concat([head, payload]);
}

function unmaskedClientFrame(buf) {
  const n = buf[1] & 0x7f;
  assert.ok(buf[1] & 0x80, 'client frames are masked');
  const key = buf.subarray(2, 6);
  const body = Buffer.from(buf.subarray(6, 6 + n));
  for (let i = 0; i < body.length; i++) body[i] ^= key[i & 3];
  return { opcode: buf[0] & 0x0f, body, size: 6 + n };
}

const small = Array.from({ length: 2000 }, (_, i) => Buffer.from(`{"seq":${i}}`));
const big = Buffer.alloc(1 << 20, 0x61);
const parts = [Buffer.from('frag'), Buffer.from('ment'), Buffer.from('ed')];
const stream = Buffer.concat([
  ...small.map((p) => frame(1, p)),
  frame(2, big),
  frame(1, parts[0], false),
  frame(9, Buffer.from('are you there')),
  frame(0, parts[1], false),
  frame(0, parts[2], true),
]);

function check(useOnframe) {
  let done;
  const finished = new Promise((resolve) => { done = resolve; });
  const server = net.createServer((sock) => {
    let head = Buffer.alloc(0);
    let upgraded = false;
    let fromClient = Buffer.alloc(0);
    sock.on('data', (chunk) => {
      if (!upgraded) {
        head = Buffer.concat([head, chunk]);
        const end = head.indexOf('\r\n\r\n');
        if (end < 0) return;
        upgraded = true;
        const key = /sec-websocket-key: (.*)\r\n/i.exec(head.toString())[1];
        const accept = createHash('sha1').update(`${key}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`).digest('base64');
        sock.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\nSec-WebSocket-Protocol: check.v1\r\n\r\n`);
        let pos = 0;
        const pump = () => {
          while (pos < stream.length) {
            const cut = Math.random() < 0.2 ? 1 + Math.floor(Math.random() * 3) : 1 + Math.floor(Math.random() * 70000);
            const piece = stream.subarray(pos, pos + cut);
            pos += piece.length;
            if (!sock.write(piece)) { sock.once('drain', pump); return; }
          }
        };
        pump();
        return;
      }
      fromClient = Buffer.concat([fromClient, chunk]);
      while (fromClient.length >= 6) {
        const f = unmaskedClientFrame(fromClient);
        fromClient = fromClient.subarray(f.size);
        if (f.opcode === 10) server.pong = f.body.toString();
        if (f.opcode === 1 && f.body.toString() === 'done') sock.write(frame(8, Buffer.from([0x0f, 0xa0, 0x62, 0x79, 0x65])));
        if (f.opcode === 8) server.closeCode = f.body.readUInt16BE(0);
      }
    });
  });

  server.listen(0, '127.0.0.1', () => {
    const got = [];
    const ws = new LeanWebSocket(`ws://127.0.0.1:${server.address().port}/x?y=1`, ['check.v1']);
    const timer = setTimeout(() => { console.error('timeout'); process.exit(1); }, 20000);
    ws.on('error', (err) => { console.error(err); process.exit(1); });
    const receive = (data, isBinary) => {
      got.push({ data: Buffer.from(data), isBinary });
      if (got.length === small.length + 2) ws.send('done');
    };
    ws.on('message', receive);
    if (useOnframe) ws.onframe = (buf, start, end, isBinary) => receive(buf.subarray(start, end), isBinary);
    ws.on('close', (code, reason) => {
      clearTimeout(timer);
      assert.equal(got.length, small.length + 2);
      small.forEach((p, i) => assert.deepEqual([got[i].data, got[i].isBinary], [p, false]));
      assert.deepEqual([got[small.length].data.equals(big), got[small.length].isBinary], [true, true]);
      assert.equal(got[small.length + 1].data.toString(), 'fragmented');
      assert.deepEqual([code, reason.toString()], [4000, 'bye']);
      setTimeout(() => {
        assert.deepEqual([server.pong, server.closeCode], ['are you there', 4000]);
        const how = useOnframe ? 'onframe' : 'events';
        console.log(`leanws ok (${how}): ${got.length} messages, 1 MiB frame, fragments, ping, close`);
        server.close();
        done();
      }, 100);
    });
  });
  return finished;
}

await check(false);
await check(true);
process.exit(0);
