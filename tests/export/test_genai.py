"""ONNX Runtime GenAI generating from an exported folder (export.genai) equals the spec's greedy
decoding token for token, its logits within the derived float32 tolerance (conformance.genai);
the spec's LM decodes with the cache as it computes without one; `odeattn init --lm` and
`odeattn export --genai` write the folder, and refuse what no cache reproduces in one line."""

import json

import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime_genai")

import onnx

import ode_ref as R
from odeattn.cli import main
from odeattn.conformance.genai import check_genai, genai_greedy, padded, unfair
from odeattn.export.genai import cache_layers, genai_config, write_genai

PROMPTS = [[3, 4, 5, 6, 7], [8, 9, 10], [11]]  # different lengths: GenAI pads them (on the right)
NEW_TOKENS = 64
MIN_DISTINCT = 8  # tokens in each row's 64 at least: the token comparison is not of a repeated constant


def lm(**kw):
    # vocabulary 256 and width 32: a random model of vocabulary 32 and width 16 settles on one
    # repeated token within a few steps, which a token comparison cannot tell from another
    return R.LMConfig(**{**dict(vocab_size=256, num_layers=2, hidden_size=32, num_heads=2, ode_steps=1), **kw})


CONFIGS = {
    "rk4-rope": lm(ode_solver="rk4", ode_use_pe=True, positional_encoding="rope"),
    "euler-alibi": lm(ode_solver="euler", ode_steps=2, ode_use_pe=True, positional_encoding="alibi"),
    "rk2_gated-bitlinear": lm(ode_solver="rk2_gated", use_bitnet=True, ode_use_pe=True, positional_encoding="rope"),
    "rk2_gated-alibi-rms_norm": lm(ode_solver="rk2_gated", norm_type="rms_norm", ode_use_pe=True, positional_encoding="alibi"),
    "layer-euler": lm(block="layer", ode_solver="euler", ffn_dim=24),  # the encoder layer in decoder mode
    "layer-rk2_gated": lm(block="layer", ode_solver="rk2_gated", ffn_dim=24),
    "layer-rk4": lm(block="layer", ode_solver="rk4", ffn_dim=24),
}


def fair_params(cfg) -> dict:
    """init_lm_params with the first seed whose greedy decoding of PROMPTS is varied (MIN_DISTINCT
    tokens in each row) and a fair test of the tokens (conformance.genai.unfair: every step's top
    logit leads by more than twice the tolerance), as conformance/cases/fair.py redraws a case's input."""
    ids, mask = padded(PROMPTS, 0)
    for seed in range(20):
        params = R.init_lm_params(cfg, seed=seed)
        tokens, _ = R.lm_greedy(params, ids, cfg, NEW_TOKENS, mask)
        if min(len(set(row)) for row in tokens) >= MIN_DISTINCT and unfair(cfg, params, PROMPTS, NEW_TOKENS) is None:
            return params
    raise AssertionError(f"no seed of 20 gives a varied and fair decoding for {cfg}")


def unused_token(params, cfg) -> int:
    """A token id the spec's greedy decoding of PROMPTS never yields: GenAI ends a row at its
    eos_token_id, so this is the eos that lets every row run NEW_TOKENS tokens."""
    ids, mask = padded(PROMPTS, 0)
    tokens, _ = R.lm_greedy(params, ids, cfg, NEW_TOKENS, mask)
    return next(i for i in range(1, cfg.vocab_size) if i not in tokens)


@pytest.mark.parametrize("name", CONFIGS)
def test_genai_generation_equals_the_spec_token_for_token(name, tmp_path):
    """A batch of three prompts of 5, 3 and 1 tokens, 64 new tokens each by GenAI's greedy search
    from the exported folder: the spec's tokens exactly, and at every step logits within
    tolerance(e32, float32) of the spec's float64 ones (e32: the spec's own float32 error on them)."""
    cfg = CONFIGS[name]
    params = fair_params(cfg)
    write_genai(cfg, params, tmp_path, eos_token_id=unused_token(params, cfg))
    report = check_genai(tmp_path, cfg, params, PROMPTS, NEW_TOKENS)
    assert report.tokens_equal, report
    assert report.error <= report.tolerance, report


@pytest.mark.parametrize("name", ["rk4-rope", "rk2_gated-bitlinear", "euler-alibi", "layer-rk2_gated", "layer-rk4"])
def test_shared_buffer_form_generates_the_concat_forms_tokens(name, tmp_path):
    """past_present_share_buffer (TensorScatter writing GenAI's max_length buffers in place; block
    'attention' attends with Attention-24, block 'layer' with the spec's own attention over the
    buffer): the spec's tokens, the same as the concat form's, logits within the tolerance; each
    present output is the TensorScatter node's own (no copy between it and the buffer)."""
    cfg = CONFIGS[name]
    params = fair_params(cfg)
    eos = unused_token(params, cfg)
    reports = []
    for shared in (False, True):
        write_genai(cfg, params, tmp_path / str(shared), eos_token_id=eos, shared_buffer=shared, max_length=5 + NEW_TOKENS)
        reports.append(check_genai(tmp_path / str(shared), cfg, params, PROMPTS, NEW_TOKENS))
    assert json.loads((tmp_path / "True" / "genai_config.json").read_text())["search"]["past_present_share_buffer"]
    graph = onnx.load(str(tmp_path / "True" / "model.onnx")).graph
    makers = {out: node.op_type for node in graph.node for out in node.output}
    assert {makers[o.name] for o in graph.output if o.name.startswith("present.")} == {"TensorScatter"}
    assert all(r.passed for r in reports), reports
    tokens = [genai_greedy(tmp_path / str(shared), PROMPTS, NEW_TOKENS)[0] for shared in (False, True)]
    assert (tokens[0] == tokens[1]).all()


def test_genai_config_counts_one_cache_layer_per_evaluation():
    """num_hidden_layers is blocks x steps x stages: rk4 has 4 stages, so 2 blocks x 2 steps x 4;
    the layer block steps once, so 2 blocks x 4 stages."""
    cfg = lm(ode_solver="rk4", ode_steps=2)
    gen = genai_config(cfg)
    assert cache_layers(cfg) == gen["model"]["decoder"]["num_hidden_layers"] == 16
    assert cache_layers(lm(block="layer", ode_solver="rk4")) == 8
    assert gen["model"]["decoder"]["head_size"] == 16 and gen["search"]["do_sample"] is False


@pytest.mark.parametrize("change, message", [
    pytest.param({"mode": "encoder"}, "mode: GenAI generates token by token with a cache, which needs mode='decoder'",
                 id="encoder-mode"),
    pytest.param({"ode_use_pe": True, "positional_encoding": "pape"}, "positional_encoding: 'pape' (PaPE) takes its score",
                 id="pape"),
    pytest.param({"ode_use_pe": True, "use_ssmax": True, "ssmax_length": "padded"},
                 "use_ssmax: SSMax's seed rule (ssmax_length 'padded')", id="ssmax-seed-rule"),
    pytest.param({"ode_use_pe": True, "positional_encoding": "hope"},
                 "positional_encoding: the GenAI export takes none, rope, sinusoidal_rotary, alibi", id="hope"),
])
def test_export_genai_refuses_what_no_cache_reproduces(change, message, tmp_path, capsys):
    """`odeattn export --genai` refuses the config in one line, exit 2, naming the field, before
    it reads the weights or writes anything."""
    assert main(["init", str(tmp_path), "--lm", "--hidden-size", "16", "--num-heads", "2", "--vocab-size", "32",
                 "--steps", "1"]) == 0
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "bad.json").write_text(json.dumps({**config, **change}))
    capsys.readouterr()
    argv = ["export", "--config", str(tmp_path / "bad.json"), "--weights", str(tmp_path / "weights.safetensors"),
            "--genai", str(tmp_path / "out")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"odeattn export: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_export_genai_refuses_block_model_options(tmp_path, capsys):
    """-o, --opset and the other options of a block model do not apply to the folder: refused by name."""
    argv = ["export", "--config", str(tmp_path / "c.json"), "--weights", str(tmp_path / "w.safetensors"),
            "--genai", str(tmp_path / "out"), "-o", str(tmp_path / "m.onnx"), "--opset", "23"]
    assert main(argv) == 2
    assert capsys.readouterr().err == ("odeattn export: --genai: writes its folder's model.onnx and genai_config.json "
                                       "(float32), which no block-model option shapes; got -o, --opset\n")
    assert main(argv[:5] + ["-o", str(tmp_path / "m.onnx"), "--shared-buffer"]) == 2
    assert capsys.readouterr().err.startswith("odeattn export: --shared-buffer: applies to --genai DIR")


def test_export_genai_refuses_a_folder_it_cannot_make(tmp_path, capsys):
    """A --genai DIR under a file: one line naming --genai, exit 2, before the model is built."""
    assert main(["init", str(tmp_path), "--lm", "--hidden-size", "16", "--num-heads", "2", "--steps", "1"]) == 0
    capsys.readouterr()
    argv = ["export", "--config", str(tmp_path / "config.json"), "--weights", str(tmp_path / "weights.safetensors"),
            "--genai", str(tmp_path / "config.json" / "genai")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"odeattn export: --genai: cannot make the folder {str(tmp_path / 'config.json' / 'genai')!r}"), err
    assert err.count("\n") == 1, err


def test_init_lm_then_export_genai_writes_the_folder_genai_runs(tmp_path, capsys):
    """`odeattn init --lm` then `odeattn export --genai`: the folder generates in GenAI as the spec
    decodes the saved (float32) weights."""
    argv = ["init", str(tmp_path), "--lm", "--hidden-size", "16", "--num-heads", "2", "--vocab-size", "32",
            "--solver", "euler", "--steps", "2"]
    assert main(argv) == 0
    config, params = R.LMConfig.from_any(json.loads((tmp_path / "config.json").read_text())), R.load_params(tmp_path / "weights.safetensors")
    for folder, extra in (("genai", []), ("shared", ["--shared-buffer"])):
        assert main(["export", "--config", str(tmp_path / "config.json"), "--weights", str(tmp_path / "weights.safetensors"),
                     "--genai", str(tmp_path / folder), *extra]) == 0
        assert "4 cache layers (2 blocks x 2 evaluations of f)" in capsys.readouterr().out
        report = check_genai(tmp_path / folder, config, params, PROMPTS, 1)  # eos is the pad token 0 here: one token
        assert report.passed, report
