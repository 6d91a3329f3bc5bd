// The frames of odeattn's external backend protocol (docs/protocol.md), for a worker on Node.js.
// A frame: an 8-byte header (two little-endian uint32: the JSON part's length, then the
// payload's), the JSON part, then the payload, a safetensors file of the message's arrays.
// An array here is {dtype, shape, data}: dtype a safetensors name (F32, F64, BOOL, I64, U8),
// data a typed array (BigInt64Array for I64, Uint8Array for BOOL and U8).

const TYPED = { F32: Float32Array, F64: Float64Array, I64: BigInt64Array, I32: Int32Array, U8: Uint8Array, BOOL: Uint8Array };

// Reads exactly n bytes from an async byte source; null at a clean end before any byte.
class Reader {
  constructor(stream) { this.it = stream[Symbol.asyncIterator](); this.buf = Buffer.alloc(0); }
  async read(n) {
    while (this.buf.length < n) {
      const { value, done } = await this.it.next();
      if (done) {
        if (this.buf.length === 0) return null;
        throw new Error(`the host closed the stream mid-frame (${this.buf.length} of ${n} bytes)`);
      }
      this.buf = Buffer.concat([this.buf, value]);
    }
    const out = this.buf.subarray(0, n);
    this.buf = this.buf.subarray(n);
    return out;
  }
}

// safetensors: an 8-byte little-endian header length, a JSON header, the tensors' bytes.
export function decodeTensors(bytes) {
  if (bytes.length === 0) return {};
  const n = Number(bytes.readBigUInt64LE(0));
  const header = JSON.parse(bytes.subarray(8, 8 + n).toString('utf8'));
  const base = 8 + n;
  const out = {};
  for (const [name, info] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const Typed = TYPED[info.dtype];
    if (!Typed) throw new Error(`${name}: dtype ${info.dtype} is not read by this worker`);
    const [begin, end] = info.data_offsets;
    const copy = Uint8Array.from(bytes.subarray(base + begin, base + end)); // aligned for any typed array
    out[name] = { dtype: info.dtype, shape: info.shape, data: new Typed(copy.buffer) };
  }
  return out;
}

export function encodeTensors(arrays) {
  const names = Object.keys(arrays).sort();
  if (names.length === 0) return Buffer.alloc(0);
  const header = {};
  let offset = 0;
  for (const name of names) {
    const { dtype, shape, data } = arrays[name];
    header[name] = { dtype, shape, data_offsets: [offset, offset + data.byteLength] };
    offset += data.byteLength;
  }
  let text = JSON.stringify(header);
  text += ' '.repeat((8 - ((8 + Buffer.byteLength(text)) % 8)) % 8); // the data starts 8-byte aligned
  const head = Buffer.alloc(8);
  head.writeBigUInt64LE(BigInt(Buffer.byteLength(text)));
  const parts = [head, Buffer.from(text, 'utf8')];
  for (const name of names) {
    const { data } = arrays[name];
    parts.push(Buffer.from(data.buffer, data.byteOffset, data.byteLength));
  }
  return Buffer.concat(parts);
}

export function encodeFrame(message, arrays = {}) {
  const body = Buffer.from(JSON.stringify(message), 'utf8');
  const payload = encodeTensors(arrays);
  const head = Buffer.alloc(8);
  head.writeUInt32LE(body.length, 0);
  head.writeUInt32LE(payload.length, 4);
  return Buffer.concat([head, body, payload]);
}

// The worker's loop: for each request frame on stdin, handle(message, arrays) returns
// [reply, arrays] (or null for a message with no reply: drop); the reply goes to stdout.
// An exception in handle is the request's {"status": "error"} reply. Logs belong on stderr.
export async function serve(handle) {
  const reader = new Reader(process.stdin);
  for (;;) {
    const head = await reader.read(8);
    if (head === null) return;
    const body = await reader.read(head.readUInt32LE(0));
    const payloadLength = head.readUInt32LE(4);
    const payload = payloadLength ? await reader.read(payloadLength) : Buffer.alloc(0);
    const message = JSON.parse(body.toString('utf8'));
    if (message.op === 'exit') return;
    let reply;
    try {
      reply = await handle(message, decodeTensors(payload));
    } catch (err) {
      reply = [{ status: 'error', message: String(err && err.message ? err.message : err) }, {}];
    }
    if (reply !== null) await write(encodeFrame(reply[0], reply[1] || {}));
  }
}

function write(frame) {
  return new Promise((resolve, reject) => process.stdout.write(frame, (err) => (err ? reject(err) : resolve())));
}
