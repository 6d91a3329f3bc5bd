"""A decode run on any backend: a prefill of the prompt, then one decode step per token."""

from __future__ import annotations

import numpy as np

import ode_ref as R


def split_decoded(z, prompt: int) -> dict:
    """A decode run's output (batch, seq, d_model) as its quantities: the prompt's z, then each token's."""
    out = {"prefill": z[:, :prompt]}
    out.update({f"decode_{j}": z[:, prompt + j - 1:prompt + j] for j in range(1, z.shape[1] - prompt + 1)})
    return out


def decode_loop(prefill, decode_step, x, padding_mask, prompt: int):
    """A decode run on any backend: prefill(x_prompt, mask_prompt, max_len) -> (z, cache) on the
    first `prompt` tokens, then decode_step(x_t, cache) -> (z_t, cache) per remaining token (each
    real); returns (batch, seq, d_model) as NumPy, the prompt's z then each token's."""
    z, cache = prefill(x[:, :prompt], None if padding_mask is None else padding_mask[:, :prompt], x.shape[1])
    out = [np.asarray(z)]
    for i in range(prompt, x.shape[1]):
        z_t, cache = decode_step(x[:, i:i + 1], cache)
        out.append(np.asarray(z_t))
    return np.concatenate(out, axis=1)


def run_decode(config, params, x, padding_mask, prompt: int, *, attention=None):
    """The spec's decode run (decode_loop over ode_ref.prefill and ode_ref.decode_step)."""
    return decode_loop(lambda x, m, n: R.prefill(params, x, config, m, max_len=n, attention=attention),
                       lambda x_t, cache: R.decode_step(params, x_t, cache, config, attention=attention),
                       x, padding_mask, prompt)
