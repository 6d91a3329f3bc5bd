"""The real client: ONNX Runtime GenAI generating from an exported folder (export.genai), held to
the spec's greedy decoding (ode_ref.lm.lm_greedy) token for token, its logits within the derived
float32 tolerance at every step.

    genai_greedy(folder, prompts, new_tokens)    GenAI's tokens and per-step logits for a batch of
                                                 prompts of different lengths (its own padding)
    check_prompts(prompts, vocab_size, pad)      the prompts, checked as the spec checks token ids
    check_genai(folder, config, params, prompts, new_tokens) -> GenaiReport
    unfair(config, params, prompts, new_tokens)  why the spec's decoding is no fair test, or None

GenAI (0.18) pads a batch of prompts on the right with pad_token_id, feeds an attention_mask of 0
for those trailing pads, takes each row's first token from its last real token's logits and then
appends one column of 1 per generated token. The spec decodes the same right-padded prompt with
the exact cache; each token's position counts the real tokens before it, so both equal the
unpadded prompts' decoding.

The tolerance, by the conformance suite's one rule (tolerance.py's quantity_tolerance):
e32 is the spec's own float32 error on these logits, lm_logits in float32 against float64 on the
same tokens (prompt and generated), the largest over the steps relative to the largest logit;
the allowed error is tolerance(e32, "float32") = 32 max(e32, 2^-24). GenAI runs the same
arithmetic in float32 with other summation orders (ONNX Runtime's MatMul, its Softmax), which
the factor 32 covers as it does for every other float32 backend.

genai_greedy, check_genai and unfair check their prompts first (check_prompts), as
ode_ref.lm.check_ids checks the spec's ids: the exported model would take what the spec refuses (a
negative id is, to ONNX's Gather, an id counted from the end of the vocabulary), so what feeds it
from here refuses it before (docs/generation.md, "Token ids and the attention mask").
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

import ode_ref as R
from ode_ref.lm import LMConfig

from .cases.tolerance import quantity_tolerance, relative_error


def check_prompts(prompts, vocab_size: int, pad_token_id: int) -> list:
    """prompts as lists of ints, once checked: a non-empty sequence of non-empty prompts, each token
    an integer (not a bool) in [0, vocab_size), as the spec's ids; and no prompt ending in
    pad_token_id, which GenAI reads as padding there (so a prompt of pads alone would have no real
    token, an attention_mask of zeros). ValueError naming prompts otherwise."""
    if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__len__") or len(prompts) == 0:
        raise ValueError(f"prompts: expected a non-empty list of prompts (lists of token ids); got {prompts!r}"[:300])
    out = []
    for row, prompt in enumerate(prompts):
        tokens = list(prompt) if hasattr(prompt, "__len__") and not isinstance(prompt, (str, bytes)) else None
        if not tokens:
            raise ValueError(f"prompts[{row}]: expected a non-empty list of token ids; got {prompt!r}"[:300])
        bad = [t for t in tokens if isinstance(t, (bool, np.bool_)) or not isinstance(t, numbers.Integral)
               or not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"prompts[{row}]: expected integer token ids in [0, {vocab_size}) (vocab_size); got {bad[0]!r}")
        if tokens[-1] == pad_token_id:
            raise ValueError(f"prompts[{row}]: ends in the pad token {pad_token_id}, which GenAI reads as padding at a "
                             "prompt's end (a prompt of pad tokens alone would have no real token); end it in another id")
        out.append([int(t) for t in tokens])
    return out


def padded(prompts, pad_token_id: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids (batch, longest) right-padded with pad_token_id, mask bool, True = a real token): the
    batch GenAI makes of prompts of different lengths."""
    longest = max(len(p) for p in prompts)
    ids = np.full((len(prompts), longest), pad_token_id, np.int64)
    mask = np.zeros(ids.shape, bool)
    for row, prompt in enumerate(prompts):
        ids[row, :len(prompt)], mask[row, :len(prompt)] = prompt, True
    return ids, mask


def genai_greedy(folder, prompts, new_tokens: int, pad_token_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(tokens (batch, new_tokens), logits (batch, new_tokens, vocab)) of GenAI's greedy search on
    the folder: step s's logits are those that chose token s. The prompts are checked first
    (check_prompts) against the folder's vocab_size, and pad_token_id against its own."""
    import onnxruntime_genai as og

    check_new_tokens(new_tokens)
    prompts = check_prompts(prompts, *folder_tokens(folder, pad_token_id))
    ids, mask = padded(prompts, pad_token_id)
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=ids.shape[1] + new_tokens, batch_size=len(prompts), do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(ids.astype(np.int32))
    last = mask.sum(axis=1) - 1  # each row's last real token
    logits = [np.asarray(generator.get_output("logits"))[np.arange(len(prompts)), last]]
    tokens = []
    for step in range(new_tokens):
        generator.generate_next_token()
        if step:
            logits.append(np.asarray(generator.get_output("logits"))[:, -1])
        tokens.append(np.asarray(generator.get_next_tokens()).copy())
    return np.stack(tokens, axis=1).astype(np.int64), np.stack(logits, axis=1)


def check_new_tokens(new_tokens) -> int:
    """new_tokens, if it is an integer >= 1 (not a bool); ValueError naming it otherwise."""
    if isinstance(new_tokens, (bool, np.bool_)) or not isinstance(new_tokens, numbers.Integral) or new_tokens < 1:
        raise ValueError(f"new_tokens: expected an integer >= 1; got {new_tokens!r}")
    return int(new_tokens)


def folder_tokens(folder, pad_token_id: int) -> tuple[int, int]:
    """(vocab_size, pad_token_id) of the folder's genai_config.json; ValueError unless pad_token_id
    is the folder's (GenAI pads with its own, and the spec's side must pad alike)."""
    import json
    from pathlib import Path

    model = json.loads((Path(folder) / "genai_config.json").read_text())["model"]
    if isinstance(pad_token_id, (bool, np.bool_)) or pad_token_id != model["pad_token_id"]:
        raise ValueError(f"pad_token_id: the folder's genai_config.json pads with {model['pad_token_id']}; got {pad_token_id!r}")
    return model["vocab_size"], model["pad_token_id"]


class GenaiReport(NamedTuple):
    tokens_equal: bool  # GenAI's tokens are the spec's, every row, every step
    first_difference: tuple | None  # (row, step) of the first differing token, or None
    error: float  # GenAI's logits against the spec's (float64), relative to the largest
    tolerance: float  # tolerance(e32, "float32")
    e32: float  # the spec's own float32 error on the same logits
    min_margin: float  # the spec's smallest top-1 minus top-2 logit over the steps, relative

    @property
    def passed(self) -> bool:
        return self.tokens_equal and self.error <= self.tolerance


def spec_greedy(params, cfg: LMConfig, ids, mask, new_tokens: int):
    """(tokens, logits (float64), e32) of the spec's greedy decoding of the padded batch: e32 the
    spec's float32 error on those logits (lm_logits, uncached, on every token the decoding fed)."""
    want_tokens, want = R.lm_greedy(params, ids, cfg, new_tokens, mask)
    # every token fed: the prompt, then the generated ones but the last
    whole = np.concatenate([ids, want_tokens[:, :-1]], axis=1)
    whole_mask = np.concatenate([mask, np.ones(want_tokens[:, :-1].shape, bool)], axis=1)
    at = np.concatenate([(mask.sum(axis=1) - 1)[:, None], ids.shape[1] + np.arange(new_tokens - 1)[None].repeat(len(ids), 0)],
                        axis=1)
    rows = np.arange(len(ids))[:, None]
    f64 = R.lm_logits(params, whole, cfg, whole_mask)[rows, at]
    f32 = R.lm_logits(params, whole, cfg, whole_mask, dtype=np.float32)[rows, at]
    return want_tokens, want, relative_error(f32, f64)


def unfair(config, params, prompts, new_tokens: int, pad_token_id: int = 0) -> str | None:
    """Why the spec's greedy decoding of prompts is no fair test of a float32 implementation's
    tokens, or None: at every step the top logit leads the next by more than twice
    tolerance(e32, "float32"), so any implementation within the tolerance chooses the spec's token
    (conformance/cases/fair.py's rule for BitLinear's roundings, applied to the argmax)."""
    cfg = LMConfig.from_any(config)
    ids, mask = padded(check_prompts(prompts, cfg.vocab_size, pad_token_id), pad_token_id)
    _, want, e32 = spec_greedy(params, cfg, ids, mask, new_tokens)
    margin, tol = top_margin(want), quantity_tolerance("float32", e32)
    if margin <= 2 * tol:
        return f"greedy choice near a tie: top-1 margin {margin:.1e}, tolerance {tol:.1e}"
    return None


def top_margin(logits) -> float:
    """The smallest top-1 minus top-2 logit over the steps, relative to the largest logit."""
    top = np.sort(logits, axis=-1)
    return float((top[..., -1] - top[..., -2]).min() / np.abs(logits).max())


def check_genai(folder, config, params, prompts, new_tokens: int, pad_token_id: int = 0) -> GenaiReport:
    """GenAI's greedy generation from folder against the spec's, on the same right-padded batch."""
    cfg = LMConfig.from_any(config)
    check_new_tokens(new_tokens)
    prompts = check_prompts(prompts, cfg.vocab_size, pad_token_id)
    ids, mask = padded(prompts, pad_token_id)
    want_tokens, want, e32 = spec_greedy(params, cfg, ids, mask, new_tokens)
    got_tokens, got = genai_greedy(folder, prompts, new_tokens, pad_token_id)
    differ = np.argwhere(got_tokens != want_tokens)
    return GenaiReport(not differ.size, tuple(int(i) for i in differ[0]) if differ.size else None,
                       relative_error(got, want), quantity_tolerance("float32", e32), e32, top_margin(want))
