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
    assert main([*argv[:7], "--functions"]) == 2  # taken by the block model only, not ignored
    assert capsys.readouterr().err.startswith("odeattn export: --genai: writes its folder's model.onnx and "
                                              "genai_config.json (float32), which no block-model option shapes; got --functions\n")
    assert main(argv[:5] + ["-o", str(tmp_path / "m.onnx"), "--shared-buffer"]) == 2
    assert capsys.readouterr().err.startswith("odeattn export: --shared-buffer: applies to --genai DIR")


def test_every_block_model_option_genai_refuses_is_one_of_export_s_with_its_default():
    """BLOCK_OPTIONS names flags `odeattn export` has: none dead, each default the parser's."""
    from odeattn.cli import build_parser
    from odeattn.commands.genai import BLOCK_OPTIONS

    args = build_parser().parse_args(["export", "--config", "c.json", "--weights", "w.safetensors"])
    assert all(hasattr(args, name) and getattr(args, name) == default for _, name, default in BLOCK_OPTIONS)


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


SMALL = R.LMConfig(vocab_size=32, num_layers=1, hidden_size=16, num_heads=2, ode_steps=1)


@pytest.mark.parametrize("search, message", [
    *[pytest.param({"max_length": v}, f"max_length: expected an integer in [1, 2147483647] (the prompt and the generated "
                   f"tokens; GenAI reads a 32-bit int); got {v!r}", id=f"max_length-{v!r}")
      for v in (0, -1, 10**12, 1.5, "256", True, None)],
    *[pytest.param({name: v}, f"{name}: expected an integer token id in [0, 32) (vocab_size); got {v!r}", id=f"{name}-{v!r}")
      for name in ("pad_token_id", "eos_token_id") for v in (True, 1.5, -1, 32, "3")],
    *[pytest.param({"shared_buffer": v}, f"shared_buffer: expected True or False (GenAI's past_present_share_buffer); "
                   f"got {v!r}", id=f"shared_buffer-{v!r}") for v in ("no", 1, None)],
])
def test_write_genai_refuses_a_bad_search_option_by_name_and_writes_nothing(search, message, tmp_path):
    """Each search option is checked, type and range (a bool is no integer, "no" no bool), in one
    line naming it, before the model is built: the folder is not made."""
    params = R.init_lm_params(SMALL, seed=0)
    for call in (lambda: genai_config(SMALL, **search), lambda: write_genai(SMALL, params, tmp_path / "out", **search)):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == message
    assert not (tmp_path / "out").exists()


def test_the_search_options_are_written_as_plain_json_values(tmp_path):
    """NumPy integers and np.bool_ are taken, and written as JSON's int and bool."""
    import numpy as np

    params = R.init_lm_params(SMALL, seed=0)
    _, gen = write_genai(SMALL, params, tmp_path / "out", max_length=np.int64(40), pad_token_id=np.int32(2),
                         eos_token_id=np.uint8(5), shared_buffer=np.bool_(True))
    written = json.loads(gen.read_text())
    assert (written["search"]["max_length"], written["model"]["pad_token_id"], written["model"]["eos_token_id"],
            written["search"]["past_present_share_buffer"]) == (40, 2, 5, True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder left beside it


@pytest.mark.parametrize("prompts, message", [
    pytest.param([[3, -1, 4]], "prompts[0]: expected integer token ids in [0, 32) (vocab_size); got -1", id="negative"),
    pytest.param([[3, 4], [5, 32]], "prompts[1]: expected integer token ids in [0, 32) (vocab_size); got 32",
                 id="past-the-vocabulary"),
    pytest.param([[3, True]], "prompts[0]: expected integer token ids in [0, 32) (vocab_size); got True", id="a-bool"),
    pytest.param([[3, 4.0]], "prompts[0]: expected integer token ids in [0, 32) (vocab_size); got 4.0", id="a-float"),
    pytest.param([[0, 0, 0]], "prompts[0]: ends in the pad token 0, which GenAI reads as padding at a prompt's end (a "
                 "prompt of pad tokens alone would have no real token)", id="pads-alone"),
    pytest.param([[3, 4], []], "prompts[1]: expected a non-empty list of token ids; got []", id="an-empty-prompt"),
    pytest.param([], "prompts: expected a non-empty list of prompts", id="no-prompt"),
])
def test_what_feeds_the_genai_model_refuses_the_ids_the_spec_refuses(prompts, message, tmp_path):
    """The exported model would take a negative id as one counted from the vocabulary's end, and a
    prompt of pads alone as one with no real token (an attention_mask of zeros): genai_greedy,
    check_genai and unfair refuse them first, by name, as the spec's check_ids does."""
    params = R.init_lm_params(SMALL, seed=0)
    write_genai(SMALL, params, tmp_path)
    for call in (lambda: genai_greedy(tmp_path, prompts, 2), lambda: check_genai(tmp_path, SMALL, params, prompts, 2),
                 lambda: unfair(SMALL, params, prompts, 2)):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value).startswith(message), err.value


def test_genai_greedy_refuses_a_pad_token_other_than_the_folder_s(tmp_path):
    write_genai(SMALL, R.init_lm_params(SMALL, seed=0), tmp_path, pad_token_id=2)
    with pytest.raises(ValueError, match=r"^pad_token_id: the folder's genai_config.json pads with 2; got 0$"):
        genai_greedy(tmp_path, [[3, 4]], 2)
    with pytest.raises(ValueError, match=r"^new_tokens: expected an integer >= 1; got 0$"):
        genai_greedy(tmp_path, [[3, 4]], 0, pad_token_id=2)
    assert genai_greedy(tmp_path, [[3, 4]], 2, pad_token_id=2)[0].shape == (1, 2)
