"""A case's kind as one object: what the spec computes, what the golden file stores, what a backend
is asked and what it answers.

A kind is a class here (block, decode, grad, encoder, lm) and an instance in KINDS. Everything that
depends on the kind is a method or an attribute of it: the quantities and their names, the
spec's run and its float32 and half-precision errors, the arrays of the golden file, their size
check and the config's schema, the request's fields and the adapter method that answers it, how
the answer splits into quantities and what a divergence at one means, and the choices a fuzz
draw of it must make. Golden files, the runner, the worker, the fuzzer, the pytest plugin and the
reports ask a case's kind (Case.kind) and never branch on its name; a new kind is one class and
one line of KINDS (docs/development.md shows one added).

A Case is built only by its kind (Kind.case), from inputs: the case table (cases/__init__.py),
a fuzz draw (fuzzing/draw.py), a repro folder and a golden file all go through it.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

import ode_ref as R

from .case import Case, fresh, names_text, numbers
from .decoding import run_decode, split_decoded
from .half import half_errors
from .tolerance import relative_error


class Kind:
    """What a case checks. Subclasses set the attributes and the methods that differ."""

    name = ""
    method: Optional[str] = None  # the optional adapter method it needs (protocol.py); None: every backend runs it
    what = ""  # what that method computes, for the reason a backend without it is not asked
    flag: Optional[str] = None  # the manifest's field that marks it (golden.py); None: the block kind, unmarked
    no_policy: Optional[str] = None  # why the half-precision policy has no meaning on it (half.py); None: it has
    config_type = R.ODEConfig
    declared_support = True  # whether an adapter's declared support (adapters/support.py) covers its configs
    stages = False  # whether f(0, x)'s stage values localise its failures (run_stages)
    restepable = False  # whether a backend that runs another step count is judged at it (cases.at_steps)
    backward = False  # whether it checks a backward pass (the mutation battery's bugs are forward ones)
    inputs: tuple = ()  # its inputs beside x, the mask and the parameters, each (batch, seq, d_model), in Case.inputs
    min_decoded = 0  # the fewest tokens it decodes after its prompt
    # what a fuzz draw of it holds fixed (fuzzing/draw.py): config fields, and the most steps drawn
    fixed_fields: dict = {}
    most_steps = 9  # with a 4-stage solver, 36 evaluations of f: past 16 and 32 cached ones

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__

    def describe(self, case) -> str:
        """What it runs, for a finding: 'a block forward'."""
        raise NotImplementedError

    # the spec

    def param_shapes(self, config) -> dict:
        return R.param_shapes(config)

    def quantity_names(self, config, decoded: int = 0) -> list:
        """The quantities with a stored e32, in the order computed."""
        raise NotImplementedError

    def where(self, case, quantity: str, outputs) -> str:
        """Where a divergence first at quantity lies, for a failure's message (outputs: the
        quantities the backend gave)."""
        return quantity

    def spec(self, config, params, x, padding_mask, *, decoded: int = 0, inputs: Optional[dict] = None) -> dict:
        """The spec's quantities with an e32 (quantity_names'), computed in x's dtype."""
        raise NotImplementedError

    def float32_errors(self, config, params, x, padding_mask, golden: dict, *, decoded: int = 0,
                       inputs: Optional[dict] = None) -> dict:
        """The spec's own float32 error of each quantity, e32 = relative_error(spec32, golden), from
        float64 inputs and the float64 quantities golden: what the generator stores, and what
        loading a team's set recomputes to bound the e32 it stores (golden.py)."""
        inputs32 = {k: v.astype(np.float32) for k, v in (inputs or {}).items()}
        z32 = self.spec(config, params, x.astype(np.float32), padding_mask, decoded=decoded, inputs=inputs32)
        return {q: relative_error(z32[q], golden[q]) for q in self.quantity_names(config, decoded)}

    def half_errors(self, case, golden: dict, dtype: str) -> tuple:
        """(errors, None) or (None, why the case is untestable in dtype): half.half_errors' rules."""
        if self.no_policy is not None:
            return None, self.no_policy
        return half_errors(case.config, case.params, case.x, case.padding_mask, golden, dtype=dtype, decoded=case.decoded)

    def draw_inputs(self, seed: int, shape: tuple) -> dict:
        """Its inputs beside x, drawn from a seed (a grad case's cotangent); none for most kinds."""
        return {}

    def case(self, name, config, params, x, padding_mask, *, decoded: int = 0, inputs: Optional[dict] = None,
             input_seed: int = 0, param_seed: int = 0, trajectories=None) -> Case:
        """The case of these inputs: the spec's float64 outputs and their float32 errors.
        trajectories: the spec's float64 and float32 trajectories of a block case where the
        caller has them (the fair check ran them), not run again."""
        golden = self.spec(config, params, x, padding_mask, decoded=decoded, inputs=inputs)
        e32 = self.float32_errors(config, params, x, padding_mask, golden, decoded=decoded, inputs=inputs)
        return Case(name, config, params, x, padding_mask, None, None, e32, self, input_seed=input_seed,
                    param_seed=param_seed, decoded=decoded, inputs=dict(inputs or {}), **self.stored_fields(golden))

    def stored_fields(self, golden: dict) -> dict:
        """The Case fields that keep the spec's outputs, from spec()'s quantities (Case.outputs)."""
        return {"outputs": dict(golden)}

    def quantities(self, case) -> dict:
        """name -> float64 golden array, in the order computed."""
        return dict(case.outputs)

    def derived_errors(self, case, stored: dict) -> dict:
        """A stored error table (e16, ebf16) with the quantities derived from others (a block's
        step_0 and z1) added."""
        return stored

    def missing_fields(self, case) -> str:
        """The Case fields (or inputs) it needs that case lacks, or ''."""
        if case.outputs is None:
            return "outputs"
        return next((name for name in self.inputs if name not in case.inputs), "")

    # the golden file (golden.py)

    def flags(self, case) -> dict:
        """Its manifest fields: the flag that marks it, absent for a block case."""
        return {self.flag: True}

    def flag_schema(self, size: dict) -> dict:
        """The JSON schema of its flag's value in a manifest entry (size: a size's schema)."""
        return {"const": True}

    def config_schema(self, size: dict) -> dict:
        """The JSON schema of its entry's config: the sizes an allocation reads, each bounded."""
        return {"type": "object", "required": ["hidden_size", "num_heads"],
                "properties": {"hidden_size": size, "num_heads": size, "ode_steps": size}}

    def stored_outputs(self, case) -> dict:
        """The arrays of its golden file besides x, the mask and the parameters: its inputs and outputs."""
        return {**case.inputs, **case.outputs}

    def file_arrays(self, shape: tuple, config) -> dict:
        """name -> shape of the arrays stored_outputs gives, from the entry's shape and config."""
        return {**{name: shape for name in self.inputs}, **self.output_shapes(shape, config)}

    def output_shapes(self, shape: tuple, config) -> dict:
        """name -> shape of its stored outputs."""
        raise NotImplementedError

    def from_file(self, tensors: dict, config, entry: dict) -> dict:
        """The Case fields of its outputs and inputs, from its golden file's arrays."""
        return {"outputs": {q: tensors[q] for q in self.output_shapes(tuple(entry["shape"]), config)},
                "inputs": {name: tensors[name] for name in self.inputs}}

    def check_file(self, tensors: dict) -> Optional[str]:
        """A defect of its file's arrays beyond their names, shapes, dtypes and finiteness, or None."""
        return None

    def check_entry(self, entry: dict, config) -> Optional[tuple]:
        """(manifest field, defect) of the entry's sizes against each other and its e32's names, or
        None. The names are built only once their count agrees: a manifest's sizes may be huge."""
        if entry["shape"][2] != self.width(config):
            return "shape", f"expected {self.width_name} {self.width(config)} last; got {entry['shape']}"
        decoded, stored = entry.get("decoded", 0), entry["e32"]
        count = len(self.quantity_names(config, decoded)) if self.series is None else 1 + self.series_length(config, decoded)
        if len(stored) != count or set(stored) != set(self.quantity_names(config, decoded)):
            if self.series is not None and count > 8:
                first, name = self.series
                wanted = f"{first}, {name}_1, ..., {name}_{count - 1} ({count} quantities)"
            else:
                wanted = names_text(self.quantity_names(config, decoded))
            return "e32", f"expected the quantities {wanted}; got [{names_text(repr(q) for q in sorted(stored))}]"
        return None

    width_name = "d_model"  # the config's name for the last size of x

    def width(self, config) -> int:
        return config.hidden_size

    series: Optional[tuple] = None  # (first, name): quantities first, name_1 .. name_n, n set by series_length

    def series_length(self, config, decoded: int) -> int:
        return 0

    def sizes_text(self, entry: dict, config) -> str:
        """The sizes that set its file's bytes, for a defect."""
        return f"shape {entry['shape']}, ode_steps {config.ode_steps}"

    # the run: the request's fields, the adapter's call, its answer

    def request_fields(self, case) -> dict:
        """Its run request's JSON fields beside op, case, kind, dtype and config (worker.py)."""
        return {}

    def request_arrays(self, case) -> dict:
        """Its inputs beside x, padding_mask and the parameters, as float64 (cast to the dtype on the wire)."""
        return dict(case.inputs)

    def missing(self, adapter) -> Optional[str]:
        """Why the adapter cannot run it at all (it lacks the optional method), or None."""
        if self.method is None or getattr(adapter, self.method, None) is not None:
            return None
        return f"not supported: {self.what} (the backend has no {self.method})"

    def call(self, adapter, config, params, x, padding_mask, dtype, message: dict, arrays: dict) -> dict:
        """The adapter's outputs for a run request, each call on fresh copies of the inputs."""
        raise NotImplementedError

    def reply_values(self, case) -> int:
        """How many numbers a correct reply holds at most: the trajectory's states, f0, x and z1."""
        return case.x.size * (case.config.ode_steps + 3)

    def split_outputs(self, case, outputs: dict) -> dict:
        """A backend's raw outputs as quantity -> array, in the order computed; checked against the
        golden set by the comparison (ValueError for outputs of the wrong form)."""
        return dict(outputs)


class Block(Kind):
    """The block's f(0, x) and its trajectory: z(0) = x, the state after each step, z(1)."""

    name = "block"
    stages = restepable = True

    def describe(self, case) -> str:
        return "a block forward"

    def quantity_names(self, config, decoded: int = 0) -> list:
        return ["f0"] + [f"step_{k}" for k in range(1, config.ode_steps + 1)]

    def where(self, case, quantity: str, outputs) -> str:
        """f0 points at ODEFunc, step k at the solver or at error growth over steps; z1 alone says
        the optional methods would say more."""
        steps = case.config.ode_steps
        if quantity == "f0":
            return "f0 = f(0, x), one evaluation of ODEFunc: the error is in f, not the solver"
        if quantity == "step_0":
            return f"step_0 (t = 0/{steps}: z(0), which is x, the input)"
        if quantity.startswith("step_"):
            return f"{quantity} (t = {int(quantity[5:])}/{steps})"
        if "f0" not in outputs:  # the block alone
            return ("z1 (only z(1) was compared: the backend has no run_func or run_trajectory to show whether f or "
                    "which step diverges first; a stage line, where there is one, places it)")
        return quantity

    def spec(self, config, params, x, padding_mask, *, decoded: int = 0, inputs: Optional[dict] = None,
             trajectory=None) -> dict:
        traj = R.ode_block(params, x, config, padding_mask, return_trajectory=True)[1] if trajectory is None else trajectory
        return {"f0": R.ode_func(params, 0.0, x, config, padding_mask), **{f"step_{k}": traj[k] for k in range(1, len(traj))},
                "trajectory": traj}

    def float32_errors(self, config, params, x, padding_mask, golden: dict, *, decoded: int = 0,
                       inputs: Optional[dict] = None, trajectory32=None) -> dict:
        z32 = self.spec(config, params, x.astype(np.float32), padding_mask, trajectory=trajectory32)
        return {q: relative_error(z32[q], golden[q]) for q in self.quantity_names(config)}

    def case(self, name, config, params, x, padding_mask, *, decoded: int = 0, inputs: Optional[dict] = None,
             input_seed: int = 0, param_seed: int = 0, trajectories=None) -> Case:
        traj, traj32 = trajectories or (None, None)
        golden = self.spec(config, params, x, padding_mask, trajectory=traj)
        e32 = self.float32_errors(config, params, x, padding_mask, golden, trajectory32=traj32)
        return Case(name, config, params, x, padding_mask, golden["f0"], golden["trajectory"], e32, self,
                    input_seed=input_seed, param_seed=param_seed)

    def quantities(self, case) -> dict:
        """step_0 is z(0) (the stored trajectory's first state, which is x), z1 the last step's state."""
        out = {"step_0": case.trajectory[0], "f0": case.f0}
        out.update({f"step_{k}": case.trajectory[k] for k in range(1, len(case.trajectory))})
        out["z1"] = case.z1
        return out

    def derived_errors(self, case, stored: dict) -> dict:
        return {**stored, "step_0": 0.0, "z1": stored[f"step_{case.config.ode_steps}"]}

    def missing_fields(self, case) -> str:
        return "trajectory" if case.trajectory is None else ""

    def flags(self, case) -> dict:
        return {}

    def stored_outputs(self, case) -> dict:
        return {"f0": case.f0, "trajectory": case.trajectory}

    def output_shapes(self, shape: tuple, config) -> dict:
        return {"f0": shape, "trajectory": (config.ode_steps + 1, *shape)}

    def from_file(self, tensors: dict, config, entry: dict) -> dict:
        return {"f0": tensors["f0"], "trajectory": tensors["trajectory"]}

    def check_file(self, tensors: dict) -> Optional[str]:
        """A trajectory's first state is x, bit for bit (z(0) = x, which the runner checks)."""
        if np.array_equal(tensors["trajectory"][0], tensors["x"]):
            return None
        at = np.argwhere(tensors["trajectory"][0] != tensors["x"])[0]
        return f"array 'trajectory': expected its first state z(0) to be 'x' bit for bit; they differ at {at.tolist()}"

    series = ("f0", "step")

    def series_length(self, config, decoded: int) -> int:
        return config.ode_steps

    def call(self, adapter, config, params, x, padding_mask, dtype, message: dict, arrays: dict) -> dict:
        """f0 and the trajectory where the adapter provides them (an attribute set to None counts as
        absent), else z1."""
        out = {}
        if getattr(adapter, "run_func", None) is not None:
            p, xx, m = fresh(params, x, padding_mask)
            out["f0"] = numbers("run_func", adapter.run_func(config, p, 0.0, xx, m, dtype))
        if getattr(adapter, "run_trajectory", None) is not None:
            out["trajectory"] = numbers("run_trajectory", adapter.run_trajectory(config, *fresh(params, x, padding_mask), dtype))
        else:
            out["z1"] = numbers("run_block", adapter.run_block(config, *fresh(params, x, padding_mask), dtype))
        return out

    def split_outputs(self, case, outputs: dict) -> dict:
        """f0, each state of the trajectory (the first too: z(0) is x, and a wrong one fails) and z1;
        ValueError for a trajectory of the wrong length."""
        out = {}
        traj = None
        if "trajectory" in outputs:
            traj = np.asarray(outputs["trajectory"])
            if traj.shape[:1] != (case.config.ode_steps + 1,):
                raise ValueError(f"run_trajectory: expected {case.config.ode_steps + 1} states; got shape {traj.shape}")
            out["step_0"] = traj[0]
        if "f0" in outputs:
            out["f0"] = outputs["f0"]
        if traj is not None:
            out.update({f"step_{k}": traj[k] for k in range(1, len(traj))})
            out["z1"] = traj[-1]
        elif "z1" in outputs:
            out["z1"] = outputs["z1"]
        return out


class Decode(Kind):
    """Cached decoding: a prefill of the prompt, then its last `decoded` tokens one by one."""

    name, method, flag = "decode", "run_decode", "decoded"
    what = "cached decoding"
    min_decoded = 1
    fixed_fields = {"mode": "decoder", "ssmax_length": "visible"}  # decoding refuses the seed's padded SSMax rule

    def describe(self, case) -> str:
        return f"cached decoding, {case.decoded} tokens after a prompt of {case.prompt}"

    def quantity_names(self, config, decoded: int = 0) -> list:
        return ["prefill"] + [f"decode_{j}" for j in range(1, decoded + 1)]

    def where(self, case, quantity: str, outputs) -> str:
        if quantity.startswith("decode_"):
            return f"{quantity} (token {case.prompt + int(quantity[7:]) - 1}, decoded with the cache)"
        return quantity

    def spec(self, config, params, x, padding_mask, *, decoded: int = 0, inputs: Optional[dict] = None) -> dict:
        prompt = x.shape[1] - decoded
        return split_decoded(run_decode(config, params, x, padding_mask, prompt), prompt)

    def stored_fields(self, golden: dict) -> dict:
        return {"decode": np.concatenate(list(golden.values()), axis=1)}

    def quantities(self, case) -> dict:
        return split_decoded(case.decode, case.prompt)

    def missing_fields(self, case) -> str:
        return "decode" if case.decode is None else ""

    def flags(self, case) -> dict:
        return {"decoded": case.decoded}

    def flag_schema(self, size: dict) -> dict:
        return size  # the tokens decoded after the prompt

    def stored_outputs(self, case) -> dict:
        return {"decode": case.decode}

    def output_shapes(self, shape: tuple, config) -> dict:
        return {"decode": shape}

    def from_file(self, tensors: dict, config, entry: dict) -> dict:
        return {"decode": tensors["decode"], "decoded": entry["decoded"]}

    def check_entry(self, entry: dict, config) -> Optional[tuple]:
        shape, decoded = entry["shape"], entry["decoded"]
        if shape[2] == config.hidden_size and (decoded >= shape[1] or config.mode != "decoder"):
            return "decoded", (f"expected fewer than seq = {shape[1]} tokens of a decoder-mode config; "
                               f"got {decoded} ({config.mode})")
        return super().check_entry(entry, config)

    series = ("prefill", "decode")

    def series_length(self, config, decoded: int) -> int:
        return decoded

    def sizes_text(self, entry: dict, config) -> str:
        return f"{super().sizes_text(entry, config)}, decoded {entry['decoded']}"

    def request_fields(self, case) -> dict:
        return {"prompt": case.prompt}

    def call(self, adapter, config, params, x, padding_mask, dtype, message: dict, arrays: dict) -> dict:
        p, xx, m = fresh(params, x, padding_mask)
        return {"decode": numbers("run_decode", adapter.run_decode(config, p, xx, m, message["prompt"], dtype))}

    def split_outputs(self, case, outputs: dict) -> dict:
        z = np.asarray(outputs["decode"])
        if z.shape != case.x.shape:
            raise ValueError(f"run_decode: expected shape {case.x.shape} (the prompt's z, then each token's); got {z.shape}")
        return split_decoded(z, case.prompt)


class Grad(Kind):
    """The block's backward pass for a seeded cotangent z1_bar: x_bar and grad.<parameter>."""

    name, method, flag = "grad", "run_vjp", "vjp"
    what = "gradients"
    backward = True
    inputs = ("z1_bar",)  # the cotangent of z(1)
    no_policy = "a grad case: the half-precision policy covers the block's forward and its cached decoding, not the backward pass"
    most_steps = 2  # each step is a backward pass more (the spec's is 4 to 5 times a forward's), and a JAX port compiles each count

    def describe(self, case) -> str:
        return "the backward pass"

    def quantity_names(self, config, decoded: int = 0) -> list:
        return ["x_bar"] + [f"grad.{name}" for name in R.param_shapes(config)]

    def where(self, case, quantity: str, outputs) -> str:
        return f"{quantity} (the gradient of the parameter {quantity[5:]})" if quantity.startswith("grad.") else quantity

    def spec(self, config, params, x, padding_mask, *, decoded: int = 0, inputs: Optional[dict] = None) -> dict:
        """x_bar, then grad.<parameter> in parameter order (the parameters cast to x's dtype, as a
        backend receives them)."""
        params = {k: np.asarray(v, dtype=x.dtype) for k, v in params.items()}
        x_bar, params_bar = R.ode_block_vjp(params, x, config, inputs["z1_bar"], padding_mask)
        return {"x_bar": x_bar, **{f"grad.{name}": params_bar[name] for name in R.param_shapes(config)}}

    def draw_inputs(self, seed: int, shape: tuple) -> dict:
        return {"z1_bar": np.random.default_rng(seed).normal(size=shape)}

    def output_shapes(self, shape: tuple, config) -> dict:
        return {"x_bar": shape, **{f"grad.{k}": s for k, s in R.param_shapes(config).items()}}

    def call(self, adapter, config, params, x, padding_mask, dtype, message: dict, arrays: dict) -> dict:
        x_bar, params_bar = adapter.run_vjp(config, *fresh(params, x, padding_mask), arrays["z1_bar"].copy(), dtype)
        if not isinstance(params_bar, dict) or set(params_bar) != set(params):
            got = sorted(params_bar) if isinstance(params_bar, dict) else type(params_bar).__name__
            raise ValueError(f"run_vjp: expected (x_bar, a dict with every parameter name {sorted(params)}); got {got}")
        return {"x_bar": numbers("run_vjp: x_bar", x_bar),
                **{f"grad.{k}": numbers(f"run_vjp: grad.{k}", params_bar[k]) for k in params}}

    def reply_values(self, case) -> int:
        return super().reply_values(case) + sum(p.size for p in case.params.values())  # every parameter's gradient


class Encoder(Kind):
    """The ODE Transformer encoder stack's output z (encoder_cases.py); its config an ODEEncoderConfig."""

    name, method, flag = "encoder", "run_encoder", "encoder"
    what = "the encoder stack"
    no_policy = "an encoder case: the half-precision policy covers the attention block, not the encoder layer"
    config_type = R.ODEEncoderConfig
    declared_support = False  # support.py declares block configs: an encoder config is asked of supports() alone
    width_name = "encoder_embed_dim"

    def describe(self, case) -> str:
        return "the encoder stack"

    def param_shapes(self, config) -> dict:
        return R.encoder_param_shapes(config)

    def quantity_names(self, config, decoded: int = 0) -> list:
        return ["z"]

    def where(self, case, quantity: str, outputs) -> str:
        return f"{quantity} (the encoder stack's output)"

    def spec(self, config, params, x, padding_mask, *, decoded: int = 0, inputs: Optional[dict] = None) -> dict:
        return {"z": R.ode_encoder(params, x, config, padding_mask)}

    def config_schema(self, size: dict) -> dict:
        sizes = ("encoder_embed_dim", "encoder_attention_heads", "encoder_ffn_embed_dim", "encoder_layers")
        return {"type": "object", "required": list(sizes[:3]), "properties": {k: size for k in sizes}}

    def width(self, config) -> int:
        return config.encoder_embed_dim

    def output_shapes(self, shape: tuple, config) -> dict:
        return {"z": shape}

    def sizes_text(self, entry: dict, config) -> str:
        return f"shape {entry['shape']}, encoder_layers {config.encoder_layers}"

    def call(self, adapter, config, params, x, padding_mask, dtype, message: dict, arrays: dict) -> dict:
        return {"z": numbers("run_encoder", adapter.run_encoder(config, *fresh(params, x, padding_mask), dtype))}

    def reply_values(self, case) -> int:
        return case.x.size * 4  # z, with the block's allowance for f0, x and z1


class LanguageModel(Kind):
    """The language model's logits at every position (ode_ref.lm_logits, lm_cases.py); its config an
    LMConfig. x holds the token ids, one per slot as a float64 of shape (batch, seq, 1) (exact in
    float32 below 2**24), so that it travels as every kind's x does."""

    name, method, flag = "lm", "run_lm", "lm"
    what = "the language model"
    no_policy = "an LM case: the half-precision policy covers the attention block, not the language model"
    config_type = R.LMConfig
    declared_support = False  # support.py declares block configs: an LM config is asked of supports() alone
    width_name = "token id channel"

    def describe(self, case) -> str:
        return f"the language model ({case.config.num_layers} {case.config.block} blocks)"

    def param_shapes(self, config) -> dict:
        return R.lm_param_shapes(config)

    def quantity_names(self, config, decoded: int = 0) -> list:
        return ["logits"]

    def where(self, case, quantity: str, outputs) -> str:
        return f"{quantity} (every position's, after the last block, the norm and lm_head)"

    def spec(self, config, params, x, padding_mask, *, decoded: int = 0, inputs: Optional[dict] = None) -> dict:
        return {"logits": R.lm_logits(params, token_ids(x), config, padding_mask, dtype=x.dtype)}

    def config_schema(self, size: dict) -> dict:
        sizes = ("vocab_size", "num_layers", "hidden_size", "num_heads", "ode_steps")
        return {"type": "object", "required": list(sizes[:4]), "properties": {k: size for k in sizes}}

    def width(self, config) -> int:
        return 1

    def output_shapes(self, shape: tuple, config) -> dict:
        return {"logits": (*shape[:2], config.vocab_size)}

    def check_file(self, tensors: dict) -> Optional[str]:
        """x holds whole token ids (each below vocab_size: the spec's lm_logits checks that when it runs)."""
        x = tensors["x"]
        bad = np.argwhere((x != np.rint(x)) | (x < 0))
        if not len(bad):
            return None
        return f"array 'x': expected the token ids, whole numbers >= 0; got {x[tuple(bad[0])]!r} at {bad[0].tolist()}"

    def sizes_text(self, entry: dict, config) -> str:
        return f"shape {entry['shape']}, vocab_size {config.vocab_size}, num_layers {config.num_layers}"

    def call(self, adapter, config, params, x, padding_mask, dtype, message: dict, arrays: dict) -> dict:
        p, xx, m = fresh(params, x, padding_mask)
        return {"logits": numbers("run_lm", adapter.run_lm(config, p, token_ids(xx), m, dtype))}

    def reply_values(self, case) -> int:
        return case.x.size * (case.config.vocab_size + 1)  # the logits, with x


def token_ids(x) -> np.ndarray:
    """An LM case's x (batch, seq, 1) as the int64 token ids (batch, seq) a run_lm takes."""
    return np.rint(np.asarray(x)[..., 0]).astype(np.int64)


BLOCK, DECODE, GRAD, ENCODER, LM = Block(), Decode(), Grad(), Encoder(), LanguageModel()
KINDS = {k.name: k for k in (BLOCK, DECODE, GRAD, ENCODER, LM)}  # name -> kind, in the order reports list them


def kind_of(kind, field: str = "kind", kinds=None) -> Kind:
    """A kind of kinds (default: KINDS' values) from itself or its name; ValueError naming the field,
    the kinds allowed and what it got otherwise."""
    allowed = {k.name: k for k in (KINDS.values() if kinds is None else kinds)}
    if isinstance(kind, Kind) and allowed.get(kind.name) is kind:
        return kind
    if isinstance(kind, str) and kind in allowed:
        return allowed[kind]
    raise ValueError(f"{field}: expected one of {', '.join(allowed)}; got {kind!r}")


def kind_of_entry(entry: dict) -> Kind:
    """A golden manifest entry's kind, from the flag that marks it (none: a block case); ValueError
    for an entry with two kinds' flags (the manifest check names them)."""
    marked = [k for k in KINDS.values() if k.flag is not None and entry.get(k.flag)]
    if len(marked) > 1:
        raise ValueError(f"expected at most one of the flags {', '.join(k.flag for k in KINDS.values() if k.flag)}; "
                         f"got {', '.join(k.flag for k in marked)}")
    return marked[0] if marked else BLOCK
