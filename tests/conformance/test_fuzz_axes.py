"""`odeattn conformance fuzz`'s widened axes (docs/fuzzing.md, "What it draws"): each level past a
boundary is drawn (decoded tokens, steps and cached evaluations, long sequences, batch x heads),
no draw passes the caps, and a draw with a positional encoding has two real tokens; a run judges
each example once, each dtype its own."""

import pytest

from odeattn.conformance.adapters import SpecAdapter
from odeattn.conformance.fuzzing.fuzz import fuzz


def _evaluations(d):
    from ode_ref.cache import evaluations

    return evaluations(d.config)


# The widened axes (docs/fuzzing.md, "What it draws"): each level past a boundary is drawn, and
# no draw passes the caps. Draws are cheap (nothing is built), so hypothesis searches for them.
@pytest.mark.parametrize("axis, reached", [
    ("17 decoded tokens", lambda d: d.decoded == 17),
    ("seq past 512", lambda d: d.seq > 512 and d.config.hidden_size <= 16),
    ("steps past 8, cached evaluations past 32", lambda d: d.decoded and d.config.ode_steps > 8 and _evaluations(d) > 32),
    ("batch x heads past 128", lambda d: d.batch * d.config.num_heads > 128),
    ("steps past 4 in a block forward", lambda d: d.kind.name == "block" and d.config.ode_steps > 4),
])
def test_each_widened_axis_is_drawn_past_its_boundaries(axis, reached):
    from hypothesis import HealthCheck, find, settings

    from odeattn.conformance.fuzzing.draw import draws

    find(draws(), reached, settings=settings(max_examples=5000, database=None, derandomize=True,
                                                suppress_health_check=list(HealthCheck)))


def test_every_draw_keeps_within_the_caps_and_a_positioned_one_has_two_real_tokens():
    """MAX_ELEMENTS, MAX_WORK and MAX_STEPPED hold for every draw; a draw with a positional encoding
    has two tokens or more, and some row of its mask keeps two real ones (a single real token is
    at the same position whatever the encoding does)."""
    from hypothesis import HealthCheck, given, settings

    from odeattn.conformance.fuzzing import draw as D

    @settings(max_examples=300, database=None, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(d=D.draws())
    def check(d):
        c = d.config
        assert d.batch * d.seq * c.hidden_size <= D.MAX_ELEMENTS and c.ode_steps <= d.kind.most_steps
        assert D.work(d.kind, d.batch, c.num_heads, d.seq, _evaluations(d)) <= D.MAX_WORK
        assert d.decoded * _evaluations(d) <= D.MAX_STEPPED
        if c.ode_use_pe:
            for attempt in range(3):
                _, mask = D.inputs(d, attempt)
                real = d.seq if mask is None else mask.sum(axis=1).max()
                assert real >= 2, (d, mask)

    check()


class Recording(SpecAdapter):
    """The spec, keeping each block example it judges (its config, input, mask and weights) in `seen`."""

    name, run_vjp, run_decode = "recording", None, None

    def __init__(self):
        self.seen = []

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        self.seen.append((config, x.tobytes(), None if padding_mask is None else padding_mask.tobytes(),
                          b"".join(params[k].tobytes() for k in sorted(params))))
        return super().run_trajectory(config, params, x, padding_mask, dtype)


def test_a_run_judges_each_example_once_and_each_dtype_draws_its_own():
    """hypothesis's draws repeat in a small region; a repeat is redrawn (FuzzRun.repeats). The same
    seed draws other examples in float64 than in float32, and the same ones with share_draws. (Without
    the redraw, 2 of these 60 draws repeated an example, in float32 as in float64.)"""
    runs = {}
    for dtype, share in (("float32", False), ("float64", False), ("float64", True)):
        port = Recording()
        runs[dtype, share] = port, fuzz(port, dtype, examples=60, seed=0, cover=False, share_draws=share)
    for port, run in runs.values():
        assert len(set(port.seen)) == len(port.seen) == run.examples == 60
    assert runs["float32", False][1].repeats > 0
    configs = {key: [c for c, *_ in port.seen] for key, (port, _) in runs.items()}
    assert configs["float64", True] == configs["float32", False]
    assert len(set(configs["float64", False]) & set(configs["float32", False])) < 5
