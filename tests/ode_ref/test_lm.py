"""The spec's language model (ode_ref/lm.py, lm_layer.py): greedy decoding with the cache equals
the uncached forward, a padded prompt decodes as the unpadded one, and bad configs are refused
by name. (Its GenAI export against it: tests/export/test_genai.py.)"""

import numpy as np
import pytest

import ode_ref as R

PROMPTS = [[3, 4, 5, 6, 7], [8, 9, 10], [11]]


def lm(**kw):
    return R.LMConfig(**{**dict(vocab_size=32, num_layers=2, hidden_size=16, num_heads=2, ode_steps=1), **kw})


CONFIGS = {"rk4-rope": lm(ode_solver="rk4", ode_use_pe=True, positional_encoding="rope"),
           "rk2_gated-alibi-bitlinear": lm(ode_solver="rk2_gated", use_bitnet=True, ode_use_pe=True, positional_encoding="alibi"),
           "layer-rk4": lm(block="layer", ode_solver="rk4", ffn_dim=24)}


def padded(prompts):
    ids = np.zeros((len(prompts), max(map(len, prompts))), np.int64)
    mask = np.zeros(ids.shape, bool)
    for row, p in enumerate(prompts):
        ids[row, :len(p)], mask[row, :len(p)] = p, True
    return ids, mask


@pytest.mark.parametrize("name", list(CONFIGS))
def test_spec_greedy_with_the_cache_equals_the_uncached_forward(name):
    """lm_greedy's logits (prefill, then decode steps) are lm_logits on the prompt and the tokens
    it chose, to 1e-12 in float64, with the prompts padded on the left and on the right."""
    cfg = CONFIGS[name]
    params = R.init_lm_params(cfg, seed=1)
    right, mask = padded(PROMPTS)
    left = np.stack([np.roll(r, -int(m.sum())) for r, m in zip(right, mask)])
    left_mask = np.stack([np.roll(m, -int(m.sum())) for m in mask])
    results = []
    for ids, m in ((right, mask), (left, left_mask)):
        tokens, logits = R.lm_greedy(params, ids, cfg, 6, m)
        whole = np.concatenate([ids, tokens[:, :-1]], axis=1)
        full = R.lm_logits(params, whole, cfg, np.concatenate([m, np.ones((3, 5), bool)], axis=1))
        last = np.array([np.flatnonzero(row)[-1] for row in m])
        assert np.abs(full[np.arange(3), last] - logits[:, 0]).max() < 1e-12
        assert np.abs(full[:, ids.shape[1]:] - logits[:, 1:]).max() < 1e-12
        results.append(tokens)
    assert (results[0] == results[1]).all()  # a padded prompt decodes as the unpadded one, on either side


@pytest.mark.parametrize("kw, message", [
    (dict(vocab_size=0), "vocab_size: expected an integer >= 1; got 0"),
    (dict(block="mlp"), "block: expected one of 'attention', 'layer'; got 'mlp'"),
    (dict(block="layer", use_bitnet=True), "use_bitnet: the 'layer' block (the encoder layer) takes use_bitnet=False only"),
    (dict(block="layer", ode_solver="midpoint"), "ode_solver: the 'layer' block takes euler, heun, rk4, rk2_gated"),
    (dict(block="layer", ode_use_pe=True), "positional_encoding: the 'layer' block has no positional encoder"),
    (dict(num_heads=3), "hidden_size: expected a multiple of num_heads=3"),
])
def test_bad_configs_are_refused_by_name(kw, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        lm(**kw)


def test_ids_out_of_the_vocabulary_are_refused():
    cfg = CONFIGS["rk4-rope"]
    with pytest.raises(ValueError, match=r"ids: expected ids in \[0, 32\) \(vocab_size\); got 0 \.\. 32"):
        R.lm_logits(R.init_lm_params(cfg, 0), np.array([[0, 32]]), cfg)
