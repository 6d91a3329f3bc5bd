// An external backend that runs odeattn's exported models in ONNX Runtime's JavaScript builds:
// `node ort.mjs node` (onnxruntime-node, the native library) or `node ort.mjs web`
// (onnxruntime-web's WebAssembly kernels, the ones a browser runs). It consumes "onnx": the host
// exports every case's model and sends it once (load); each run is an infer of a loaded model.
import { serve } from './frames.mjs';

const runtime = process.argv[2];
if (runtime !== 'node' && runtime !== 'web') {
  process.stderr.write(`ort.mjs: expected the runtime 'node' or 'web' as the first argument; got ${runtime}\n`);
  process.exit(2);
}
const ort = runtime === 'web' ? await import('onnxruntime-web') : await import('onnxruntime-node');
const version = ort.env.versions[runtime];
const threads = Number(process.env.ODEATTN_WORKER_THREADS || 0) || undefined;
if (runtime === 'web') ort.env.wasm.numThreads = 1; // one thread: Node has no cross-origin isolation to share memory
const options = runtime === 'web' ? { executionProviders: ['wasm'] } : { executionProviders: ['cpu'], ...(threads && { intraOpNumThreads: threads }) };

const TO_ORT = { F32: 'float32', F64: 'float64', BOOL: 'bool', I64: 'int64', I32: 'int32', U8: 'uint8' };
const FROM_ORT = Object.fromEntries(Object.entries(TO_ORT).map(([k, v]) => [v, k]));
const sessions = new Map();

// The operator a session creation failed on, if ONNX Runtime says it has no kernel for it.
function missingOperator(text) {
  const kernel = /implementation for (\w+)\((\d+)\)/.exec(text); // a known operator without a kernel
  if (kernel) return `${kernel[1]} (opset ${kernel[2]})`;
  const unknown = /([\w.]*):(\w+)\(-?\d+\) is not a registered function\/op/.exec(text); // an operator it does not know
  return unknown ? `${unknown[1] ? unknown[1] + '.' : ''}${unknown[2]}` : null;
}

async function handle(message, arrays) {
  switch (message.op) {
    case 'hello':
      return [{ protocol: 1, name: `onnxruntime-${runtime}`, dtypes: ['float32'], kinds: ['block', 'trajectory', 'decode', 'encoder'],
                consumes: 'onnx', onnx: { opset: 17, form: 'unrolled' }, about: `onnxruntime-${runtime} ${version} on Node.js ${process.version}` }, {}];
    case 'load': {
      try {
        sessions.set(message.model, await ort.InferenceSession.create(arrays.model.data, options));
      } catch (err) {
        const text = String(err && err.message ? err.message : err);
        const op = missingOperator(text);
        if (op) return [{ status: 'unsupported', message: `operator ${op} has no kernel in onnxruntime-${runtime} ${version}` }, {}];
        return [{ status: 'error', message: `onnxruntime-${runtime} ${version} cannot load the model: ${text.split('\n')[0]}` }, {}];
      }
      return [{ status: 'loaded' }, {}];
    }
    case 'infer': {
      const session = sessions.get(message.model);
      if (!session) return [{ status: 'error', message: `no model ${message.model} is loaded` }, {}];
      const feeds = {};
      for (const [name, a] of Object.entries(arrays)) feeds[name] = new ort.Tensor(TO_ORT[a.dtype], a.data, a.shape);
      const results = await session.run(feeds);
      const out = {};
      for (const [name, t] of Object.entries(results)) out[name] = { dtype: FROM_ORT[t.type], shape: t.dims, data: t.data };
      return [{ status: 'ran' }, out];
    }
    case 'drop':
      await sessions.get(message.model)?.release();
      sessions.delete(message.model);
      return null;
    default:
      return [{ status: 'error', message: `unknown op ${JSON.stringify(message.op)}` }, {}];
  }
}

await serve(handle);
