// A native port of the block in plain JavaScript, the external protocol's proof that a backend
// need be neither Python nor ONNX: it consumes "params" (the config and the parameters) and
// computes the spec's block (ode_ref) in float64, rounding its outputs to the case's dtype.
// It implements the layer_norm block without BitLinear or positions, solved by euler or rk4, in
// both modes, with padding; any other config is refused by name ("unsupported").
import { serve } from './frames.mjs';

// Butcher tableaus (ode_ref/tableaus.py): stage times c, stage coefficients a, weights b.
const TABLEAUS = {
  euler: { c: [0], a: [[]], b: [1] },
  rk4: { c: [0, 0.5, 0.5, 1], a: [[], [0.5], [0, 0.5], [0, 0, 1]], b: [1 / 6, 1 / 3, 1 / 3, 1 / 6] },
};
const LAYER_NORM_EPS = 1e-5;
// What it runs, declared in the hello reply of protocol version 2 (the values unsupported() accepts),
// so that the host sends, and the fuzzer draws, nothing else.
const SUPPORTS = { config: { norm_type: ['layer_norm'], ode_solver: Object.keys(TABLEAUS), use_bitnet: [false], positional_encoding: ['none'] } };

// The reason this port does not run config (the stored form: required fields and non-defaults), or null.
export function unsupported(config) {
  for (const [field, value] of Object.entries(config)) {
    switch (field) {
      case 'hidden_size': case 'num_heads': case 'ode_steps': case 'dropout': // dropout: training only
        break;
      case 'mode':
        if (value !== 'encoder' && value !== 'decoder') return `mode ${value}`;
        break;
      case 'ode_solver':
        if (!(value in TABLEAUS)) return `ode_solver ${value} (this port has ${Object.keys(TABLEAUS).join(', ')})`;
        break;
      case 'norm_type':
        if (value !== 'layer_norm') return `norm_type ${value} (this port has layer_norm)`;
        break;
      case 'use_bitnet':
        if (value) return 'use_bitnet (this port has float projections only)';
        break;
      case 'ode_use_pe':
        if (value && (config.positional_encoding ?? 'rope') !== 'none') return `positional_encoding ${config.positional_encoding ?? 'rope'} (this port has none)`;
        break;
      case 'positional_encoding': case 'rope_base': case 'rope_scaling': // read only with ode_use_pe
        break;
      default:
        return `config field ${field} (unknown to this port)`;
    }
  }
  return null;
}

// f(z): the ODE function on z (B, T, D) as a flat Float64Array; mask (B, T) of 0/1 or null.
function odeFunc(z, p, cfg, B, T, mask) {
  const D = cfg.hidden_size, H = cfg.num_heads, d = D / H, scale = d ** -0.5;
  const decoder = cfg.mode === 'decoder';
  const real = (b, t) => (mask ? mask[b * T + t] !== 0 : true);
  // the norm of each token, padded tokens read as 0
  const h = new Float64Array(B * T * D);
  for (let b = 0; b < B; b++) for (let t = 0; t < T; t++) {
    const o = (b * T + t) * D;
    let mean = 0, v = 0;
    for (let i = 0; i < D; i++) mean += real(b, t) ? z[o + i] : 0;
    mean /= D;
    for (let i = 0; i < D; i++) { const c = (real(b, t) ? z[o + i] : 0) - mean; v += c * c; }
    const inv = 1 / Math.sqrt(v / D + LAYER_NORM_EPS);
    for (let i = 0; i < D; i++) h[o + i] = ((real(b, t) ? z[o + i] : 0) - mean) * inv * p.normWeight[i] + p.normBias[i];
  }
  // q, k, v = h W_qkv^T: row c * D + head * d + e of W_qkv
  const qkv = new Float64Array(B * T * 3 * D);
  for (let r = 0; r < B * T; r++) for (let o = 0; o < 3 * D; o++) {
    let s = 0;
    for (let i = 0; i < D; i++) s += h[r * D + i] * p.qkv[o * D + i];
    qkv[r * 3 * D + o] = s;
  }
  const at = (b, t, c, head, e) => qkv[(b * T + t) * 3 * D + c * D + head * d + e];
  const y = new Float64Array(B * T * D);
  const scores = new Float64Array(T);
  for (let b = 0; b < B; b++) for (let head = 0; head < H; head++) for (let i = 0; i < T; i++) {
    if (!real(b, i)) continue; // a padded query's attention output is 0
    let max = -Infinity;
    for (let j = 0; j < T; j++) {
      let s = 0;
      for (let e = 0; e < d; e++) s += at(b, i, 0, head, e) * at(b, j, 1, head, e);
      const visible = real(b, j) && (!decoder || j <= i);
      scores[j] = visible ? s * scale : -Number.MAX_VALUE; // the spec's fill: the most negative finite value
      if (scores[j] > max) max = scores[j];
    }
    let sum = 0;
    for (let j = 0; j < T; j++) { scores[j] = Math.exp(scores[j] - max); sum += scores[j]; }
    for (let e = 0; e < d; e++) {
      let s = 0;
      for (let j = 0; j < T; j++) s += scores[j] * at(b, j, 2, head, e);
      y[(b * T + i) * D + head * d + e] = s / sum;
    }
  }
  // the output projection y W_out^T
  const out = new Float64Array(B * T * D);
  for (let r = 0; r < B * T; r++) for (let o = 0; o < D; o++) {
    let s = 0;
    for (let i = 0; i < D; i++) s += y[r * D + i] * p.out[o * D + i];
    out[r * D + o] = s;
  }
  return out;
}

// y0 + sum_j (h a_j) k_j over the nonzero coefficients, in index order (ode_ref/rk.py).
function combine(y0, h, coeffs, ks) {
  const y = Float64Array.from(y0);
  coeffs.forEach((a, j) => { if (a !== 0) for (let n = 0; n < y.length; n++) y[n] += (h * a) * ks[j][n]; });
  return y;
}

// The states z(0) = x, z(1/steps), ..., z(1).
export function trajectory(x, p, cfg, B, T, mask) {
  const tableau = TABLEAUS[cfg.ode_solver ?? 'rk4'], steps = cfg.ode_steps ?? 2, h = 1 / steps;
  const states = [Float64Array.from(x)];
  for (let step = 0; step < steps; step++) {
    const y0 = states[states.length - 1], ks = [];
    for (let i = 0; i < tableau.c.length; i++) ks.push(odeFunc(combine(y0, h, tableau.a[i], ks), p, cfg, B, T, mask));
    states.push(combine(y0, h, tableau.b, ks));
  }
  return states;
}

const TYPED = { float32: [Float32Array, 'F32'], float64: [Float64Array, 'F64'] };

function handleRun(message, arrays) {
  const cfg = { mode: 'encoder', ...message.config };
  const reason = unsupported(message.config);
  if (reason) return [{ status: 'unsupported', message: `not supported: ${reason}` }, {}];
  const [B, T] = arrays.x.shape;
  const param = (name) => Float64Array.from(arrays[`param/ode_func.${name}`].data);
  const p = { qkv: param('qkv.weight'), out: param('out_proj.weight'), normWeight: param('norm.weight'), normBias: param('norm.bias') };
  const mask = arrays.padding_mask ? arrays.padding_mask.data : null;
  const states = trajectory(Float64Array.from(arrays.x.data), p, cfg, B, T, mask);
  const [Typed, dtype] = TYPED[message.dtype];
  if (message.kind === 'block') return [{ status: 'ran' }, { z1: { dtype, shape: arrays.x.shape, data: Typed.from(states[states.length - 1]) } }];
  const flat = new Typed(states.length * states[0].length);
  states.forEach((s, k) => flat.set(s, k * s.length));
  return [{ status: 'ran' }, { trajectory: { dtype, shape: [states.length, ...arrays.x.shape], data: flat } }];
}

async function handle(message, arrays) {
  if (message.op === 'hello') { // the host's newest version, or 2 if it is newer: version 1 has no supports
    const version = Math.min(message.protocol, 2);
    return [{ protocol: version, name: 'js-native', dtypes: ['float32', 'float64'], kinds: ['block', 'trajectory'], consumes: 'params',
              about: `a plain JavaScript port of the layer_norm block (euler, rk4) on Node.js ${process.version}`,
              ...(version >= 2 && { supports: SUPPORTS }) }, {}];
  }
  if (message.op === 'run') return handleRun(message, arrays);
  return [{ status: 'error', message: `unknown op ${JSON.stringify(message.op)}` }, {}];
}

if (import.meta.url === `file://${process.argv[1]}`) await serve(handle);
