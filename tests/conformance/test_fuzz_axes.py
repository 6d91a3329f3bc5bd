"""`odeattn conformance fuzz`'s widened axes (docs/fuzzing.md, "What it draws"): each level past a
boundary is drawn (decoded tokens, steps and cached evaluations, long sequences, batch x heads),
no draw passes the caps, and a draw with a positional encoding has two real tokens."""

import pytest


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
