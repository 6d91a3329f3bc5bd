"""The encoder stack's draws (conformance/fuzzing/encoder_draw.py; `fuzz` draws 10 per backend and
dtype by default, `--encoder-examples N`): every successor drawn, the spec against itself with no
false alarm, a bug of each successor caught, shrunk to the field that matters and replayed from its
repro folder, the default search in the command, and the option's refusals."""

import collections
import json

import pytest
from hypothesis import HealthCheck, given, seed, settings

import ode_ref as R
from odeattn.cli import main
from odeattn.conformance.adapters import SpecAdapter
from odeattn.conformance.cases.kinds import ENCODER
from odeattn.conformance.fuzzing.encoder_draw import encoder_draws
from odeattn.conformance.fuzzing.fuzz import fuzz
from odeattn.conformance.fuzzing.repro import load_repro, write_repro
from odeattn.conformance.mutation.mutants import MUTANTS, MutantAdapter


def test_the_draws_reach_every_family_and_successor():
    """In 150 draws at seed 0: every family, both profiles, the Macaron layer under both halves,
    each shape of PCformer's alpha, its corrector, qkvflow's stack, padding, both norm placements."""
    seen = collections.Counter()

    @settings(max_examples=150, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @seed(0)
    @given(encoder_draws())
    def draw(d):
        c = d.config
        seen.update({f"family {c.family}", f"profile {c.profile}", f"pre {c.encoder_normalize_before}",
                     f"padded {d.rows is not None}"})
        seen.update({f"macaron {c.macaron_profile}"} if c.macaron else set())
        seen.update({f"alpha {c.alpha_type} {c.layer_wise}"} if c.family in R.EMA_FAMILIES else set())
        seen.update({"corrector"} if c.corrector else set())
        seen.update({"temporal"} if c.temporal else set())

    draw()
    want = ({f"family {f}" for f in R.FAMILIES} | {f"family {f}" for f in R.EMA_FAMILIES} | {"profile paper", "profile released"}
            | {"pre True", "pre False", "padded True", "padded False", "macaron paper", "macaron released", "corrector",
               "temporal", "alpha scalar False", "alpha scalar True", "alpha vector False"})
    assert want <= set(seen), sorted(want - set(seen))


def test_the_spec_against_itself_has_no_false_alarm():
    run = fuzz(SpecAdapter(), "float64", kinds=(ENCODER,), examples=25)
    assert run.examples == 25 and not run.failed and run.drew == "encoder stack" and run.worst_ratio == 0


@pytest.mark.parametrize("mutant, field", [("corrector_weights_transposed", "encoder_history_type"),
                                           ("macaron_second_half_dropped", "macaron"),
                                           ("temporal_t_at_step_start", "time_embed_dim")])
def test_a_successor_s_bug_is_caught_shrunk_to_its_field_and_replayed(tmp_path, mutant, field):
    adapter = MutantAdapter(next(m for m in MUTANTS if m.name == mutant))
    run = fuzz(adapter, "float64", kinds=(ENCODER,), examples=60, shrink_seconds=20)
    f = run.finding
    assert run.diverged and f.quantity == "z" and f.case.kind is ENCODER
    assert field in f.essence.needed and f.draw.batch == 1  # shrunk: one row, and the field it needs named
    folder = write_repro(tmp_path / "r", f, adapter.name, "float64")
    case, meta = load_repro(folder)
    assert meta["kind"] == "encoder" and case.config == f.case.config and case.kind is ENCODER


@pytest.mark.parametrize("argv, message", [
    (["--encoder-examples", "3", "--model", "m.onnx", "--config", "c.json", "--weights", "w.npz"],
     "--encoder-examples: not taken with --model"),
    (["--encoder-examples", "3", "--replay", "{tmp}"], "--encoder-examples: not taken with --replay"),
], ids=["with-model", "with-replay"])
def test_the_option_refuses_bad_input_in_one_line(tmp_path, capsys, argv, message):
    assert main(["conformance", "fuzz", *[a.replace("{tmp}", str(tmp_path)) for a in argv]]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_the_command_draws_the_encoder_by_default_where_the_backend_runs_it(tmp_path, monkeypatch, capsys):
    """The spec runs encoder cases: its run holds an encoder search of the default 10 examples, in
    --json too; --encoder-examples 0 turns it off."""
    monkeypatch.chdir(tmp_path)
    assert main(["conformance", "fuzz", "--backend", "spec", "--examples", "3", "--json", "a.json"]) == 0
    assert "spec/float64 (encoder stack): 10 examples, none diverged" in capsys.readouterr().out
    runs = json.loads((tmp_path / "a.json").read_text())["runs"]
    assert [(r["drew"], r["examples"]) for r in runs] == [("attention block", 3), ("encoder stack", 10)]
    assert main(["conformance", "fuzz", "--backend", "spec", "--examples", "3", "--encoder-examples", "0"]) == 0
    assert "encoder stack" not in capsys.readouterr().out


REFUSER = """from odeattn.conformance.adapters import SpecAdapter


class NoEncoder(SpecAdapter):
    name = "noencoder"

    def supports(self, config, dtype):
        return "not supported: an encoder stack" if hasattr(config, "encoder_layers") else None


class Blockish(SpecAdapter):
    name = "blockish"
    run_encoder = None
"""


def test_a_port_refusing_encoders_fails_nothing_by_default_and_is_named_when_asked(tmp_path, monkeypatch, capsys):
    """By default the encoder search may judge nothing; asked for, judging nothing is exit 2, its
    line naming the encoder stack's search; a port without run_encoder asked for them is said so."""
    (tmp_path / "refusing.py").write_text(REFUSER)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["conformance", "fuzz", "--backend", "refusing:NoEncoder", "--examples", "2"]) == 0
    assert "noencoder/float64 (encoder stack): 0 examples" in capsys.readouterr().out
    assert main(["conformance", "fuzz", "--backend", "refusing:NoEncoder", "--examples", "2", "--encoder-examples", "3",
                 "--force"]) == 2
    assert "ran none of the drawn configs in float64, the encoder stack's search" in capsys.readouterr().err
    assert main(["conformance", "fuzz", "--backend", "refusing:Blockish", "--examples", "2", "--encoder-examples", "3",
                 "--force"]) == 0
    assert "refusing:Blockish: no encoder examples (not supported: the encoder stack (the backend has no run_encoder))" in (
        capsys.readouterr().out)


def test_the_encoder_search_has_its_own_repro_folder_and_database_names():
    from odeattn.conformance.fuzzing.fuzz import ENCODER_SUFFIX
    from odeattn.conformance.fuzzing.repro import folder_name

    assert folder_name("torch", "float32", ENCODER_SUFFIX) == "torch-encoder-float32"
    long = "exec:" + "x" * 200
    names = {folder_name(long, d, s) for d in ("float32", "float64") for s in ("", ENCODER_SUFFIX)}
    assert len(names) == 4 and all(len(n) <= 120 for n in names)  # cut in the backend's part: never shared


def test_an_earlier_encoder_repro_folder_is_not_replaced_unasked(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fuzz-repro" / "spec-encoder-float64").mkdir(parents=True)
    (tmp_path / "fuzz-repro" / "spec-encoder-float64" / "case.json").write_text("{}")
    assert main(["conformance", "fuzz", "--backend", "spec", "--examples", "2"]) == 2
    assert "--repro: 'fuzz-repro/spec-encoder-float64' holds files already" in capsys.readouterr().err
