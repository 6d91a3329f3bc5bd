"""The language model's side of `odeattn init --lm DIR` and `odeattn export --genai DIR`: an
LMConfig and its weights (ode_ref.lm) in, a folder ONNX Runtime GenAI generates from out
(export.genai). Every refusal is one line naming the field, before any work."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import ode_ref as R
from ode_ref.lm import LMConfig, check_lm_params
from ode_ref.files import write_text, writing_set
from odeattn.commands.args import UsageError, check_output_path, read_json, require, user_input

LM_FILES = ("config.json", "weights.safetensors")


def load_lm(config_path, weights_path, check=None):
    """(config, params) from --config (an LMConfig's fields; then check(config), whose message names
    the field) and --weights (the model's parameter names); UsageError naming the option otherwise."""
    from odeattn.export.weights import check_finite

    with user_input("--config"):
        config = LMConfig.from_any(read_json("--config", config_path))
    if check is not None:
        with user_input():
            check(config)
    with user_input("--weights"):
        params = R.load_params(weights_path)
        check_lm_params(params, config)
        check_finite(params)
    return config, params


# `odeattn export`'s options that shape a block model, none of which the GenAI folder takes: (flag, dest, default)
BLOCK_OPTIONS = (("-o", "output", None), ("--opset", "opset", None), ("--no-padding-mask", "no_padding_mask", False),
                 ("--route", "route", "direct"), ("--bitlinear", "bitlinear", "float"), ("--steps-input", "steps_input", False),
                 ("--dtype", "dtype", "float32"), ("--keep-io-types", "keep_io_types", False),
                 ("--quantize", "quantize", None), ("--optimize", "optimize", False), ("--functions", "functions", False))


def export_genai(args) -> int:
    """`odeattn export --genai DIR --config C --weights W`: DIR/model.onnx and DIR/genai_config.json."""
    given = [flag for flag, name, default in BLOCK_OPTIONS if getattr(args, name) != default]
    if given:
        raise UsageError(f"--genai: writes its folder's model.onnx and genai_config.json (float32), "
                         f"which no block-model option shapes; got {', '.join(given)}")
    require("onnx")
    from odeattn.export.genai import CONFIG_FILE, MODEL_FILE, cache_layers, check_genai_config, write_genai

    config, params = load_lm(args.config, args.weights, check_genai_config)
    folder = Path(args.genai)
    with user_input():
        if folder.exists() and not folder.is_dir():
            raise UsageError(f"--genai: expected a folder; got the file {str(folder)!r}")
        try:  # the folder made (and its files tried) before the model is built
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UsageError(f"--genai: cannot make the folder {str(folder)!r} ({err.strerror or err})") from None
        for name in (MODEL_FILE, CONFIG_FILE):  # an existing one needs --force; neither may be an input
            check_output_path("--genai", folder / name, Path(name).suffix, force=args.force,
                              others={"--config": args.config, "--weights": args.weights})
    model, gen = write_genai(config, params, folder, shared_buffer=args.shared_buffer)
    form = "opset 24, shared-buffer form" if args.shared_buffer else "opset 17, concat form"
    print(f"wrote {model}: {model.stat().st_size / 1e3:.1f} kB, {form}, {cache_layers(config)} cache layers "
          f"({config.num_layers} blocks x {cache_layers(config) // config.num_layers} evaluations of f)")
    print(f"wrote {gen}: greedy search, max_length {json.loads(gen.read_text())['search']['max_length']}, "
          f"past_present_share_buffer {str(args.shared_buffer).lower()}")
    print(f"next: onnxruntime_genai.Model({str(folder)!r}) generates from it (docs/generation.md)")
    return 0


def check_lm_memory(config) -> int:
    """The bytes init --lm allocates (ode_ref.memory's estimate, refused past the limit before
    anything is drawn), as init's check_memory_of counts a block's: the parameters drawn in
    float64, their float32 copy and its serialised bytes. The count is one block's times
    num_layers, so a vast --num-layers is sized without listing its names."""
    import math

    from ode_ref.lm import block_prefix, lm_param_shapes
    from ode_ref.memory import Need, check_memory

    one = lm_param_shapes(LMConfig.from_any({**config.to_dict(), "num_layers": 1}))
    block = sum(math.prod(s) for k, s in one.items() if k.startswith(block_prefix(0)))
    count = config.num_layers * block + sum(math.prod(s) for k, s in one.items() if not k.startswith(block_prefix(0)))
    return check_memory(f"--vocab-size {config.vocab_size}, --num-layers {config.num_layers}, --hidden-size "
                        f"{config.hidden_size}", Need("the parameters drawn", 1, (count,), "float64", 8),
                        Need("the parameters in float32 and serialised", 2, (count,), "float32", 4))


def init_lm(args, check_paths) -> int:
    """`odeattn init DIR --lm`: DIR/config.json (an LMConfig, decoder mode) and DIR/weights.safetensors
    (init_lm_params with --seed, float32)."""
    import numpy as np

    require("safetensors")
    with user_input():
        config = LMConfig(vocab_size=args.vocab_size, num_layers=args.num_layers, hidden_size=args.hidden_size,
                          num_heads=args.num_heads, ode_solver=args.solver, ode_steps=args.steps,
                          norm_type=args.norm_type, use_bitnet=args.bitnet)
        check_lm_memory(config)
        out = check_paths(args.dir, args.force, LM_FILES)
    params = R.init_lm_params(config, seed=args.seed, dtype=np.float32)
    with writing_set(args.dir) as into:  # a new DIR appears with both files or not at all
        write_text(into / "config.json", json.dumps(config.to_dict(), indent=1) + "\n")
        R.save_params(params, into / "weights.safetensors")
    print(f"wrote {out['config.json']}: vocab_size={config.vocab_size}, num_layers={config.num_layers}, "
          f"hidden_size={config.hidden_size}, num_heads={config.num_heads}, ode_solver={config.ode_solver!r}, "
          f"ode_steps={config.ode_steps}, mode='decoder'")
    print(f"wrote {out['weights.safetensors']}: init_lm_params(seed={args.seed}), {len(params)} arrays, "
          f"{sum(v.size for v in params.values()):,} parameters, float32")
    q = {name: shlex.quote(str(path)) for name, path in out.items()}
    print(f"next:\n  odeattn export --config {q['config.json']} --weights {q['weights.safetensors']} "
          f"--genai {shlex.quote(str(args.dir / 'genai'))}")
    return 0
