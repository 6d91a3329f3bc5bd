// The golden set checked from JavaScript's own test runner, without odeattn: `node --test` here.
// It reads the manifest and the safetensors files (docs/protocol.md describes both field by field),
// runs the plain JavaScript port (native.mjs) on every block case it supports, in float64 and in
// float32, and holds each step's state to the suite's tolerance (conformance/cases/tolerance.py).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { decodeTensors } from './frames.mjs';
import { trajectory, unsupported } from './native.mjs';

const GOLDEN = process.env.ODEATTN_GOLDEN || path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'golden');
const manifest = JSON.parse(fs.readFileSync(path.join(GOLDEN, 'manifest.json'), 'utf8'));
const U = { float64: 2 ** -53, float32: 2 ** -24 };

// SAFETY * max(e32 * u / u32, FLOOR_ULPS * u): the spec's own float32 error rescaled to u.
const tolerance = (e32, dtype) => 32 * Math.max(e32 * U[dtype] / U.float32, U[dtype]);

// max|got - want| / max|want|
function relativeError(got, want) {
  let err = 0, scale = 0;
  for (let i = 0; i < want.length; i++) {
    err = Math.max(err, Math.abs(got[i] - want[i]));
    scale = Math.max(scale, Math.abs(want[i]));
  }
  return scale > 0 ? err / scale : err;
}

const blocks = manifest.cases.filter((c) => !c.decoded && !c.vjp && unsupported(c.config) === null);

test('the golden set holds block cases this port runs', () => assert.ok(blocks.length > 0));

for (const entry of blocks) {
  for (const dtype of ['float64', 'float32']) {
    test(`${entry.name} ${dtype}`, () => {
      const t = decodeTensors(fs.readFileSync(path.join(GOLDEN, entry.file)));
      const round = dtype === 'float32' ? (a) => Float64Array.from(a, Math.fround) : (a) => Float64Array.from(a);
      const param = (name) => round(t[`ode_func.${name}`].data);
      const p = { qkv: param('qkv.weight'), out: param('out_proj.weight'), normWeight: param('norm.weight'), normBias: param('norm.bias') };
      const [B, T] = entry.shape;
      const states = trajectory(round(t.x.data), p, { mode: 'encoder', ...entry.config }, B, T, entry.padding ? t.padding_mask.data : null);
      const size = states[0].length;
      for (let k = 1; k < states.length; k++) {
        const want = t.trajectory.data.subarray(k * size, (k + 1) * size);
        const got = dtype === 'float32' ? Float64Array.from(states[k], Math.fround) : states[k];
        const err = relativeError(got, want), tol = tolerance(entry.e32[`step_${k}`], dtype);
        assert.ok(err <= tol, `step_${k}: error ${err.toExponential(2)} over the tolerance ${tol.toExponential(2)}`);
      }
    });
  }
}
