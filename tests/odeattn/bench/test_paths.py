"""The paths' FLOP count (odeattn.bench.paths)."""

import ode_ref as R
from odeattn.bench import flops


def test_flops_count_the_matrix_products_by_hand():
    cfg = R.ODEConfig(hidden_size=4, num_heads=2, ode_solver="heun", ode_steps=3)
    # per evaluation: qkv 2*1*2*4*12 = 192, scores 2*1*2*2*4 = 32, a@v 32, out 2*1*2*4*4 = 64 -> 320
    assert flops(1, 2, 4, cfg) == 320 * 2 * 3
