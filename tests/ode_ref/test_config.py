"""ODEConfig: every refusal names the field, the expectation and what was received; seed-style
config objects and dicts convert."""

import pytest

import ode_ref as R


@pytest.mark.parametrize("fields, message", [
    pytest.param(dict(hidden_size=4, num_heads=2, ode_solver="rk5"),
                 r"ode_solver: expected one of 'euler', .*'rk38', 'rk2_gated', 'ab2', 'ab3', 'momentum'; got 'rk5'", id="unknown-solver"),
    pytest.param(dict(hidden_size=4, num_heads=2, norm_type="batch_norm"),
                 r"norm_type: expected one of 'layer_norm'.*; got 'batch_norm'", id="unknown-norm"),
    pytest.param(dict(hidden_size=4, num_heads=2, mode="both"),
                 r"mode: expected one of 'encoder', 'decoder'; got 'both'", id="unknown-mode"),
    pytest.param(dict(hidden_size=4, num_heads=2, ode_steps=0),
                 r"ode_steps: expected an integer >= 1; got 0", id="zero-steps"),
    pytest.param(dict(hidden_size=4, num_heads=2, ode_steps=65537),
                 r"ode_steps: expected an integer in \[1, 65536\]; got 65537", id="past-max-steps"),
    pytest.param(dict(hidden_size=8, num_heads=3),
                 r"hidden_size: expected a multiple of num_heads=3; got 8", id="width-not-a-multiple-of-heads"),
    pytest.param(dict(hidden_size=4, num_heads=2, dropout=1.5),
                 r"dropout: expected a number in \[0, 1\); got 1.5", id="dropout-out-of-range"),
    pytest.param(dict(hidden_size=4, num_heads=2, use_bitnet=1),
                 r"use_bitnet: expected True or False; got 1", id="bitnet-not-a-bool"),
    pytest.param(dict(hidden_size=1, num_heads=1, norm_type="dynamic_tanh"),
                 r"dynamic_tanh .* hidden_size >= 2; got 1", id="dynamic-tanh-of-width-1"),
])
def test_a_bad_field_is_refused_naming_it_and_the_value(fields, message):
    with pytest.raises(ValueError, match=message):
        R.ODEConfig(**fields)


def test_from_any_accepts_dicts_and_seed_style_objects():
    class SeedConfig:  # the seed's config object has more attributes than ours
        hidden_size, num_heads, dropout, use_bitnet = 8, 2, 0.1, True
        norm_type, ode_solver, ode_steps, mode, vocab_size = "dynamic_tanh", "euler", 3, "decoder", 100

    c = R.ODEConfig.from_any(SeedConfig())
    assert (c.hidden_size, c.use_bitnet, c.norm_type, c.ode_steps, c.mode) == (8, True, "dynamic_tanh", 3, "decoder")
    assert R.ODEConfig.from_any({"hidden_size": 8, "num_heads": 2}) == R.ODEConfig(8, 2)
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['hiden_size'\]"):
        R.ODEConfig.from_any({"hiden_size": 8, "num_heads": 2})
    with pytest.raises(ValueError, match="hidden_size: required"):
        R.ODEConfig.from_any({"num_heads": 2})
