"""`odeattn diagnose`: how many steps does a block need? For given weights and input, the error
of z(1) against a converged reference, for every solver as the steps grow, its observed order,
and the fewest steps that meet a tolerance.

Method (the spec, float64, every token real):
  - reference: rk4 with --ref-steps steps; its own error is estimated as the relative difference
    from rk4 with half those steps (an upper bound for a method that converges, as rk4 does on a
    smooth f) and reported;
  - error: max |z(1) - z_ref| / max |z_ref|, the relative measure of `odeattn export`, for
    steps 1, 2, 4, ... up to --max-steps;
  - noise level: 10x the reference's error; errors at or below it are not used;
  - floor: the fewest steps from which every doubling (above the noise level) lowers the error
    at less than half the nominal order (local order log2(e(n) / e(2n)) < order / 2; 0.5 for a
    solver with no nominal order): the error has stopped falling at the solver's rate;
  - observed order: the least-squares slope of log(error) against log(h), h = 1 / steps, over the
    finest (at most 3) steps above the noise level, the asymptotic range. No order is fitted when
    there is a floor (it reaches to the finest steps), or when the block uses BitLinear: its
    quantiser rounds activations to 8-bit levels, so f is discontinuous in z and the error is no
    smooth power of h;
  - fewest steps: the fewest of the steps tried from which every larger one meets --tol, counting
    the reference's own error against it (error + reference error <= tol).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

import ode_ref as R
from ode_ref.multistep import MULTISTEP, evaluations as solver_evaluations, with_solver

REFERENCE_SOLVER = "rk4"
NOISE_FACTOR = 10.0  # errors below NOISE_FACTOR x the reference's own error are not trusted
FLOOR_ORDER = 0.5  # the floor's local order for a solver with no nominal order (not a tableau)
FIT_POINTS = 3  # the finest steps above the noise level make the asymptotic range


@dataclasses.dataclass(frozen=True)
class Solver:
    """A solver to measure: its name, nominal order and stages (None for one that is not a
    Butcher tableau), the parameters it reads, or the reason it is skipped."""

    name: str
    order: int | None = None
    stages: int | None = None
    params: dict | None = None
    skip: str | None = None


def params_for(config: R.ODEConfig, params: dict, solver: str) -> tuple[dict, list[str]]:
    """(the parameters `solver` reads, taken from params; the names of those params lacks).
    ValueError if the spec refuses the solver with this config."""
    shapes = R.param_shapes(with_solver(config, solver))
    return {k: params[k] for k in shapes if k in params}, [k for k in shapes if k not in params]


def solvers(config: R.ODEConfig, params: dict) -> list[Solver]:
    """Every solver the spec knows (ode_ref.SOLVERS), each with the parameters it reads from
    `params`, or skipped with the reason: the spec refuses it, or the weights lack its parameters."""
    out = []
    for name in R.SOLVERS:
        method = R.TABLEAUS.get(name) or MULTISTEP.get(name)  # a multistep solver evaluates f once a step after its start
        order, stages = (method.order, getattr(method, "num_stages", 1)) if method else (None, None)
        try:
            own, missing = params_for(config, params, name)
        except ValueError as err:
            out.append(Solver(name, order, stages, skip=f"not runnable with this config ({err})"))
            continue
        if missing:
            out.append(Solver(name, order, stages, skip=f"needs {', '.join(missing)}, which the weights lack"))
            continue
        out.append(Solver(name, order, stages, params=own))
    return out


def relative_error(z: np.ndarray, ref: np.ndarray) -> float:
    """max |z - ref| / max |ref|."""
    return float(np.abs(z - ref).max() / np.abs(ref).max())


def solve(params: dict, x: np.ndarray, config: R.ODEConfig, solver: str, steps: int) -> np.ndarray:
    """z(1) by the spec with this solver and number of steps."""
    return R.ode_block(params, x, with_solver(config, solver, ode_steps=steps))


def reference(params: dict, x: np.ndarray, config: R.ODEConfig, steps: int) -> tuple[np.ndarray, float]:
    """(z_ref, its estimated relative error): rk4 with `steps` steps, compared with half as many."""
    params = params_for(config, params, REFERENCE_SOLVER)[0]
    z_ref = solve(params, x, config, REFERENCE_SOLVER, steps)
    return z_ref, relative_error(solve(params, x, config, REFERENCE_SOLVER, steps // 2), z_ref)


def step_counts(max_steps: int) -> list[int]:
    """1, 2, 4, ... up to max_steps."""
    return [2**k for k in range(max_steps.bit_length())]


def floor_steps(usable: list[tuple[int, float]], nominal: int | None) -> int | None:
    """The fewest steps from which every doubling lowers the error at less than half the nominal
    order (FLOOR_ORDER without one); None if the last doubling still keeps the rate."""
    slow = (nominal / 2) if nominal else FLOOR_ORDER
    floor = None
    for (n, e), (_, e2) in zip(usable, usable[1:]):
        floor = (floor or n) if np.log2(e / e2) < slow else None
    return floor


def observed_order(steps: list[int], errors: list[float], noise: float, nominal: int | None, bitnet: bool) -> dict:
    """{"order", "fit_steps", "floor_steps", "local_orders", "note"}: the fitted slope over the
    asymptotic range, or None with the reason in note."""
    usable = [(n, e) for n, e in zip(steps, errors) if e > noise]
    local = [float(np.log2(e / e2)) for (_, e), (_, e2) in zip(usable, usable[1:])]
    floor = floor_steps(usable, nominal)
    fit = usable[-FIT_POINTS:]
    out = {"order": None, "fit_steps": [], "floor_steps": floor, "local_orders": local, "note": ""}
    if floor is not None:
        tail = local[[n for n, _ in usable].index(floor):]
        out["note"] = (f"floor: from {floor} step{'s' if floor > 1 else ''} on the error falls at less than "
                       f"half the nominal order (local orders {min(tail):.2f}..{max(tail):.2f})")
    if bitnet:
        out["note"] = "; ".join(filter(None, ["no order fitted: BitLinear's quantiser makes f discontinuous in z",
                                              out["note"]]))
    elif len(usable) < 2:
        out["note"] = "no order fitted: fewer than 2 errors above the noise level"
    elif floor is not None:
        out["note"] = f"no order fitted; {out['note']}"
    else:
        slope = np.polyfit(np.log([1.0 / n for n, _ in fit]), np.log([e for _, e in fit]), 1)[0]
        out.update(order=float(slope), fit_steps=[n for n, _ in fit])
    return out


def fewest_steps(steps: list[int], errors: list[float], tol: float, ref_error: float) -> int | None:
    """The fewest of `steps` from which every larger one has error + ref_error <= tol; None if none."""
    best = None
    for n, e in zip(reversed(steps), reversed(errors)):
        if e + ref_error > tol:
            break
        best = n
    return best


def diagnose(params: dict, x: np.ndarray, config, *, max_steps: int = 128, ref_steps: int = 1024,
             tol: float = 1e-4) -> dict:
    """The error table, observed orders and fewest steps for every solver (see the module doc).
    params: the block's weights (every solver takes the ones it reads); x: (batch, seq, d_model)."""
    config = R.ODEConfig.from_any(config)
    x = np.asarray(x, np.float64)
    params = {k: np.asarray(v, np.float64) for k, v in params.items()}
    steps = step_counts(max_steps)
    z_ref, ref_error = reference(params, x, config, ref_steps)
    noise = NOISE_FACTOR * ref_error
    rows = []
    for s in solvers(config, params):
        row = {"solver": s.name, "nominal_order": s.order, "stages": s.stages, "skip": s.skip}
        if s.skip is None:
            errors = [relative_error(solve(s.params, x, config, s.name, n), z_ref) for n in steps]
            row.update(errors=errors, fewest_steps=fewest_steps(steps, errors, tol, ref_error),
                       **observed_order(steps, errors, noise, s.order, config.use_bitnet))
        rows.append(row)
    own = next((r for r in rows if r["solver"] == config.ode_solver), None)
    current = None
    if own is not None and own["skip"] is None:
        current = relative_error(solve(params_for(config, params, config.ode_solver)[0], x, config, config.ode_solver, config.ode_steps), z_ref)
    return {"config": config.to_dict(), "shape": list(x.shape), "steps": steps, "tol": tol,
            "reference": {"solver": REFERENCE_SOLVER, "steps": ref_steps, "error": ref_error},
            "noise": noise, "current_error": current, "solvers": rows}


def _order(value) -> str:
    return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def _cell(error: float, noise: float) -> str:
    return f"{error:>9.1e}" + ("*" if error <= noise else " ")


def format_report(result: dict, *, knobs=("ref_steps", "tol")) -> str:
    """The error table (steps by solver), then one line per solver: orders, fewest steps, notes.
    knobs: what the warning of a tol at or below the noise level tells to raise (diagnose's
    parameters; a command passes its options)."""
    ref, rows = result["reference"], result["solvers"]
    run = [r for r in rows if r["skip"] is None]
    lines = [f"reference: {ref['solver']} with {ref['steps']} steps; its own error (vs {ref['steps'] // 2} steps) "
             f"{ref['error']:.1e}; noise level {result['noise']:.1e}",
             "relative error of z(1), max|z - z_ref| / max|z_ref|:",
             f"{'steps':>6}" + "".join(f"{r['solver']:>10}" for r in run)]
    for i, n in enumerate(result["steps"]):
        lines.append(f"{n:>6}" + "".join(_cell(r["errors"][i], result["noise"]) for r in run))
    lines += ["(* at or below the noise level: not used)", "",
              f"{'solver':<10}{'stages':>7}{'nominal':>9}{'observed':>10}  {'fit over steps':<16}"
              f"fewest steps for tol {result['tol']:.0e} (evaluations of f)"]
    for r in rows:
        if r["skip"]:
            lines.append(f"{r['solver']:<10}skipped: {r['skip']}")
            continue
        fit = f"{r['fit_steps'][0]}..{r['fit_steps'][-1]}" if r["fit_steps"] else "-"
        fewest = f"not reached up to {result['steps'][-1]}"
        if r["fewest_steps"]:
            method = R.TABLEAUS.get(r["solver"]) or MULTISTEP.get(r["solver"])
            evals = f" ({solver_evaluations(method, r['fewest_steps'])})" if method else ""
            fewest = f"{r['fewest_steps']}{evals}"
        lines.append(f"{r['solver']:<10}{_order(r['stages']):>7}{_order(r['nominal_order']):>9}"
                     f"{_order(r['order']):>10}  {fit:<16}{fewest}")
        if r["note"]:
            lines.append(f"{'':<10}  {r['note']}")
    if result["tol"] <= result["noise"]:
        lines.append(f"warning: tol {result['tol']:.0e} is at or below the noise level; raise {knobs[0]} or {knobs[1]}")
    cfg = result["config"]
    if result["current_error"] is not None:
        met = "meets" if result["current_error"] + ref["error"] <= result["tol"] else "does not meet"
        lines.append(f"this config ({cfg['ode_solver']}, {cfg['ode_steps']} steps): error "
                     f"{result['current_error']:.1e}, {met} tol {result['tol']:.0e}")
    return "\n".join(line.rstrip() for line in lines)


MARKERS = ("o", "s", "^", "D", "v", "x", "P", "*", "<", ">")  # one a solver: the ten the spec knows
DASHES = ("-", "--", "-.", ":")


def plot(result: dict, path: Path) -> None:
    """Log-log error against steps, one line per solver, the noise level dashed."""
    from odeattn.plotting import pyplot

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 5))
    shown = [r for r in result["solvers"] if r["skip"] is None]
    for i, r in enumerate(shown):
        observed = "no fit" if r["order"] is None else f"observed {r['order']:.2f}"
        label = f"{r['solver']} (order {_order(r['nominal_order'])}, {observed})"
        # solvers of one order draw nearly the same line: each its own marker, dash and colour,
        # hollow markers, so one drawn over another still shows
        ax.loglog(result["steps"], r["errors"], marker=MARKERS[i % len(MARKERS)], fillstyle="none",
                  linestyle=DASHES[i % len(DASHES)], color=f"C{i % 10}", label=label)
    ax.axhline(result["noise"], color="grey", linestyle="--", label="noise level (10x reference error)")
    ax.axhline(result["tol"], color="black", linestyle=":", label=f"tol {result['tol']:.0e}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("steps")
    ax.set_ylabel("max|z(1) - z_ref| / max|z_ref|")
    bitlinear = ", BitLinear" if result["config"]["use_bitnet"] else ""
    ax.set_title(f"error of z(1) against steps ({result['config']['norm_type']}{bitlinear})", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
