"""Every config field, proven by the golden set or set aside with the reason no case can see it.

A port that ignores a config field (runs its default) must fail some golden case. So every field
of ODEConfig, ODEEncoderConfig and LMConfig with a default takes another value in at least one
packaged case of its own config class, and the mutation battery holds a mutant per field that ignores it (mutation/mutants.py,
generated from proven()); tests/conformance/test_mutants.py requires each killed. A field is
set aside only for a reason written here: it does not enter the forward a case checks, or it is
another name for fields that do. The required fields (the sizes) have no default to fall back to.
"""

from __future__ import annotations

import dataclasses

import ode_ref as R

# (config class, field) -> why no golden case can see a port ignore it
SET_ASIDE = {
    (R.ODEConfig, "dropout"): "training only: every case runs the block in evaluation, where dropout is the identity",
    (R.ODEConfig, "bam_theta_init"): "BAM's thetas' initial value (ode_ref.params): a case passes its parameters",
    (R.ODEConfig, "ssmax_s_init"): "SSMax's s's initial value (ode_ref.params): a case passes its parameters",
    (R.ODEConfig, "sinusoidal_max_len"): "the seed's table length: the spec computes every position's angle, so no output "
                                         "depends on it; the tier case block_tier_t33_b5_hd16_sinusoidal_table16_pad reads "
                                         "past a table of 16 (ode_ref/positions.py)",
    (R.ODEEncoderConfig, "dropout"): "training only: every case runs the stack in evaluation",
    (R.ODEEncoderConfig, "attention_dropout"): "training only: every case runs the stack in evaluation",
    (R.ODEEncoderConfig, "activation_dropout"): "training only: every case runs the stack in evaluation",
    (R.ODEEncoderConfig, "enc_calculate_num"): "the released code's name for half of family's pair; the config "
                                               "sets it and rk_type from family, or family from them",
    (R.ODEEncoderConfig, "rk_type"): "the released code's name for half of family's pair; the config sets it and "
                                     "enc_calculate_num from family, or family from them",
}
# an LMConfig carries the block's fields to every block: those set aside for the block are for it
SET_ASIDE.update({(R.LMConfig, name): f"the block's field: {why}" for (cls, name), why in list(SET_ASIDE.items())
                  if cls is R.ODEConfig})
# (config class, field) -> the set-aside fields that name it again, which ignoring it resets too
ALIASES = {(R.ODEEncoderConfig, "family"): ("enc_calculate_num", "rk_type")}
CONFIGS = (R.ODEConfig, R.ODEEncoderConfig, R.LMConfig)  # the configs a golden case holds


def mutant_name(cls, field: str) -> str:
    """The name of the mutant that ignores cls's field: ignores_<field>, with the config's prefix
    where an earlier config of CONFIGS has a field of that name (an LMConfig's block fields)."""
    shared = any(field in defaults(other) for other in CONFIGS[:CONFIGS.index(cls)])
    return f"ignores_{cls.__name__.removesuffix('Config').lower()}_{field}" if shared else f"ignores_{field}"


def defaults(cls) -> dict:
    """field -> default of a config class's fields that have one (the required ones, the sizes, have none)."""
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def proven(cls) -> dict:
    """field -> default of the fields a golden case must prove: those with a default, not SET_ASIDE."""
    return {name: default for name, default in defaults(cls).items() if (cls, name) not in SET_ASIDE}


def unproven(cases) -> list[str]:
    """'Class.field' for each field to prove that no case sets to another value than its default."""
    return [f"{cls.__name__}.{name}" for cls in CONFIGS for name, default in proven(cls).items()
            if not any(type(c.config) is cls and getattr(c.config, name) != default for c in cases)]


def ignoring(config, field: str):
    """config as a port that ignores field runs it: the field (and its aliases) at the default;
    None where config has no such field, holds it at its default already (nothing to ignore), or
    refuses the default there (an LM's 'layer' block takes ode_steps 1 only: the field is fixed
    there, not read)."""
    cls = type(config)
    if field not in proven(cls) or getattr(config, field) == proven(cls)[field]:
        return None
    reset = {name: defaults(cls)[name] for name in (field, *ALIASES.get((cls, field), ()))}
    try:
        return dataclasses.replace(config, **reset)
    except ValueError:
        return None

