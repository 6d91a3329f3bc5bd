"""An external backend for the tests, in Python as any language would be: `python external_worker.py MODE`.

spec: a native port (consumes params) over ode_ref that speaks the protocol correctly, the stages
of f(0, x) included; with ODEATTN_TEST_RECORD set, it appends every request's JSON to that file.
half: the same in bfloat16 and float16, under the half-precision policy (ode_ref.precision).
planted: the spec with a bug planted at the stage v (every value 1% off), in its outputs and its
stages alike. narrow: the spec, speaking protocol version 2: its hello declares that it runs
layer_norm without BitLinear (NARROW), and it refuses any other config it is sent. The other modes
break the protocol one way each. Every mode but narrow speaks version 1, as a worker written
before version 2 does."""

import json
import os
import sys
import time

import numpy as np

import ode_ref as R
from odeattn.conformance.wire.frames import encode, read_frame

MODE = sys.argv[1]
IN, OUT = sys.stdin.fileno(), sys.stdout.fileno()
HELLO = {"protocol": 1, "name": f"py-{MODE}", "dtypes": ["float32", "float64"],
         "kinds": ["block", "trajectory", "decode", "encoder", "lm", "stages"], "consumes": "params"}
NARROW = {"norm_type": ["layer_norm"], "use_bitnet": [False]}


class VOff(R.SelfAttention):
    """The planted mode's attention: v 1% off after preprocess_qkv."""

    def preprocess_qkv(self, q, k, v, **kw):
        q, k, v = super().preprocess_qkv(q, k, v, **kw)
        return q, k, v * 1.01


ATTENTION = VOff if MODE == "planted" else R.SelfAttention


def send(message, arrays=None):
    os.write(OUT, encode(message, arrays))


def run_half(message, params, x, mask):
    """The block or decode run under the policy in the message's dtype, returned in that dtype."""
    from ode_ref.precision import half_attention, half_block, round_to
    from odeattn.conformance.cases import run_decode

    dtype, like = message["dtype"], x.dtype
    params, x = {k: np.asarray(v, np.float32) for k, v in params.items()}, np.asarray(x, np.float32)
    config = R.ODEConfig.from_any(message["config"])
    if message["kind"] == "decode":
        z = run_decode(config, params, x, mask, message["prompt"], attention=half_attention(config, dtype))
        return {"decode": round_to(z, dtype).astype(like)}
    z1, trajectory = half_block(params, x, config, mask, dtype=dtype, return_trajectory=True)
    return {"trajectory": trajectory.astype(like)} if message["kind"] == "trajectory" else {"z1": z1.astype(like)}


def run(message, arrays):
    params = {k[len("param/"):]: v for k, v in arrays.items() if k.startswith("param/")}
    x, mask = arrays["x"], arrays.get("padding_mask")
    if MODE == "half":
        return run_half(message, params, x, mask)
    if message["kind"] == "encoder":
        return {"z": R.ode_encoder(params, x, R.ODEEncoderConfig.from_any(message["config"]), mask)}
    if message["kind"] == "lm":  # x: the token ids
        dtype = next(iter(params.values())).dtype
        return {"logits": R.lm_logits(params, x, R.LMConfig.from_any(message["config"]), mask, dtype=dtype)}
    config = R.ODEConfig.from_any(message["config"])
    if message["kind"] == "stages":
        from odeattn.conformance.cases.stages import spec_stages
        return {f"stage/{k}": v.astype(x.dtype) for k, v in spec_stages(config, params, x, mask, ATTENTION).items()}
    if message["kind"] == "decode":
        from odeattn.conformance.cases import run_decode
        return {"decode": run_decode(config, params, x, mask, message["prompt"], attention=ATTENTION(config))}
    z1, trajectory = R.ode_block(params, x, config, mask, return_trajectory=True, attention=ATTENTION(config))
    return {"trajectory": trajectory.astype(x.dtype)} if message["kind"] == "trajectory" else {"z1": z1.astype(x.dtype)}


while True:
    try:
        message, arrays = read_frame(IN)
    except EOFError:
        break
    if os.environ.get("ODEATTN_TEST_RECORD"):
        with open(os.environ["ODEATTN_TEST_RECORD"], "a") as f:
            f.write(json.dumps(message) + "\n")
    op = message["op"]
    if op == "exit":
        break
    if op == "hello":
        if MODE == "garbage":
            os.write(OUT, b"starting up...\nready\n")
        elif MODE == "silent":
            time.sleep(60)
        elif MODE == "version9":
            send({**HELLO, "protocol": 9})
        elif MODE == "narrow":
            send({**HELLO, "protocol": 2, "supports": {"config": NARROW}})
        elif MODE == "undeclarable":  # version 2 with a field ODEConfig lacks
            send({**HELLO, "protocol": 2, "supports": {"config": {"kernel": ["tiled"]}}})
        elif MODE == "malformed":
            send({**HELLO, "dtypes": ["float8"]})
        elif MODE == "half":
            send({**HELLO, "dtypes": ["bfloat16", "float16"], "kinds": ["block", "trajectory", "decode"]})
        elif MODE == "oversized":
            os.write(OUT, (1 << 20).to_bytes(4, "little") + (1 << 31).to_bytes(4, "little"))
        else:
            send(HELLO)
        continue
    if MODE == "dies":  # exits halfway through its first reply
        frame = encode({"status": "ran"}, {"z1": arrays["x"]})
        os.write(OUT, frame[:len(frame) // 2])
        os._exit(3)
    if MODE == "refuses" and message["config"].get("use_bitnet"):
        send({"status": "unsupported", "message": "use_bitnet (this port has float projections only)"})
        continue
    if MODE == "narrow" and any(message["config"].get(k, v[0]) not in v for k, v in NARROW.items()):
        send({"status": "unsupported", "message": f"a config outside its declaration: {message['config']}"})
        continue
    send({"status": "ran"}, run(message, arrays))
